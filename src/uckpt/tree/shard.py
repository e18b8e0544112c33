"""Leaves that one rank holds only part of, or alone: :class:`Shard` and :class:`PerRank`.

In a state saved with a communicator (``uckpt.save(..., comm=...)``), a plain
array leaf is *replicated*: every rank holds the same value, and the ranks
split the writing between them. A :class:`Shard` is this rank's box of a larger
global array; the boxes of all ranks together must cover the global array
(ranks may hold the same box: it is written once). A :class:`PerRank` subtree
is this rank's own state (e.g. its random generators), saved once per rank.

On load, a :class:`Shard` in the state is the destination of a box of the
saved global array: any slicing works, whatever slicing the checkpoint was
written with.
"""
from __future__ import annotations

from typing import Any, Sequence, Tuple

import numpy as np

from ..adapter import DeviceArray


class Shard:
    """``array`` is the box ``[offsets, offsets + array.shape)`` of a ``global_shape`` array."""

    __slots__ = ("array", "global_shape", "offsets")

    def __init__(self, array: Any, global_shape: Sequence[int], offsets: Sequence[int]) -> None:
        if not isinstance(array, (np.ndarray, DeviceArray)):
            if hasattr(array, "__array_interface__") or hasattr(array, "__dlpack__"):
                array = np.asarray(array)
            else:
                raise TypeError(f"Shard wants a NumPy array (or an adapter's DeviceArray), got "
                                f"{type(array).__module__}.{type(array).__qualname__}")
        self.array = array
        self.global_shape: Tuple[int, ...] = _ints(global_shape, "global_shape")
        self.offsets: Tuple[int, ...] = _ints(offsets, "offsets")
        local = tuple(array.shape)
        if not (len(local) == len(self.global_shape) == len(self.offsets)):
            raise ValueError(f"Shard: array shape {list(local)}, global_shape "
                             f"{list(self.global_shape)} and offsets {list(self.offsets)} must "
                             "have the same number of dimensions")
        for d, (o, n, g) in enumerate(zip(self.offsets, local, self.global_shape)):
            if o + n > g:
                raise ValueError(f"Shard: dimension {d} spans [{o}, {o + n}), beyond the global "
                                 f"size {g}")

    @property
    def box(self) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
        """``(start, shape)`` of this shard in the global index space."""
        return self.offsets, tuple(self.array.shape)

    @property
    def dtype(self):
        return self.array.dtype

    def __repr__(self) -> str:
        return (f"Shard(shape={list(self.array.shape)}, global_shape={list(self.global_shape)}, "
                f"offsets={list(self.offsets)}, dtype={self.array.dtype})")


class PerRank:
    """Wraps state that differs between ranks; each rank's value is saved separately.

    Restored into the same rank of a job of any size that has a saved value for
    it (rank ``r`` gets what rank ``r`` saved). The wrapped object is in
    :attr:`value`.
    """

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"PerRank({self.value!r})"


def _ints(seq: Sequence[int], what: str) -> Tuple[int, ...]:
    try:
        out = tuple(int(x) for x in seq)
    except TypeError:
        raise TypeError(f"Shard: {what} must be a sequence of ints, got {seq!r}") from None
    if any(x < 0 for x in out) or any(isinstance(x, bool) for x in seq):
        raise ValueError(f"Shard: {what} must be non-negative ints, got {list(seq)}")
    return out
