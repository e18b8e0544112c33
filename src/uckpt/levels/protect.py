"""Protect the shares of nodes whose files one process can read (a shared directory, a
test): record every share file, make every node's piece, and return the records of
extension ``redundancy`` (docs/format.md 13.3). Across nodes without shared storage the
pieces are made by :mod:`uckpt.levels.exchange` instead."""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from .encode import piece_blocks
from .records import FileRecord, NodeRecord, Records, piece_name
from .repair import Opener
from .scheme import Redundancy
from .share_io import BLOCK, Reader, ShareView, file_blocks, record_of

#: a node: its name, its ranks, the names of its share's files in order
NodeShare = Tuple[str, Sequence[int], Sequence[str]]


def file_record(name: str, read: Reader, block: int = BLOCK) -> FileRecord:
    """The record (size, CRC-32C) of file ``name`` as ``read`` gives it, read in blocks."""
    return record_of(name, file_blocks(name, read, block), lambda _: None)


def protect(scheme: Redundancy, nodes: Sequence[NodeShare], readers: Sequence[Reader],
            open_file: Opener, step: Optional[int] = None, block: int = BLOCK) -> Records:
    """Record every node's share (``readers[i]`` reads node i's files), write every node's
    piece through ``open_file`` and return the records."""
    files: List[List[FileRecord]] = [[file_record(f, readers[i], block) for f in names]
                                     for i, (_, _, names) in enumerate(nodes)]
    lengths = [sum(f.size for f in fs) for fs in files]
    views = {i: ShareView(fs, readers[i]) for i, fs in enumerate(files)}
    out = []
    for i, (name, ranks, _) in enumerate(nodes):
        with open_file(i, piece_name(i)) as f:
            piece = record_of(piece_name(i), piece_blocks(scheme, lengths, i, views, block),
                              f.write)
        out.append(NodeRecord(name, tuple(ranks), tuple(files[i]), piece))
    return Records(scheme, tuple(out), step)
