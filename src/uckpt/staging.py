"""Snapshots: copy every array leaf into host staging memory that is reused.

The snapshot is the only part of an asynchronous save that blocks training.
Staging memory comes from a :class:`StagingPool` of at most ``slots`` arenas;
an arena is reused by later saves (a copy into memory already touched runs at
memcpy speed; fresh pages cost a page fault each), so host memory stays bounded
by ``slots`` times the largest state.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from . import knobs
from .adapter import DeviceArray
from .parallel import parallel_map
from .tree import Flat

Allocator = Callable[[int], Tuple[np.ndarray, Any]]


class Arena:
    """One contiguous staging buffer (``keepalive`` holds e.g. a pinned tensor)."""

    def __init__(self, nbytes: int, allocator: Optional[Allocator] = None) -> None:
        if allocator is not None:
            self.buffer, self.keepalive = allocator(nbytes)
        else:
            self.buffer, self.keepalive = np.empty(nbytes, dtype=np.uint8), None
        self.pinned = allocator is not None
        self.capacity = nbytes


class StagingPool:
    """At most ``slots`` arenas in use at once; ``acquire`` blocks until one is free.

    Call order: ``acquire`` (blocks while all slots are in use) -> fill ->
    ``release`` (from any thread, once the data is written). ``clear`` drops
    free arenas.
    """

    def __init__(self, slots: int = 1) -> None:
        if slots < 1:
            raise ValueError(f"max_inflight must be at least 1, got {slots}")
        self.slots = slots
        self._free: List[Arena] = []
        self._in_use = 0
        self._cond = threading.Condition()

    def acquire(self, nbytes: int, allocator: Optional[Allocator] = None) -> Arena:
        with self._cond:
            while self._in_use >= self.slots:
                self._cond.wait()
            self._in_use += 1
            fits = [a for a in self._free if a.capacity >= nbytes and a.pinned == (allocator is not None)]
            if fits:
                arena = min(fits, key=lambda a: a.capacity)
                self._free.remove(arena)
                return arena
            if len(self._free) + self._in_use > self.slots:  # keep at most `slots` arenas
                self._free.remove(max(self._free, key=lambda a: a.capacity))
        try:
            return Arena(nbytes, allocator)
        except BaseException:
            self.release(None)
            raise

    def release(self, arena: Optional[Arena]) -> None:
        with self._cond:
            self._in_use -= 1
            if arena is not None:
                self._free.append(arena)
            self._cond.notify()

    def clear(self) -> None:
        with self._cond:
            self._free.clear()

    @property
    def held_bytes(self) -> int:
        with self._cond:
            return sum(a.capacity for a in self._free)


def _layout(flat: Flat) -> Tuple[Dict[str, int], int]:
    offsets, end = {}, 0
    for path, arr in flat.arrays.items():
        end = -(-end // knobs.alignment) * knobs.alignment
        offsets[path] = end
        end += arr.nbytes
    return offsets, end


class Snapshot:
    """A flattened state whose arrays live in an arena (or in fresh host memory)."""

    def __init__(self, flat: Flat, waits: List[Any], arena: Optional[Arena], pool) -> None:
        self.flat = flat
        self._waits = waits
        self._arena = arena
        self._pool = pool

    def ready(self) -> Flat:
        """Wait for asynchronous device copies; then the arrays may be read."""
        for w in self._waits:
            w.synchronize()
        self._waits = []
        return self.flat

    def release(self) -> None:
        if self._pool is not None:
            self._pool.release(self._arena)
            self._pool = self._arena = None


def snapshot(flat: Flat, pool: Optional[StagingPool]) -> Snapshot:
    """Copy every array of ``flat`` into staging memory; without a pool, only device arrays."""
    if pool is None:
        return _materialize(flat)
    offsets, total = _layout(flat)
    allocator = next((a.allocator for a in flat.arrays.values()
                      if isinstance(a, DeviceArray) and a.allocator is not None), None)
    arena = pool.acquire(max(total, 1), allocator)
    try:
        staged: Dict[str, np.ndarray] = {}
        jobs = []
        for path, arr in flat.arrays.items():
            view = arena.buffer[offsets[path]:offsets[path] + arr.nbytes]
            dest = view.view(arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype)
            staged[path] = dest.reshape(arr.shape)
            jobs.append((arr, staged[path]))
        waits = _copy_all(jobs)
    except BaseException:
        pool.release(arena)
        raise
    return Snapshot(Flat(flat.skeleton, staged), waits, arena, pool)


def _materialize(flat: Flat) -> Snapshot:
    """Synchronous saves write straight from live host memory; device arrays are copied."""
    if not any(isinstance(a, DeviceArray) for a in flat.arrays.values()):
        return Snapshot(flat, [], None, None)
    arrays, jobs = dict(flat.arrays), []
    for path, arr in flat.arrays.items():
        if isinstance(arr, DeviceArray):
            arrays[path] = np.empty(arr.shape, arr.dtype)
            jobs.append((arr, arrays[path]))
    waits = _copy_all(jobs)
    return Snapshot(Flat(flat.skeleton, arrays), waits, None, None)


def _copy_all(jobs) -> List[Any]:
    waits: List[Any] = []
    host = [(src, dst) for src, dst in jobs if not isinstance(src, DeviceArray)]
    for src, dst in jobs:
        if isinstance(src, DeviceArray):
            w = src.copy_to(dst)
            if w is not None:
                waits.append(w)
    big = [j for j in host if j[1].nbytes >= knobs.parallel_copy_bytes]
    small = [j for j in host if j[1].nbytes < knobs.parallel_copy_bytes]
    for src, dst in small:
        np.copyto(dst, src, casting="no" if src.dtype == dst.dtype else "equiv")
    if big:
        parallel_map(lambda j: np.copyto(j[1], j[0], casting="equiv"), big,
                     knobs.copy_threads, "uckpt-snapshot")
    return waits
