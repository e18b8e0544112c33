"""Do the chunks of an array tile it exactly? (docs/format.md section 6, rule 15 of section 12)

Boxes ``[start, end)`` tile the array ``[0, shape)`` exactly when the function
``f = sum of the boxes' indicators - the array's indicator`` is zero at every
element. ``f`` is zero if and only if its d-fold finite difference is: a box
contributes ``+1`` or ``-1`` at each of its ``2**d`` corners (the sign is
``(-1) ** (number of end coordinates in the corner)``), the array ``-1`` times
the same, and every point's sum must be zero. The sums are formed one axis at a
time, and entries whose keys are equal are merged (and dropped when they cancel)
after each axis. Two slabs meeting at a face cancel there, so the layouts uckpt
writes (slabs along an axis, grids of boxes, grids of slabs) cost O(n log n) for
n boxes, whatever their number of dimensions; any layout in 2 or 3 effective
dimensions is at most 4 or 8 entries per box.

A layout that does not cancel (many dimensions cut in irregular ways, which
no writer makes) would need up to ``2**d`` entries per box; past a budget the
check falls back to a sweep along the axis that orders the boxes best,
testing only pairs that overlap along it (vectorised, in blocks): exact too,
because the caller has already checked that the boxes lie inside the array and
that their element counts add up to the array's, so overlap-free means tiled.
"""
from __future__ import annotations

from typing import Literal, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

#: pairs tested at once by the fallback sweep (bounds its memory)
_PAIR_BLOCK = 1 << 20


class Defect(NamedTuple):
    """Why boxes do not tile: the element at ``index`` is held by the two boxes ``boxes``
    (indices into the inputs), or by none when ``boxes`` is empty."""

    # the field shadows tuple.index (mypy's complaint); its name is the public API
    index: Tuple[int, ...]  # type: ignore[assignment]
    boxes: Tuple[int, ...]


def find_defect(starts: np.ndarray, ends: np.ndarray,
                shape: Sequence[int]) -> Optional[Defect]:
    """None when the non-empty boxes (``starts``/``ends``: n x d int64, inside the array)
    tile ``[0, shape)`` exactly, else where they fail to."""
    n, d = starts.shape
    full = np.asarray(shape, dtype=np.int64).reshape(1, d)
    # axes on which every box spans the whole array distinguish nothing: leave them out
    axes = [k for k in range(d)
            if not (np.all(starts[:, k] == 0) and np.all(ends[:, k] == full[0, k]))]
    if not axes:
        return Defect((0,) * d, (0, 1)) if n > 1 else None
    if len(axes) == 1 and _slabs_tile(starts[:, axes[0]], ends[:, axes[0]], int(full[0, axes[0]])):
        return None
    found = _corner_sums(starts[:, axes], ends[:, axes], full[0, axes])
    if found is None:  # over budget: decide by the sweep
        pair = _sweep(starts[:, axes], ends[:, axes])
        if pair is None:
            return None
        i, j = pair
        return Defect(tuple(int(v) for v in np.maximum(starts[i], starts[j])), (i, j))
    if found is True:
        return None
    # f at a point is the sum of the corner sums at or below it in every coordinate; at the
    # lexicographically first point whose sum is not zero, that is the sum itself
    point_eff, weight = found
    point = [0] * d
    for k, v in zip(axes, point_eff):
        point[k] = int(v)
    index = tuple(point)
    if weight < 0:  # f(index) = weight: no box holds it (so others hold some elements twice)
        return Defect(index, ())
    inside = np.flatnonzero(np.all((starts <= index) & (np.asarray(index) < ends), axis=1))
    return Defect(index, (int(inside[0]), int(inside[1])))


def _slabs_tile(starts: np.ndarray, ends: np.ndarray, full: int) -> bool:
    """Do slabs ``starts``..``ends`` along one axis (spanning every other) follow one
    another from 0 to ``full`` without gap or overlap? (uckpt's layout: O(n) memory.)"""
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    return bool(s[0] == 0 and e[-1] == full and np.array_equal(s[1:], e[:-1]))


def _corner_sums(starts: np.ndarray, ends: np.ndarray, full: np.ndarray
                 ) -> Union[Literal[True], Tuple[np.ndarray, int], None]:
    """True when every corner sum is zero; else (the lexicographically first point whose sum
    is not, its sum); None when the entries outgrow the budget."""
    n, d = starts.shape
    # a key row: corners fixed so far, then (start, end) of every axis still to do
    keys = np.empty((n + 1, 2 * d), dtype=np.int64)
    keys[:n, 0::2], keys[:n, 1::2] = starts, ends
    keys[n, 0::2], keys[n, 1::2] = 0, full
    weights = np.ones(n + 1, dtype=np.int64)
    weights[n] = -1
    budget = 4 * keys.size + (1 << 16)
    for k in range(d):
        # split each entry at axis k into its start corner (+w) and its end corner (-w)
        lo = np.delete(keys, k + 1, axis=1)
        hi = np.delete(keys, k, axis=1)
        keys = np.concatenate([lo, hi])
        weights = np.concatenate([weights, -weights])
        keys, weights = _merge(keys, weights)
        if keys.size > budget:
            return None
    if len(weights) == 0:
        return True
    return keys[0], int(weights[0])  # _merge leaves them sorted, first column first


def _merge(keys: np.ndarray, weights: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Sum the weights of equal keys; drop the keys whose sum is zero (sorted by key)."""
    if len(weights) == 0:
        return keys, weights
    order = np.lexsort(keys.T[::-1])
    keys, weights = keys[order], weights[order]
    new = np.ones(len(weights), dtype=bool)
    new[1:] = np.any(keys[1:] != keys[:-1], axis=1)
    first = np.flatnonzero(new)
    sums = np.add.reduceat(weights, first)
    keep = sums != 0
    return keys[first[keep]], sums[keep]


def _sweep(starts: np.ndarray, ends: np.ndarray) -> Optional[Tuple[int, int]]:
    """The first pair of overlapping boxes (indices into the inputs), or None."""
    n, d = starts.shape
    best: Optional[Tuple[int, np.ndarray, np.ndarray]] = None
    for k in range(d):  # the axis along which the fewest pairs overlap
        order = np.argsort(starts[:, k], kind="stable")
        s = starts[order, k]
        reach = np.searchsorted(s, ends[order, k], side="left")  # boxes starting before my end
        counts = np.maximum(reach - np.arange(n) - 1, 0)
        total = int(counts.sum())
        if best is None or total < best[0]:
            best = (total, order, counts)
    assert best is not None  # find_defect passes at least one axis
    _, order, counts = best
    ss, ee = starts[order], ends[order]
    i0 = 0
    bounds = np.cumsum(counts)
    while i0 < n:
        # boxes i0..i1-1 contribute at most _PAIR_BLOCK candidate pairs (at least one box)
        base = int(bounds[i0 - 1]) if i0 else 0
        i1 = max(i0 + 1, int(np.searchsorted(bounds, base + _PAIR_BLOCK, side="right")))
        c = counts[i0:i1]
        m = int(c.sum())
        if m:
            first = np.repeat(np.arange(i0, i1), c)
            offsets = np.arange(m) - np.repeat(np.cumsum(c) - c, c)
            second = first + 1 + offsets
            hit = np.all((ss[first] < ee[second]) & (ss[second] < ee[first]), axis=1)
            if hit.any():
                k = int(np.argmax(hit))
                a, b = int(order[first[k]]), int(order[second[k]])
                return (min(a, b), max(a, b))
        i0 = i1
    return None
