"""Who writes which chunk, planned in NumPy columns (issue 27: rank 0 plans a first save
of thousands of ranks).

:func:`plan_columns` splits the held boxes into chunks and keeps them as columns (paths,
starts, shapes, and NumPy arrays of owners, offsets and lengths): the order chunks are given
out in is one ``lexsort``, a chunk held by one rank is its own (only chunks held by several
ranks are given out one by one), and the offsets in the data files are cumulative sums.
:class:`Columns` then makes the :class:`~uckpt.saving.plan.SavePlan`, or each rank's
share of it without a :class:`~uckpt.saving.plan.WriteItem` per chunk
(:mod:`uckpt.saving.root_plan`). The plans are those of :func:`uckpt.saving.plan.layout`
applied to the rules in :func:`plan_holdings`'s docstring, item for item.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Any, List, Mapping, Sequence, Tuple, Union

import numpy as np

from .. import dtypes
from ..format import data_file_name
from ..options import DEFAULT_ALIGNMENT, DEFAULT_CHUNK_BYTES
from .plan import ArrayMeta, Box, BoxHolders, SavePlan, WriteItem, split_box


@dataclass(frozen=True)
class Columns:
    """A plan as columns, one row per chunk, in the arrays' order."""

    world_size: int
    paths: Sequence[str]
    starts: Sequence[Tuple[int, ...]]
    shapes: Sequence[Tuple[int, ...]]
    owner: np.ndarray  # int64: the rank writing the chunk
    offset: np.ndarray  # int64: where in its rank's data file
    length: np.ndarray  # int64: bytes
    sizes: Tuple[int, ...]  # each rank's data file's size

    def plan(self) -> SavePlan:
        names = [data_file_name(r) for r in range(self.world_size)]
        owner = self.owner.tolist()
        items = tuple(map(WriteItem, self.paths, self.starts, self.shapes, owner,
                          [names[r] for r in owner], self.offset.tolist(),
                          self.length.tolist()))
        return SavePlan(self.world_size, items, tuple(zip(names, self.sizes)))

    def shares(self) -> List[List[List[Any]]]:
        """Each rank's chunks, in the plan's order, as five columns: paths, starts, shapes,
        offsets and lengths (no object per chunk beyond what the columns hold)."""
        by_rank = np.argsort(self.owner, kind="stable")
        order = by_rank.tolist()
        columns = ([self.paths[i] for i in order], [self.starts[i] for i in order],
                   [self.shapes[i] for i in order], self.offset[by_rank].tolist(),
                   self.length[by_rank].tolist())
        ends = np.cumsum(np.bincount(self.owner, minlength=self.world_size)).tolist()
        return [[column[a:b] for column in columns] for a, b in zip([0] + ends[:-1], ends)]


@dataclass(frozen=True)
class Held:
    """An array's distinct boxes, sorted by start then shape, and the ranks holding each
    (ascending): :data:`~uckpt.saving.plan.BoxHolders` as columns."""

    starts: np.ndarray  # int64, (boxes, ndim)
    shapes: np.ndarray  # int64, (boxes, ndim)
    ranks: Sequence[Tuple[int, ...]]

    def __len__(self) -> int:
        return len(self.ranks)


def held_of(boxes: BoxHolders, ndim: int) -> Held:
    """:class:`Held` from ``[((start, shape), ranks), ...]``."""
    k = len(boxes)
    return Held(np.array([b[0][0] for b in boxes], dtype=np.int64).reshape(k, ndim),
                np.array([b[0][1] for b in boxes], dtype=np.int64).reshape(k, ndim),
                [tuple(b[1]) for b in boxes])


def plan_holdings(arrays: Mapping[str, ArrayMeta], holders: Mapping[str, BoxHolders],
                  world_size: int, chunk_bytes: int,
                  alignment: int = DEFAULT_ALIGNMENT) -> SavePlan:
    """Split each held box into chunks of about ``chunk_bytes`` and give each chunk to one
    of the ranks holding it: largest chunks first, each to the holder with the fewest
    bytes so far (ties to the lowest rank). Every held byte is written exactly once.
    Chunks are placed in their writers' files as :func:`uckpt.saving.plan.layout` does."""
    return plan_columns(arrays, holders, world_size, chunk_bytes, alignment).plan()


def plan_columns(arrays: Mapping[str, ArrayMeta],
                 holders: Mapping[str, Union[BoxHolders, Held]],
                 world_size: int, chunk_bytes: int,
                 alignment: int = DEFAULT_ALIGNMENT) -> Columns:
    """:func:`plan_holdings`'s plan, as :class:`Columns`."""
    paths: List[str] = []
    starts: List[Tuple[int, ...]] = []
    shapes: List[Tuple[int, ...]] = []
    holding: List[Tuple[int, ...]] = []
    lengths: List[int] = []
    index: List[int] = []  # each chunk's array, by position in ``arrays``
    spans: List[Tuple[int, int]] = []  # [first, end): the chunks of an array of several
    for a, (p, m) in enumerate(arrays.items()):
        size = dtypes.itemsize(m.dtype)
        first = len(paths)
        held = holders[p]
        if len(held) == 1:  # one box (every array of a one-rank save): plain ints are faster
            box_list: Any = _one_box(held)
        else:
            if not isinstance(held, Held):
                held = held_of(held, len(m.shape))
            nbytes_of = size * np.prod(held.shapes, axis=1)
            if np.all((nbytes_of > 0) & (nbytes_of < 2 * chunk_bytes)):  # each box one chunk
                k = len(held.ranks)
                paths.extend([p] * k)
                starts.extend(map(tuple, held.starts.tolist()))
                shapes.extend(map(tuple, held.shapes.tolist()))
                holding.extend(held.ranks)
                lengths.extend(nbytes_of.tolist())
                index.extend([a] * k)
                spans.append((first, len(paths)))
                continue
            box_list = zip(held.starts.tolist(), held.shapes.tolist(), held.ranks)
        for bstart, bshape, ranks in box_list:
            nbytes = size * math.prod(bshape)
            if nbytes and nbytes < 2 * chunk_bytes:  # most boxes: one chunk (split_box)
                boxes: Sequence[Box] = ((tuple(bstart), tuple(bshape)),)
            elif nbytes:
                boxes = split_box(m.dtype, bstart, bshape, chunk_bytes)
            else:
                continue
            for start, shape in boxes:
                paths.append(p)
                starts.append(start)
                shapes.append(shape)
                holding.append(tuple(ranks))
                lengths.append(size * math.prod(shape) if len(boxes) > 1 else nbytes)
                index.append(a)
        if len(paths) - first > 1:
            spans.append((first, len(paths)))
    n = len(paths)
    length = np.array(lengths, dtype=np.int64).reshape(n)
    # the order chunks are given out in: largest first, then array, then start (an array's
    # chunks come by start unless a split box's slabs interleave with another box's)
    pos = np.arange(n, dtype=np.int64)
    for first, end in spans:
        if any(starts[i] > starts[i + 1] for i in range(first, end - 1)):
            by_start = sorted(range(first, end), key=starts.__getitem__)
            pos[by_start] = np.arange(first, end, dtype=np.int64)
    ranked = np.lexsort((pos, -length))
    owner = _owners(holding, length, ranked, world_size)
    return _place(paths, starts, shapes, np.array(index, dtype=np.int64).reshape(n), owner,
                  length, world_size, alignment)


def _one_box(held: Union[BoxHolders, Held]) -> List[Tuple[Any, Any, Tuple[int, ...]]]:
    """The one box of ``held`` as ``[(start, shape, ranks)]``."""
    if isinstance(held, Held):
        return [(held.starts[0].tolist(), held.shapes[0].tolist(), tuple(held.ranks[0]))]
    (start, shape), ranks = held[0]
    return [(start, shape, tuple(ranks))]


def _owners(holding: Sequence[Tuple[int, ...]], length: np.ndarray, ranked: np.ndarray,
            world_size: int) -> np.ndarray:
    """Each chunk's writer: its only holder, or, in the order ``ranked``, the holder with
    the fewest bytes so far (ties to the lowest rank)."""
    n = len(holding)
    several = np.fromiter((len(h) > 1 for h in holding), dtype=bool, count=n)
    owner = np.fromiter((h[0] if h else 0 for h in holding), dtype=np.int64, count=n)
    if not several.any():
        return owner
    everyone = tuple(range(world_size))
    load = np.zeros(world_size, dtype=np.int64)
    lightest = [(0, r) for r in everyone]  # (load, rank), some stale: loads only grow
    done = 0  # chunks of ``ranked`` whose single holder's load is counted
    for k in np.flatnonzero(several[ranked]).tolist():
        if k > done:  # the single-holder chunks given out before this one
            run = ranked[done:k]
            np.add.at(load, owner[run], length[run])
        done = k + 1
        i = int(ranked[k])
        ranks = holding[i]
        if ranks == everyone:  # replicated: the least loaded rank of all, from a heap
            while lightest[0][0] != load[lightest[0][1]]:
                heapq.heapreplace(lightest, (int(load[lightest[0][1]]), lightest[0][1]))
            rank = lightest[0][1]
        else:
            rank = min(ranks, key=lambda r: (load[r], r))
        owner[i] = rank
        load[rank] += length[i]
        if ranks == everyone:
            heapq.heapreplace(lightest, (int(load[rank]), rank))
    return owner


def _place(paths: Sequence[str], starts: Sequence[Tuple[int, ...]],
           shapes: Sequence[Tuple[int, ...]], index: np.ndarray, owner: np.ndarray,
           length: np.ndarray, world_size: int, alignment: int) -> Columns:
    """:func:`~uckpt.saving.plan.layout` in columns: chunks of array ``index[i]``, in array
    order (an array's chunks next to each other), written by ``owner[i]``. A run of one
    array's chunks in a file starts at the sum of the earlier runs' lengths, each rounded up
    to ``alignment``."""
    n = len(paths)
    sizes = np.zeros(world_size, dtype=np.int64)
    offset = np.zeros(n, dtype=np.int64)
    if n:
        by_file = np.argsort(owner, kind="stable")
        f, a, ln = owner[by_file], index[by_file], length[by_file]
        new_run = np.ones(n, dtype=bool)
        new_run[1:] = (f[1:] != f[:-1]) | (a[1:] != a[:-1])
        run_first = np.flatnonzero(new_run)
        run_len = np.add.reduceat(ln, run_first)
        padded = (run_len + alignment - 1) // alignment * alignment
        ends = np.cumsum(padded)
        new_file = np.ones(len(run_first), dtype=bool)
        new_file[1:] = f[run_first[1:]] != f[run_first[:-1]]
        file_base = np.maximum.accumulate(np.where(new_file, ends - padded, 0))
        run_start = ends - padded - file_base
        within = np.cumsum(ln) - ln
        run_of = np.cumsum(new_run) - 1
        offset[by_file] = run_start[run_of] + within - within[run_first][run_of]
        last = np.flatnonzero(np.append(new_file[1:], True))
        sizes[f[run_first[last]]] = run_start[last] + run_len[last]
    return Columns(world_size, paths, starts, shapes, owner, offset, length,
                   tuple(sizes.tolist()))


def plan_save(arrays: Mapping[str, ArrayMeta], world_size: int = 1,
              chunk_bytes: int = DEFAULT_CHUNK_BYTES,
              alignment: int = DEFAULT_ALIGNMENT) -> SavePlan:
    """The plan for replicated arrays: every rank holds all of each array."""
    everyone = tuple(range(world_size))
    holders = {p: [(((0,) * len(m.shape), m.shape), everyone)] for p, m in arrays.items()}
    return plan_holdings(arrays, holders, world_size, chunk_bytes, alignment)
