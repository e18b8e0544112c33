"""Reading the next arrays of a conversion while the writer writes this one.

A writer reads the layout's arrays in order, one at a time. For sources whose reading
costs CPU (deflated NPZ members: zlib inflates without holding the GIL), :func:`prefetch`
makes each leaf's read start on a worker thread ahead of time, so inflating overlaps with
writing and with the inflating of other members. At most ``budget`` bytes of arrays are
read ahead beyond the one being written (and always at least the next one), so memory
stays bounded (``budget``: ``knobs.convert_ahead_bytes``, 256 MiB, by default); a leaf
read again (a tied array stored twice) reads itself as before.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from .. import knobs
from .interchange import Leaf


class _Ahead:
    def __init__(self, leaves: List[Leaf], threads: int, budget: int) -> None:
        self.leaves, self.budget = leaves, budget
        self.readers: List[Callable[[], np.ndarray]] = [leaf.reader for leaf in leaves]
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="uckpt-read")
        self.futures: Dict[int, Future] = {}
        self.next = 0  # the first index not submitted yet
        self.lock = threading.Lock()

    def _fill(self, current: int) -> None:
        """Submit reads after ``current`` while the bytes in flight fit the budget."""
        with self.lock:
            self.next = max(self.next, current + 1)
            while self.next < len(self.leaves):
                ahead = sum(self.leaves[i].nbytes for i in self.futures if i > current)
                if ahead and ahead + self.leaves[self.next].nbytes > self.budget:
                    break
                i = self.next
                self.futures[i] = self.pool.submit(self.readers[i])
                self.next += 1

    def read(self, i: int) -> np.ndarray:
        with self.lock:
            future = self.futures.pop(i, None)
        if future is None:
            if i >= self.next:  # read out of order: read it here
                arr = self.readers[i]()
                self._fill(i)
                return arr
            return self.readers[i]()  # read a second time (a copy of a tied array)
        self._fill(i)
        return future.result()

    def close(self) -> None:
        for f in self.futures.values():
            f.cancel()
        self.pool.shutdown(wait=True)
        for leaf, reader in zip(self.leaves, self.readers):
            leaf.reader = reader


def prefetch(arrays: List[Tuple[str, Leaf]], threads: int = 2,
             budget: Optional[int] = None) -> Callable[[], None]:
    """Make the leaves of ``arrays`` read ahead (at most ``budget`` bytes, default
    ``knobs.convert_ahead_bytes``); returns the function that stops it and gives the
    leaves their own readers back (call it when the writer is done)."""
    if budget is None:
        budget = knobs.convert_ahead_bytes
    unique: List[Leaf] = []
    seen = set()
    for _, leaf in arrays:
        if id(leaf) not in seen:
            seen.add(id(leaf))
            unique.append(leaf)
    if len(unique) < 2:
        return lambda: None
    ahead = _Ahead(unique, threads, budget)
    for i, leaf in enumerate(unique):
        leaf.reader = (lambda i=i: ahead.read(i))
    ahead._fill(-1)
    return ahead.close
