"""Snapshots: copy every array leaf into host staging memory that is reused.

The snapshot is the only part of an asynchronous save that blocks training.
Staging memory comes from a :class:`StagingPool` of at most ``slots`` arenas;
an arena is reused by later saves (a copy into memory already touched runs at
memcpy speed; fresh pages cost a page fault each), so host memory stays bounded
by ``slots`` times the largest state.
"""
from __future__ import annotations

import dataclasses
import mmap
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import knobs
from ..adapter import DeviceArray
from ..format import data_file_name
from .late import defer, split_jobs
from ..runtime.parallel import parallel_map
from .plan import SavePlan, WriteItem, metas
from .plan_columns import plan_save
from ..tree.flatten import FlatState

Allocator = Callable[[int], Tuple[np.ndarray, Any]]


PAGE = mmap.PAGESIZE
#: where an arena is not a data file's image, its arrays start at multiples of this
#: (a cache line; the data file's own layout is the plan's, see uckpt.SaveOptions)
ARENA_ALIGNMENT = 64


def round_up(n: int, to: int = PAGE) -> int:
    return -(-n // to) * to


class Arena:
    """One contiguous, page-aligned staging buffer (``keepalive`` holds e.g. a pinned tensor).

    Page alignment lets the data file be written from it with O_DIRECT.
    """

    def __init__(self, nbytes: int, allocator: Optional[Allocator] = None) -> None:
        nbytes = round_up(max(nbytes, 1))
        if allocator is not None:
            self.buffer, self.keepalive = allocator(nbytes)
        else:
            self.keepalive = mmap.mmap(-1, nbytes)  # anonymous: page-aligned, freed to the OS
            self.buffer = np.frombuffer(self.keepalive, dtype=np.uint8)
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
            fits = [a for a in self._free
                    if a.capacity >= nbytes and a.pinned == (allocator is not None)]
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


def _layout(flat: FlatState, plan: SavePlan) -> Tuple[Dict[str, int], int, bool]:
    """Where each array goes in the arena, its size, and whether the arena is then
    exactly rank 0's data file (each array whole and contiguous at its plan offset)."""
    first: Dict[str, WriteItem] = {}
    owned: Dict[str, int] = {}
    for it in plan.for_rank(0):
        first.setdefault(it.path, it)
        owned[it.path] = owned.get(it.path, 0) + it.length
    is_file_image = plan.world_size == 1 and all(
        path in first and not any(first[path].start) and owned[path] == arr.nbytes
        for path, arr in flat.arrays.items() if arr.nbytes)
    if is_file_image:
        offsets = {path: first[path].offset if path in first else 0 for path in flat.arrays}
        return offsets, dict(plan.file_sizes)[data_file_name(0)], True
    offsets, end = {}, 0
    for path, arr in flat.arrays.items():
        end = round_up(end, ARENA_ALIGNMENT)
        offsets[path] = end
        end += arr.nbytes
    return offsets, end, False


class Snapshot:
    """A flattened state whose arrays live in an arena (or in fresh host memory).

    ``flat`` is the flat state with its arrays replaced by their staged copies;
    ``file_images``: data file name -> the arena laid out byte for byte as that file
    under ``plan`` (empty where the arena is not a data file's image)."""

    def __init__(self, flat: FlatState, plan: Optional[SavePlan] = None,
                 file_images: Optional[Dict[str, np.ndarray]] = None, waits: Sequence[Any] = (),
                 arena: Optional[Arena] = None, pool: Optional[StagingPool] = None) -> None:
        self.flat = flat
        self.plan = plan
        self.file_images: Dict[str, np.ndarray] = dict(file_images or {})
        self._waits = list(waits)
        self._arena = arena
        self._pool = pool

    def ready(self) -> "Snapshot":
        """Wait for asynchronous device copies; then the arrays may be read."""
        for w in self._waits:
            w.synchronize()
        self._waits = []
        return self

    def release(self) -> None:
        if self._pool is not None:
            self._pool.release(self._arena)
            self._pool = self._arena = None


def snapshot(flat: FlatState, pool: Optional[StagingPool], guard=None) -> Snapshot:
    """Copy every array of ``flat`` into staging memory; without a pool, only device arrays.

    With a pool, the arena is laid out as the data file will be (same offsets,
    zero padding), so the writer can send it to storage in one piece.
    """
    if pool is None:
        return _materialize(flat)
    plan = plan_save(metas(flat.arrays))
    offsets, size, is_file_image = _layout(flat, plan)
    allocator = next((a.allocator for a in flat.arrays.values()
                      if isinstance(a, DeviceArray) and a.allocator is not None), None)
    arena = pool.acquire(round_up(size), allocator)
    try:
        buf = arena.buffer
        paths = list(flat.arrays)
        views, waits = _fill(buf, size, [(offsets[p], flat.arrays[p], flat.arrays[p].shape)
                                         for p in paths], guard)
    except BaseException:
        pool.release(arena)
        raise
    file_images = {data_file_name(0): buf[:round_up(size)]} if is_file_image else {}
    return Snapshot(dataclasses.replace(flat, arrays=dict(zip(paths, views))), plan, file_images,
                    waits, arena, pool)


def snapshot_share(flat: FlatState, plan: SavePlan, rank: int, starts: Dict[str, tuple],
                   pool: StagingPool, guard=None) -> Snapshot:
    """Copy only the pieces ``rank`` writes under ``plan`` into an arena laid out as its
    data file (so the writer sends it to storage in one piece). With device arrays,
    falls back to copying every array (and no file image). ``guard`` (a
    :class:`uckpt.saving.late.LateGuard`) defers the copies of the arrays it covers."""
    if any(isinstance(a, DeviceArray) for a in flat.arrays.values()):
        snap = snapshot(flat, pool, guard)
        snap.plan, snap.file_images = None, {}  # every array, not the share's data file
        return snap
    file, size = plan.file_sizes[rank]
    arena = pool.acquire(round_up(size))
    try:
        buf = arena.buffer
        places = []
        for it in plan.for_rank(rank):
            src = flat.arrays[it.path]
            array_start = starts.get(it.path, (0,) * src.ndim)
            box = tuple(slice(s - o, s - o + n) for s, o, n in zip(it.start, array_start, it.shape))
            places.append((it.offset, src[box + (...,)], it.shape))
        _, waits = _fill(buf, size, places, guard)
    except BaseException:
        pool.release(arena)
        raise
    return Snapshot(flat, plan, {file: buf[:round_up(size)]}, waits, arena, pool)


def _fill(buf: np.ndarray, size: int, places, guard=None) -> Tuple[List[np.ndarray], List[Any]]:
    """Copy each ``(offset, source, shape)`` into ``buf`` at ``offset`` (little-endian,
    C order), zero the gaps and the tail up to a page; returns the staged views (in
    the order given) and the device copies to wait for."""
    views: List[np.ndarray] = [None] * len(places)  # type: ignore[list-item]
    end = 0
    for i in sorted(range(len(places)), key=lambda i: places[i][0]):
        off, src, shape = places[i]
        dtype = src.dtype.newbyteorder("<") if src.dtype.byteorder == ">" else src.dtype
        nbytes = dtype.itemsize * int(np.prod(shape))
        if nbytes:
            buf[end:off] = 0  # padding between arrays is zero in the file
            end = off + nbytes
        views[i] = buf[off:off + nbytes].view(dtype).reshape(shape)
    buf[end:round_up(size)] = 0
    return views, _copy_all(list(zip((p[1] for p in places), views)), guard)


def _materialize(flat: FlatState) -> Snapshot:
    """Synchronous saves write straight from live host memory; device arrays are copied."""
    if not any(isinstance(a, DeviceArray) for a in flat.arrays.values()):
        return Snapshot(flat)
    arrays, jobs = dict(flat.arrays), []
    for path, arr in flat.arrays.items():
        if isinstance(arr, DeviceArray):
            arrays[path] = np.empty(arr.shape, arr.dtype)
            jobs.append((arr, arrays[path]))
    waits = _copy_all(jobs)
    return Snapshot(dataclasses.replace(flat, arrays=arrays), waits=waits)


def _copy_all(jobs, guard=None) -> List[Any]:
    """Copy now, or (the host arrays ``guard`` covers) later; the copies to wait for."""
    waits: List[Any] = []
    host, later = split_jobs([(s, d) for s, d in jobs if not isinstance(s, DeviceArray)], guard)
    settle: List[Any] = []  # copies waited for before the snapshot returns
    for src, dst in jobs:
        if isinstance(src, DeviceArray):
            w = src.copy_to(dst)
            if w is not None:
                (settle if src.settle else waits).append(w)
    for w in settle:  # every copy started first, then waited for (DeviceArray.settle)
        w.synchronize()
    big = [j for j in host if j[1].nbytes >= knobs.parallel_copy_bytes]
    small = [j for j in host if j[1].nbytes < knobs.parallel_copy_bytes]
    for src, dst in small:
        np.copyto(dst, src, casting="no" if src.dtype == dst.dtype else "equiv")
    if big:
        parallel_map(lambda j: np.copyto(j[1], j[0], casting="equiv"), big,
                     knobs.copy_threads, "uckpt-snapshot")
    return waits + defer(later, guard)
