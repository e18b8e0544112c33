"""Make every node's piece over the job's communicator (docs/format.md 13.3): each node's
lowest rank (its *leader*) sends the blocks of its share to the nodes that keep its
redundancy (:meth:`~uckpt.comm.Communicator.exchange`), receives the blocks its own piece
is made of, and writes that piece; then every rank learns every node's records.

Memory per leader: a few blocks (partner: one sent, one received; xor: ``g - 1`` of each
and the parity being built), never a share. Collective: every rank of ``comm`` calls
:func:`protect_across`, in the same order as its other collectives.
"""
from __future__ import annotations

from typing import IO, Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..codecs.checksum import crc32c, format_checksum
from ..comm.base import Buffer, Communicator
from ..runtime.nodes import Nodes
from .protect import file_record
from .records import FileRecord, NodeRecord, Records, piece_name
from .scheme import Redundancy, holder, segment_size, sources
from .share_io import BLOCK, Reader, ShareView, spans


def node_map(nodes: Sequence[str]) -> Tuple[List[str], List[List[int]]]:
    """The node names in node order (by lowest rank) and each node's ranks, from the node
    name of each rank (``nodes[rank]``, e.g. :attr:`uckpt.runtime.nodes.Nodes.of_rank`)."""
    by_node = Nodes(tuple(nodes)).ranks()
    return list(by_node), [list(r) for r in by_node.values()]


def protect_across(comm: Communicator, nodes: Sequence[str], scheme: Redundancy,
                   files: Sequence[str], read: Reader, open_piece: Callable[[str], IO[bytes]],
                   step: Optional[int] = None, block: int = BLOCK) -> Records:
    """Collective: make this node's piece from the other nodes' shares and return every
    node's records, on every rank.

    ``nodes[r]`` names rank r's node (:attr:`uckpt.runtime.nodes.Nodes.of_rank`). On a
    node's leader (its lowest rank), ``files`` are
    its share's file names in order, ``read`` reads them and ``open_piece(name)`` opens
    the piece for writing; the other ranks pass ``()`` and are not asked to read or write.
    """
    names, ranks = node_map(nodes)
    leaders = [r[0] for r in ranks]
    me = leaders.index(comm.rank) if comm.rank in leaders else None

    def mine() -> Any:
        return None if me is None else \
            [f.to_json() for f in (file_record(f, read, block) for f in files)]

    sources(scheme, len(names), 0)  # the same on every rank: too few nodes raise here
    shares = comm.gather_outcomes(mine, "recording the shares")
    records = [tuple(FileRecord(**f) for f in shares[r]) for r in leaders]
    lengths = [sum(f.size for f in fs) for fs in records]

    def piece() -> Any:
        if me is None:
            return None
        view = ShareView(records[me], read)
        with open_piece(piece_name(me)) as out:
            made = _rounds(comm, scheme, leaders, lengths, me, view, out, block)
        return made.to_json()

    pieces = comm.gather_outcomes(piece, "making the redundancy pieces")
    return Records(scheme, tuple(
        NodeRecord(name, tuple(rs), records[i], FileRecord(**pieces[leaders[i]]))
        for i, (name, rs) in enumerate(zip(names, ranks))), step)


def _rounds(comm: Communicator, scheme: Redundancy, leaders: List[int], lengths: List[int],
            me: int, view: ShareView, out: IO[bytes], block: int) -> FileRecord:
    """This leader's side of the exchange, round by round; its piece's record."""
    n = len(leaders)
    if scheme.kind == "partner":
        to, frm = holder(scheme, n, me, 0), sources(scheme, n, me)[0][0]
        sends = -(-lengths[me] // block)
        recvs = -(-lengths[frm] // block)
        value = size = 0
        for r in range(max(sends, recvs)):
            outgoing: Dict[int, Buffer] = {}
            if r < sends:
                outgoing[leaders[to]] = view.read(r * block, min(block, lengths[me] - r * block))
            got = comm.exchange(outgoing, [leaders[frm]] if r < recvs else [])
            if r < recvs:
                data = got[leaders[frm]]
                out.write(data)
                value, size = crc32c(data, value), size + len(data)
        return FileRecord(piece_name(me), size, format_checksum(value))
    s = segment_size(scheme, n, me, lengths)
    mine = sources(scheme, n, me)  # the nodes my piece is made of, and their segments
    # the nodes whose pieces hold a segment of my share: node -> segment index
    theirs = {holder(scheme, n, me, seg): seg for seg in range(len(mine))}
    value = size = 0
    for off, k in spans(s, block):
        outgoing = {leaders[j]: view.read(seg * s + off, k) for j, seg in theirs.items()}
        got = comm.exchange(outgoing, [leaders[src] for src, _ in mine])
        acc = np.zeros(k, dtype=np.uint8)
        for data in got.values():
            np.bitwise_xor(acc, np.frombuffer(data, dtype=np.uint8), out=acc)
        piece = acc.tobytes()
        out.write(piece)
        value, size = crc32c(piece, value), size + k
    return FileRecord(piece_name(me), size, format_checksum(value))
