"""Late snapshots: copy an array into staging memory as late as it may be, not at ``save``.

An asynchronous save normally copies every array before ``save`` returns (the stall).
Some arrays cannot change for a while after ``save``: a model's parameters and its
optimizer's state change only in the next optimizer step, not during the forward and
backward passes before it. A *late-copy guard* (:class:`LateGuard`, e.g.
``uckpt.torch.LateSnapshot``, which hooks ``optimizer.step``) names such arrays
(``covered_ranges``) and promises to call :meth:`DeferredCopy.finish` before any of them can
change (``arm``). Their copies are then made by the save's background writer (a
low-priority thread) as soon as it takes up the save, while training goes on, and
whatever is not copied yet when the guard fires is copied right there, by the
training thread: each array is copied once, before it changes. The write to storage
(the offload) follows the last copy, overlapping the steps after it. Staging memory
is the same bounded arena as for any async save.

Call order: the snapshot (training thread) copies the uncovered arrays and builds a
:class:`DeferredCopy` of the covered ones, hands it to ``guard.arm`` and returns;
the background writer calls ``synchronize()`` before it reads the staged arrays and
the guard calls ``finish(by_guard=True)`` before the arrays can change (training
thread), whichever comes first: each piece is copied by exactly one of them, and both
return once every piece is copied.
"""
from __future__ import annotations

import bisect
import logging
import threading
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

log = logging.getLogger("uckpt.saving.late")

#: pieces of at most this many bytes, so the training thread can take over the
#: remaining copies from the writer at a fine grain
PIECE_BYTES = 8 << 20


class LateGuard:
    """What a late snapshot needs from a framework integration.

    ``covered_ranges()``: the ``(start, end)`` byte addresses of host memory that
    cannot change until the guard fires (asked once per snapshot, so it reflects
    the memory of the moment). ``arm(deferred)``: make sure ``deferred.finish()``
    is called before any of it changes (typically: in a hook that runs before the
    optimizer step).
    """

    def covered_ranges(self) -> Sequence[Tuple[int, int]]:
        raise NotImplementedError

    def arm(self, deferred: "DeferredCopy") -> None:
        raise NotImplementedError


class Ranges:
    """A set of byte ranges of host memory ``[start, end)``; ``holds(array)`` says whether
    an array lies entirely inside one of them."""

    def __init__(self, ranges: Sequence[Tuple[int, int]]) -> None:
        merged: List[List[int]] = []
        for start, end in sorted(r for r in ranges if r[1] > r[0]):
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        self._starts = [m[0] for m in merged]
        self._ends = [m[1] for m in merged]

    def holds(self, array: np.ndarray) -> bool:
        if not isinstance(array, np.ndarray) or not array.nbytes:
            return False
        lo, hi = _byte_bounds(array)
        i = bisect.bisect_right(self._starts, lo) - 1
        return i >= 0 and hi <= self._ends[i]


try:  # NumPy 2
    from numpy.lib.array_utils import byte_bounds as _byte_bounds
except ImportError:  # NumPy 1
    _byte_bounds = np.byte_bounds  # type: ignore[attr-defined]  # NumPy 1 only


def _pieces(src: np.ndarray, dst: np.ndarray) -> List[Tuple[np.ndarray, np.ndarray]]:
    """``(src, dst)`` split into pieces of about PIECE_BYTES (contiguous arrays only)."""
    if not (src.flags.c_contiguous and dst.flags.c_contiguous) or src.nbytes <= PIECE_BYTES \
            or src.dtype != dst.dtype:
        return [(src, dst)]
    s, d = src.reshape(-1).view(np.uint8), dst.reshape(-1).view(np.uint8)
    return [(s[i:i + PIECE_BYTES], d[i:i + PIECE_BYTES]) for i in range(0, s.size, PIECE_BYTES)]


class DeferredCopy:
    """Copies ``(source, staged)`` pairs piece by piece, on whichever threads call
    :meth:`finish`."""

    def __init__(self, jobs: Sequence[Tuple[np.ndarray, np.ndarray]]) -> None:
        self._pieces = [p for src, dst in jobs for p in _pieces(src, dst)]
        self.nbytes = sum(dst.nbytes for _, dst in self._pieces)
        self._next = 0
        self._left = len(self._pieces)
        self._error: Optional[BaseException] = None
        self._cond = threading.Condition()
        self.copied_by_guard = 0  # bytes the guard's thread (training) had to copy

    def _work(self, by_guard: bool) -> None:
        while True:
            with self._cond:
                if self._next >= len(self._pieces):
                    return
                src, dst = self._pieces[self._next]
                self._next += 1
            error = None
            try:
                np.copyto(dst, src, casting="equiv")
            except BaseException as e:  # noqa: BLE001 - raised by finish()
                error = e
            with self._cond:
                if error is not None and self._error is None:
                    self._error = error
                if by_guard:
                    self.copied_by_guard += dst.nbytes
                self._left -= 1
                if not self._left:
                    self._cond.notify_all()

    @property
    def done(self) -> bool:
        with self._cond:
            return not self._left

    def finish(self, by_guard: bool = False) -> None:
        """Copy what is left (here, now), wait for pieces in progress; raise a copy's error."""
        self._work(by_guard)
        with self._cond:
            while self._left:
                self._cond.wait()
            if self._error is not None:
                raise self._error

    synchronize = finish  # the Snapshot waits on it like on a device copy


def split_jobs(jobs, guard: Optional[LateGuard]):
    """``(now, later)``: the copy jobs to do at once, and those ``guard`` covers."""
    if guard is None:
        return list(jobs), []
    covered = Ranges(guard.covered_ranges())
    now: List[Tuple[Any, Any]] = []
    later: List[Tuple[Any, Any]] = []
    for src, dst in jobs:
        (later if covered.holds(src) else now).append((src, dst))
    return now, later


def defer(later, guard: LateGuard) -> List[Any]:
    """Start the deferred copies and arm the guard; the waits the snapshot keeps."""
    if not later:
        return []
    deferred = DeferredCopy(later)
    guard.arm(deferred)
    log.debug("late snapshot: %d bytes deferred to the guard", deferred.nbytes)
    return [deferred]
