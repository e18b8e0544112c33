"""``uckpt.consolidate``: a checkpoint rewritten as a single-process one, a piece at a time.

The target's plan is made from the source manifest's dtypes and shapes alone; each piece
of it (an array, or a slab of ``SaveOptions.chunk_bytes`` of a large one) is read from the source
only when it is written (:func:`uckpt.saving.writer.write_read_chunks`): just the source chunks
that hold it, every one checksummed, a compressed one decoded (one at a time). Peak memory:
the pieces being encoded ahead of the writing (:func:`uckpt.saving.writer.write_encoded`) plus one
source chunk (at most the largest array), whatever the number or total size of the arrays;
:class:`~uckpt.loading.reader.CheckpointReader` refuses, before allocating, a chunk larger than its
data file can hold.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Tuple, Union

import numpy as np

from .. import dtypes
from .commit import write_checkpoint
from ..options import SaveOptions
from .plan import WriteItem
from ..loading.reader import CheckpointReader
from ..tree.flatten import FlatState
from ..tree.shard import Shard


@dataclass(frozen=True)
class _Declared:
    """An array of the source as its manifest declares it (what the planner needs)."""

    dtype: np.dtype
    shape: Tuple[int, ...]
    nbytes: int


class _Pieces:
    """The raw bytes of a target piece, read from the source when it is asked for."""

    def __init__(self, reader: CheckpointReader) -> None:
        self.reader = reader
        self.lock = threading.Lock()

    def __call__(self, item: WriteItem) -> np.ndarray:
        entry = self.reader.manifest.arrays[item.path]
        out = np.empty(item.shape, dtype=dtypes.to_numpy(entry.dtype))
        with self.lock:  # one source chunk decoded at a time
            self.reader.read_arrays({item.path: Shard(out, entry.shape, item.start)})
        return out.reshape(-1).view(np.uint8)


def consolidate(reader: CheckpointReader, dst, *, overwrite: bool, storage_options,
                options: SaveOptions) -> Union[Path, str]:
    """Write the checkpoint ``reader`` reads as a single-process one at ``dst``, laid out
    as ``options`` say."""
    m = reader.manifest
    declared = {p: _Declared(dtypes.to_numpy(e.dtype), tuple(e.shape), e.nbytes)
                for p, e in m.arrays.items()}
    return write_checkpoint(dst, FlatState(m.tree, declared), step=m.step, metadata=m.metadata,
                            overwrite=overwrite, storage_options=storage_options,
                            options=options, read_chunk=_Pieces(reader))
