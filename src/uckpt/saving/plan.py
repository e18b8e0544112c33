"""Who writes which chunk of which array, as plain data.

The planning itself (:func:`uckpt.saving.plan_columns.plan_save` and
``plan_holdings``) is a pure function: the same array layouts give the same plan on
every rank. Arrays larger than twice ``chunk_bytes`` are split along
their first axis; chunks are given to ranks largest first, each to the rank with
the fewest bytes so far (ties to the lowest rank), so replicated state is
written once in total and evenly across ranks. Within a rank's data file,
chunks follow the arrays' order; each array starts at a multiple of
``alignment`` (both from :class:`uckpt.SaveOptions`) and its chunks follow each other
without gaps, so a
single-rank file is exactly the arrays' bytes laid out like a staging arena
(see :mod:`uckpt.saving.staging`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Sequence, Tuple

from .. import dtypes
from ..format import data_file_name
from ..options import DEFAULT_ALIGNMENT

Box = Tuple[Tuple[int, ...], Tuple[int, ...]]  # (start, shape)


@dataclass(frozen=True)
class ArrayMeta:
    dtype: str
    shape: Tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return dtypes.nbytes(self.dtype, self.shape)


@dataclass(frozen=True)
class WriteItem:
    """One chunk: the box ``start``/``shape`` of array ``path``, at ``offset`` in ``file``."""

    path: str
    start: Tuple[int, ...]
    shape: Tuple[int, ...]
    rank: int
    file: str
    offset: int
    length: int


@dataclass(frozen=True)
class SavePlan:
    world_size: int
    items: Tuple[WriteItem, ...]
    file_sizes: Tuple[Tuple[str, int], ...]  # (file, size) per writing rank

    def for_rank(self, rank: int) -> List[WriteItem]:
        return [it for it in self.items if it.rank == rank]

    def bytes_per_rank(self) -> Dict[int, int]:
        out = {r: 0 for r in range(self.world_size)}
        for it in self.items:
            out[it.rank] += it.length
        return out


def split_box(dtype: str, start: Sequence[int], shape: Sequence[int],
              chunk_bytes: int) -> List[Box]:
    """Boxes covering the box ``start``/``shape``: itself, or when it holds at least twice
    ``chunk_bytes``, slabs of about ``chunk_bytes`` along its first axis longer than 1."""
    start, shape = tuple(start), tuple(shape)
    nbytes = dtypes.nbytes(dtype, shape)
    if nbytes == 0:
        return []
    axis = next((d for d, n in enumerate(shape) if n >= 2), None)
    if axis is None or nbytes < 2 * chunk_bytes:
        return [(start, shape)]
    slab_bytes = nbytes // shape[axis]
    rows = max(1, chunk_bytes // max(1, slab_bytes))
    n = -(-shape[axis] // rows)
    rows = -(-shape[axis] // n)  # even out the slabs
    out = []
    for r in range(0, shape[axis], rows):
        s = start[:axis] + (start[axis] + r,) + start[axis + 1:]
        sh = shape[:axis] + (min(rows, shape[axis] - r),) + shape[axis + 1:]
        out.append((s, sh))
    return out


#: who holds which box of an array: ``[((start, shape), (rank, ...)), ...]``
BoxHolders = Sequence[Tuple[Box, Tuple[int, ...]]]


def layout(chunks: Sequence[Tuple[str, Tuple[int, ...], Tuple[int, ...], int, int]],
           world_size: int, alignment: int = DEFAULT_ALIGNMENT) -> SavePlan:
    """Place chunks ``(path, start, shape, rank, length)`` in their ranks' data files, in
    the given order: an array's chunks follow each other, each array starts at a multiple
    of ``alignment``; each file ends with its last chunk."""
    items: List[WriteItem] = []
    ends = [0] * world_size
    last_path: List[object] = [None] * world_size
    names = [data_file_name(r) for r in range(world_size)]
    for p, start, shape, rank, length in chunks:
        offset = ends[rank]
        if last_path[rank] != p:  # an array's chunks follow each other; arrays start aligned
            offset = -(-offset // alignment) * alignment
            last_path[rank] = p
        items.append(WriteItem(p, start, shape, rank, names[rank], offset, length))
        ends[rank] = offset + length
    sizes = tuple((names[r], ends[r]) for r in range(world_size))
    return SavePlan(world_size, tuple(items), sizes)


def metas(arrays: Mapping[str, Any]) -> Dict[str, ArrayMeta]:
    """Layouts of arrays (ndarrays or DeviceArrays), for :func:`plan_save`."""
    return {p: ArrayMeta(dtypes.name_of(a.dtype), tuple(a.shape)) for p, a in arrays.items()}
