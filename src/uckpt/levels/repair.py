"""Find what is lost on a level with redundancy across nodes and rebuild it (docs/format.md
13.3): every node's share and piece checked against its records; a missing or damaged
share rebuilt from redundancy, a missing or damaged piece made again from the shares;
:class:`~uckpt.errors.ShareLostError` when a share's redundancy is gone too."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import IO, Callable, Dict, Iterator, Optional, Sequence, Tuple

from ..codecs.checksum import crc32c, format_checksum
from ..errors import CorruptCheckpointError, ShareLostError
from .encode import piece_blocks, share_blocks
from .records import FileRecord, NodeRecord, Records
from .scheme import group_of, holder
from .share_io import BLOCK, Reader, ShareView, damage

log = logging.getLogger("uckpt.levels.repair")

#: ``open(node, name)``: a binary file open for writing file ``name`` of node ``node``
Opener = Callable[[int, str], IO[bytes]]


@dataclass
class Repaired:
    """What :func:`repair` found and did: node -> what was wrong with its share (rebuilt)
    or its piece (made again), and the seconds it took."""

    shares: Dict[int, str] = field(default_factory=dict)
    pieces: Dict[int, str] = field(default_factory=dict)
    seconds: float = 0.0


def find_damage(records: Records, readers: Sequence[Reader], block: int = BLOCK
                ) -> Tuple[Dict[int, str], Dict[int, str]]:
    """The nodes whose share, and those whose piece, is missing or does not match its
    records: node -> what is wrong (the first damaged file of a share)."""
    shares: Dict[int, str] = {}
    pieces: Dict[int, str] = {}
    for i, rec in enumerate(records.nodes):
        share, piece = node_damage(rec, readers[i], block)
        if share is not None:
            shares[i] = share
        if piece is not None:
            pieces[i] = piece
    return shares, pieces


def node_damage(rec: NodeRecord, read: Reader, block: int = BLOCK
                ) -> Tuple[Optional[str], Optional[str]]:
    """What is wrong with one node's share (its first damaged file) and with its piece;
    None for each that matches its records."""
    share = None
    for f in rec.files:
        what = damage(f, read, block)
        if what is not None:
            share = f"{f.name}: {what}"
            break
    what = damage(rec.piece, read, block)
    return share, None if what is None else f"{rec.piece.name}: {what}"


def check_recoverable(records: Records, shares: Dict[int, str], pieces: Dict[int, str]) -> None:
    """Raise :class:`~uckpt.errors.ShareLostError` for the first lost share (in node order)
    whose redundancy is lost too."""
    n, scheme = len(records.nodes), records.scheme
    for lost, what in sorted(shares.items()):
        if scheme.kind == "partner":
            h = holder(scheme, n, lost, 0)
            if h in pieces:
                raise _lost(records, lost, what, f"its copy on {records.describe(h)} is lost "
                                                 f"too ({pieces[h]})")
            continue
        members = group_of(scheme, n, lost)
        others = [m for m in members if m != lost and (m in shares or m in pieces)]
        if others:
            m = others[0]
            why = shares.get(m) or pieces[m]
            raise _lost(records, lost, what,
                        f"{len(others) + 1} nodes of its XOR group (nodes {members[0]} to "
                        f"{members[-1]}) are damaged or gone, and {scheme} rebuilds one per "
                        f"group: {records.describe(m)} has {why}")


def _lost(records: Records, node: int, what: str, why: str) -> ShareLostError:
    rec = records.nodes[node]
    return ShareLostError(
        f"step {records.step}: the share of {records.describe(node)} is lost ({what}) and "
        f"cannot be rebuilt: {why}", node=rec.name, ranks=list(rec.ranks), step=records.step,
        hint="restore this step from another tier (a CheckpointManager with a durable tier "
             "falls back to it by itself), or an older step")


def repair(records: Records, readers: Sequence[Reader], open_file: Opener,
           block: int = BLOCK) -> Repaired:
    """Check every node's share and piece (``readers[i]``: node i's files) and rebuild what
    is lost through ``open_file``: shares first (from redundancy), then pieces (from the
    shares). Each rebuilt file is checked against its record as it is written. Idempotent:
    a repair cut short is found damaged and redone."""
    start = time.monotonic()
    shares, pieces = find_damage(records, readers, block)
    check_recoverable(records, shares, pieces)
    lengths, scheme = records.lengths, records.scheme
    views = {i: ShareView(r.files, readers[i]) for i, r in enumerate(records.nodes)}
    piece_views = {i: ShareView([r.piece], readers[i]) for i, r in enumerate(records.nodes)}
    for lost in sorted(shares):
        stream = BlockStream(share_blocks(scheme, lengths, lost, views, piece_views, block))
        for f in records.nodes[lost].files:
            write_checked(records, lost, f, stream.take(f.size), open_file)
        log.info("step %s: rebuilt the share of %s (%s) from %s", records.step,
                 records.describe(lost), shares[lost], scheme)
    for node in sorted(pieces):
        write_checked(records, node, records.nodes[node].piece,
               piece_blocks(scheme, lengths, node, views, block), open_file)
        log.info("step %s: made the piece of %s again (%s)", records.step,
                 records.describe(node), pieces[node])
    return Repaired(shares, pieces, time.monotonic() - start)


class BlockStream:
    """Blocks cut again at file boundaries: :meth:`take` yields the next ``n`` bytes."""

    def __init__(self, blocks: Iterator[bytes]) -> None:
        self.blocks, self.buf = blocks, b""

    def take(self, n: int) -> Iterator[bytes]:
        while n > 0:
            if not self.buf:
                self.buf = next(self.blocks, b"")
                if not self.buf:
                    return  # (short: the written file's size says so)
            out, self.buf = self.buf[:n], self.buf[n:]
            n -= len(out)
            yield out


def write_checked(records: Records, node: int, rec: FileRecord, blocks: Iterator[bytes],
                  open_file: Opener) -> None:
    """Write file ``rec.name`` of ``node`` from ``blocks``; raise
    :class:`~uckpt.errors.CorruptCheckpointError` unless it matches its record."""
    value = size = 0
    with open_file(node, rec.name) as out:
        for b in blocks:
            out.write(b)
            value = crc32c(b, value)
            size += len(b)
    if size != rec.size or format_checksum(value) != rec.checksum:
        raise CorruptCheckpointError(
            f"step {records.step}: {rec.name} of {records.describe(node)} was rebuilt as "
            f"{size} bytes with {format_checksum(value)}, but its record says {rec.size} bytes "
            f"with {rec.checksum}: the redundancy it was rebuilt from is wrong",
            path=rec.name, step=records.step,
            hint="restore this step from another tier, or an older step")
