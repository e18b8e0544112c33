"""Memory that the threads encoding one data file's chunks reuse (:mod:`uckpt.saving.writer`).

Fresh memory costs a page fault per 4 KiB page the first time it is written: for
byte planes and frames made anew for every chunk, that was about a third of the CPU
time of a compressed save. An :class:`EncodeMemory` lives for one data file: each
encoding thread groups bytes into a scratch buffer of its own, and frames are written
into buffers taken from a pool and given back once the sink has copied them, so a
file's pieces go through a few buffers, not through new memory each.
"""
from __future__ import annotations

import threading
from typing import Dict, List, Optional

import numpy as np

#: buffers smaller than this are plain new arrays (cheap to make, not worth pooling)
POOLED_BYTES = 64 << 10


def _capacity(nbytes: int) -> int:
    """The size class of a buffer for ``nbytes``: the next power of two."""
    return 1 << max(0, nbytes - 1).bit_length()


class EncodeMemory:
    """Per-thread scratch buffers and a pool of frame buffers, for one data file.

    Thread-safe: encoding threads call :meth:`scratch` and :meth:`take`; the writing
    thread calls :meth:`give` with a buffer (or a view of one) the sink is done with.
    What it holds is bounded by the buffers in use at once (the encoding window) and
    released with it."""

    def __init__(self, pool: bool = True, split_bytes: Optional[int] = None) -> None:
        """``pool``: lend frame buffers (only where the sink copies each piece before it
        takes the next); ``split_bytes``: chunks at least this large are compressed on
        Zstandard's own threads too (None: none is)."""
        self.pool = pool
        self.split_bytes = split_bytes
        self._local = threading.local()
        self._lock = threading.Lock()
        self._free: Dict[int, List[np.ndarray]] = {}
        self._lent: Dict[int, np.ndarray] = {}

    def scratch(self, nbytes: int) -> np.ndarray:
        """A flat uint8 buffer of at least ``nbytes`` of the calling thread's own."""
        buf = getattr(self._local, "scratch", None)
        if buf is None or buf.nbytes < nbytes:
            buf = self._local.scratch = np.empty(_capacity(nbytes), dtype=np.uint8)
        return buf

    def take(self, nbytes: int) -> Optional[np.ndarray]:
        """A flat uint8 buffer of exactly ``nbytes`` (a view of a pooled one), or None
        where this memory does not pool or the buffer would be small (make a new one)."""
        if not self.pool or nbytes < POOLED_BYTES:
            return None
        size = _capacity(nbytes)
        with self._lock:
            free = self._free.get(size)
            buf = free.pop() if free else None
            if buf is None:
                buf = np.empty(size, dtype=np.uint8)
            self._lent[id(buf)] = buf
        return buf[:nbytes]

    def give(self, view) -> None:
        """Give back what :meth:`take` returned (or a view of it); anything else is
        ignored, so every piece's stored bytes may be handed here."""
        base = getattr(view, "base", None)
        with self._lock:
            buf = self._lent.pop(id(base), None) if base is not None else None
            if buf is not None:
                self._free.setdefault(buf.nbytes, []).append(buf)
