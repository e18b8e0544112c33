"""Reading a chunk into a destination of another dtype (a cast the load's policy allowed,
:mod:`uckpt.loading.cast`), in bounded memory.

A raw chunk that fills a contiguous run of its destination is read a block at a time
(``knobs.read_block_bytes``) and each block converted into its place: memory is one block
per reading thread. Any other chunk (compressed, or cut by the destination's box) is read
whole, CRC checked and decoded as :meth:`CheckpointReader.read_raw` does, then converted
into its region: memory is one chunk per reading thread. Never a whole copy of the array
in its stored dtype. NumPy's assignment converts (ml_dtypes for bfloat16 and float8).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Tuple

import numpy as np

from .. import dtypes, knobs
from ..format import ArrayEntry, Chunk
from .boxes import chunk_region

if TYPE_CHECKING:
    from .reader import CheckpointReader


def read_converted(reader: "CheckpointReader", entry: ArrayEntry, chunk: Chunk,
                   dest: np.ndarray, target_start: Tuple[int, ...]) -> None:
    """Read ``chunk`` of ``entry`` into its part of ``dest`` (whose box starts at
    ``target_start`` in the array), converting from the stored dtype to ``dest``'s."""
    start, shape, region = chunk_region(chunk, target_start, dest)
    stored = dtypes.to_numpy(entry.dtype)
    if not chunk.compressed and tuple(shape) == tuple(chunk.shape) and \
            region.flags.c_contiguous:
        flat = region.reshape(-1)
        step = max(stored.itemsize, knobs.read_block_bytes // stored.itemsize * stored.itemsize)
        buf = np.empty(min(step, chunk.length), dtype=np.uint8)
        at = 0
        for block in reader._blocks(entry, chunk, lambda done, want: buf[:want],
                                    block_bytes=step):
            values = block.view(stored)
            flat[at:at + len(values)] = values
            at += len(values)
        return
    whole = reader.read_raw(entry, chunk).view(stored).reshape(chunk.shape)
    region[...] = whole[tuple(slice(s - c, s - c + n)
                              for s, c, n in zip(start, chunk.start, shape))]
