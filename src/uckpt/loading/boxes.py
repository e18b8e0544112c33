"""Boxes of an array: where a chunk meets a destination (a whole array or a Shard's box)."""
from __future__ import annotations

import numpy as np

from ..format import Chunk


def chunk_region(chunk: Chunk, target_start: tuple, dest: np.ndarray):
    """(start, shape) of where ``chunk`` meets ``dest`` (a box of the array starting at
    ``target_start``), in the array's coordinates, and ``dest``'s region there (a view)."""
    start, shape = intersection(chunk.start, chunk.shape, target_start, dest.shape)
    region = dest[tuple(slice(s - o, s - o + n) for s, o, n in zip(start, target_start, shape))
                  + (...,)]
    return start, shape, region


def intersection(start_a, shape_a, start_b, shape_b):
    """The box where two boxes overlap, ``(start, shape)``, or None when they do not."""
    lo = [max(a, b) for a, b in zip(start_a, start_b)]
    hi = [min(a + m, b + n) for a, m, b, n in zip(start_a, shape_a, start_b, shape_b)]
    if any(h <= low for low, h in zip(lo, hi)):
        return None
    return tuple(lo), tuple(h - low for low, h in zip(lo, hi))
