"""Read only the parts of a format-1.0 manifest that cover what a rank loads.

:func:`attach_covering` takes a root whose parts are pending and the boxes a rank
loads, and attaches parts one at a time until the rows read tile every wanted box
(docs/format.md section 7): the loading rank's own part first (extension
``part-ranks``, section 13.1), then the parts of the ranks whose share is nearest to
its own. Arrays that no pending part holds (replicated arrays, whose rows uckpt
writes into the root) need no part at all. Rows of other parts cannot intersect a
box already tiled in a valid checkpoint, so they are not read; what is not read is
not checked (items 8 and 15 of section 12 for those arrays).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .model import Manifest, PartEntry, make_entry

#: a box ``(start, shape)`` of an array, or None for the whole array
Box = Optional[Tuple[Tuple[int, ...], Tuple[int, ...]]]


def attach_covering(m: Manifest, wanted: Mapping[str, Box],
                    read_part: Callable[[PartEntry], bytes], rank: int = 0,
                    world: int = 1) -> List[int]:
    """Attach the pending parts of ``m`` needed to read the boxes ``wanted`` (array path
    -> box) as rank ``rank`` of ``world`` ranks, and set those arrays' chunks in
    ``m.arrays`` to the rows read; return the indices of the parts attached."""
    state = m._pending
    if state is None:
        return []
    index = {p: i for i, p in enumerate(state.meta.paths)}
    boxes = {index[p]: _box(b, state.meta.shapes[index[p]]) for p, b in wanted.items()}
    holds = _holds(m, len(state.meta.paths))  # part index -> bool per array
    need = {i for i in boxes if any(holds[k][i] for k in m.parts_pending)}
    read: List[int] = []
    for k in _order(m, rank, world):
        if not need or state is None:
            break
        if k not in m.parts_pending or not any(holds[k][i] for i in need):
            continue
        m.attach_part(k, read_part(m.parts[k]))
        read.append(k)
        state = m._pending  # None once every part is attached (and every array checked)
        if state is not None:
            need = {i for i in need if not _covered(m, state, i, boxes[i], holds)}
    if state is not None:
        for i in boxes:
            path = state.meta.paths[i]
            old = m.arrays[path]
            m.arrays[path] = make_entry(path, old.dtype, old.shape, state.rows_so_far(i))
    return read


def _box(box: Box, shape: Tuple[int, ...]) -> Tuple[np.ndarray, np.ndarray]:
    """``box`` as int64 start and end (the whole array for None)."""
    if box is None:
        return np.zeros(len(shape), np.int64), np.asarray(shape, np.int64).reshape(len(shape))
    start = np.asarray(box[0], np.int64).reshape(len(shape))
    return start, start + np.asarray(box[1], np.int64).reshape(len(shape))


def part_mask(entry: PartEntry, narrays: int) -> np.ndarray:
    """Which of the ``narrays`` arrays the runs of part ``entry`` hold (a bool mask)."""
    mask = np.zeros(narrays, bool)
    for first, count in entry.arrays:
        mask[first:first + count] = True
    return mask


def _holds(m: Manifest, narrays: int) -> Dict[int, np.ndarray]:
    """For each pending part, which arrays its runs hold."""
    return {k: part_mask(m.parts[k], narrays) for k in m.parts_pending}


def _order(m: Manifest, rank: int, world: int) -> Sequence[int]:
    """The pending parts in the order to try: the part of ``rank`` first, then those of
    the ranks whose share of a dimension cut evenly among the writer's ranks is nearest
    to ``rank``'s among ``world`` (parts in index order without ``part-ranks``)."""
    ranks = m.part_ranks
    if ranks is None:
        return list(m.parts_pending)
    here = (rank + 0.5) / world

    def key(k: int) -> Tuple[bool, float]:
        return ranks[k] != rank or world != m.world_size, \
            abs((ranks[k] + 0.5) / m.world_size - here)
    return sorted(m.parts_pending, key=key)


def _covered(m: Manifest, state: Any, i: int, box: Tuple[np.ndarray, np.ndarray],
             holds: Mapping[int, np.ndarray]) -> bool:
    """Do the rows read of array ``i`` tile ``box`` exactly? Raises ManifestError if they
    overlap in it, or if every part holding the array is read and they leave a gap."""
    rows = state.rows_so_far(i)
    shape = state.meta.shapes[i]
    path = state.meta.paths[i]
    complete = not any(holds[k][i] for k in m.parts_pending)
    lo, hi = box
    if complete:  # every row of the array is here: check its whole tiling
        lo, hi = np.zeros(len(shape), np.int64), np.asarray(shape, np.int64).reshape(len(shape))
    starts, ends = rows.corners(len(shape))
    s, e = np.maximum(starts, lo), np.minimum(ends, hi)
    inside = np.all(e > s, axis=1)
    s, e = s[inside] - lo, e[inside] - lo
    extent = tuple(int(v) for v in hi - lo)
    have = int(np.prod(e - s, axis=1, dtype=np.int64).sum()) if len(s) else 0
    if have < math.prod(extent) and not complete:
        return False  # (a gap: further parts hold the rest)
    state.p.tiling(s, e, extent,
                   f"chunks: array {i} ({path!r:.80})" +
                   ("" if complete else f", the box at {lo.tolist()} of shape {extent}"))
    return True
