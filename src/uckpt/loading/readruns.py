"""Which chunks a load reads together: runs of adjacent chunks of one data file.

A *chunk read* is a raw (uncompressed) chunk whose destination is one contiguous stretch of
its array's memory: a chunk of whole rows (every dimension but the first complete) of
an array read whole. Chunk reads of one file that lie one after another (alignment padding
between them) form a *run* of at most ``block_bytes``: the reader fills a run's
destinations with one vectored read straight into the arrays' memory, then checks each
chunk's CRC-32C while its bytes are still in the CPU cache (:mod:`uckpt.loading.reader`).
Larger chunk reads are runs of their own, read block by block. Every other chunk (part of a
box, compressed, or of an array whose destination is not contiguous) is read on its own.

:func:`flat_chunks` says whether an array's chunks can be read one after another as its
elements in flat C order (a streamed read, :meth:`uckpt.loading.reader.CheckpointReader.stream`).

Pure planning: no I/O here.
"""
from __future__ import annotations

from typing import List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from ..format import ArrayEntry, Chunk

#: the most bytes between two chunk reads (read and dropped) to keep them in one run
MAX_GAP = 4096
#: the most chunk reads in one run (each read and gap is one buffer of a ``preadv``)
MAX_READS = 256


class ChunkRead(NamedTuple):
    """A chunk and the flat bytes of its destination (exactly ``chunk.length`` of them)."""
    offset: int
    raw: np.ndarray
    entry: ArrayEntry
    chunk: Chunk


def split_whole(entry: ArrayEntry, dest: np.ndarray, chunks: Sequence[Chunk]
                ) -> Tuple[List[ChunkRead], List[Chunk]]:
    """Chunk reads for the chunks of ``entry`` read into ``dest`` (the whole array, of its
    shape), and the chunks that must be read on their own."""
    flags = dest.flags
    if not flags.c_contiguous or not flags.writeable:
        return [], list(chunks)
    flat = dest.reshape(-1).view(np.uint8)
    shape = entry.shape
    if len(chunks) == 1:  # (the common case: the whole array in one chunk)
        c = chunks[0]
        if not c.codec and c.length == flat.nbytes and c.shape == shape:
            return [ChunkRead(c.offset, flat, entry, c)], []
    row = flat.nbytes // shape[0] if shape and shape[0] else flat.nbytes
    reads: List[ChunkRead] = []
    rest: List[Chunk] = []
    for c in chunks:
        if c.codec or (shape and (c.shape[1:] != shape[1:] or any(c.start[1:]))):
            rest.append(c)
            continue
        at = c.start[0] * row if shape else 0
        reads.append(ChunkRead(c.offset, flat[at:at + c.length], entry, c))
    return reads, rest


def flat_chunks(entry: ArrayEntry) -> Optional[List[Chunk]]:
    """The chunks holding elements of ``entry`` in the order in which, read one after
    another, they give its elements in flat C order: one chunk of the whole array, or slabs
    of whole rows along the first axis (what uckpt writes); None for any other tiling."""
    chunks = sorted((c for c in entry.chunks if all(c.shape)), key=lambda c: c.start[:1])
    shape, row = entry.shape, 0
    for c in chunks:
        if shape and (c.start[0] != row or c.shape[1:] != shape[1:] or any(c.start[1:])):
            return None
        row += c.shape[0] if shape else 1
    if row != (shape[0] if shape else 1) and all(shape):
        return None
    return chunks


def _file_order(p: ChunkRead) -> tuple:
    chunk = p.chunk
    return chunk.base or "", chunk.file, p.offset


def plan_runs(reads: List[ChunkRead], block_bytes: int) -> List[List[ChunkRead]]:
    """The chunk reads grouped into runs (see the module docstring), in file order."""
    reads = sorted(reads, key=_file_order)
    runs: List[List[ChunkRead]] = []
    run: List[ChunkRead] = []
    end = size = 0
    for p in reads:
        length = p.chunk.length
        if run and (p.chunk.file != run[0].chunk.file or p.chunk.base != run[0].chunk.base
                    or not end <= p.offset <= end + MAX_GAP
                    or size + length > block_bytes or len(run) >= MAX_READS):
            runs.append(run)
            run = []
        if not run:
            size = 0
        run.append(p)
        size += length + (p.offset - end if len(run) > 1 else 0)
        end = p.offset + length
    if run:
        runs.append(run)
    return runs
