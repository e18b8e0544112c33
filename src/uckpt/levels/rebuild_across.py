"""Rebuild lost shares and pieces over the job's communicator, where no process can read
another node's files (node-local levels without a shared file system): the mirror image
of :func:`uckpt.levels.exchange.protect_across`.

Each node's leader (its lowest rank) checks its own share and piece against the records;
the ranks agree on what is lost (:func:`~uckpt.levels.repair.check_recoverable`, the same
verdict everywhere); then, one lost share at a time, the survivors that hold its
redundancy send their blocks to its leader, which folds them and writes the share's files,
each checked against its record; last, every damaged or lost piece is made again from
the shares it protects. Memory per leader: a few blocks.
"""
from __future__ import annotations

import time
from typing import IO, Any, Callable, Dict, Iterator, List, Sequence, Tuple

import numpy as np

from ..comm.base import Buffer, Communicator
from .exchange import node_map
from .records import Records
from .repair import (BlockStream, Opener, Repaired, check_recoverable, log, node_damage,
                     write_checked)
from .scheme import group_of, holder, segment_size, segments, sources
from .share_io import BLOCK, Reader, ShareView, spans


def repair_across(comm: Communicator, nodes: Sequence[str], records: Records, read: Reader,
                  open_file: Callable[[str], IO[bytes]], block: int = BLOCK) -> Repaired:
    """Collective: check every node's share and piece and rebuild what is lost, each node's
    leader reading and writing only its own files (``read``, ``open_file(name)``; the other
    ranks' are not used). Returns, on every rank, what was rebuilt. Raises
    :class:`~uckpt.errors.ShareLostError` on every rank when a lost share's redundancy is
    lost too (nothing is written then)."""
    start = time.monotonic()
    names, ranks = node_map(nodes)
    if names != [n.name for n in records.nodes] or ranks != [list(n.ranks) for n in
                                                              records.nodes]:
        raise ValueError(f"the job's nodes {names} (ranks {ranks}) are not the records' "
                         f"{[n.name for n in records.nodes]}: a rebuild needs the same nodes")
    leaders = [r[0] for r in ranks]
    me = leaders.index(comm.rank) if comm.rank in leaders else None

    def check() -> Any:
        return None if me is None else list(node_damage(records.nodes[me], read, block))

    found = comm.gather_outcomes(check, "checking the shares")
    shares = {i: found[r][0] for i, r in enumerate(leaders) if found[r][0] is not None}
    pieces = {i: found[r][1] for i, r in enumerate(leaders) if found[r][1] is not None}
    check_recoverable(records, shares, pieces)  # the same verdict on every rank

    def work() -> None:
        if me is None:
            return
        steps = _Steps(comm, records, leaders, me, read, block)
        for lost in sorted(shares):
            steps.share(lost, open_file)
        for node in sorted(pieces):
            steps.piece(node, open_file)

    comm.gather_outcomes(work, "rebuilding lost shares")
    for lost in sorted(shares):
        log.info("step %s: rebuilt the share of %s (%s) from %s over the communicator",
                 records.step, records.describe(lost), shares[lost], records.scheme)
    return Repaired(shares, pieces, time.monotonic() - start)


class _Steps:
    """One leader's part in each rebuild: send its blocks, or receive and write."""

    def __init__(self, comm: Communicator, records: Records, leaders: List[int], me: int,
                 read: Reader, block: int) -> None:
        self.comm, self.records, self.leaders, self.me = comm, records, leaders, me
        self.block, self.n = block, len(leaders)
        self.scheme, self.lengths = records.scheme, records.lengths
        self.share_view = ShareView(records.nodes[me].files, read)
        self.piece_view = ShareView([records.nodes[me].piece], read)

    def _opener(self, open_file: Callable[[str], IO[bytes]]) -> Opener:
        return lambda node, name: open_file(name)

    # --- a lost share ------------------------------------------------------------------
    def share(self, lost: int, open_file: Callable[[str], IO[bytes]]) -> None:
        senders = self._share_senders(lost)
        rounds = self._share_rounds(lost)
        if self.me == lost:
            stream = BlockStream(self._receive(rounds, senders))
            for f in self.records.nodes[lost].files:
                write_checked(self.records, lost, f, stream.take(f.size),
                              self._opener(open_file))
        elif self.me in senders:
            for seg, off, k in rounds:
                self._send(lost, self._share_block(lost, seg, off, k))

    def _share_senders(self, lost: int) -> List[int]:
        if self.scheme.kind == "partner":
            return [holder(self.scheme, self.n, lost, 0)]
        return [m for m in group_of(self.scheme, self.n, lost) if m != lost]

    def _share_rounds(self, lost: int) -> List[Tuple[int, int, int]]:
        """(segment, offset, bytes) of each round rebuilding ``lost``'s share."""
        length = self.lengths[lost]
        if self.scheme.kind == "partner":
            return [(0, off, k) for off, k in spans(length, self.block)]
        s = segment_size(self.scheme, self.n, lost, self.lengths)
        out: List[Tuple[int, int, int]] = []
        for seg in range(segments(self.scheme, self.n, lost)):
            for off in range(0, s, self.block):
                k = min(self.block, s - off, length - seg * s - off)
                if k <= 0:
                    return out
                out.append((seg, off, k))
        return out

    def _share_block(self, lost: int, seg: int, off: int, k: int) -> bytes:
        """This survivor's contribution to bytes ``off``.. of segment ``seg`` of ``lost``."""
        j = holder(self.scheme, self.n, lost, seg)
        if self.me == j:
            return self.piece_view.read(off, k)
        s = segment_size(self.scheme, self.n, lost, self.lengths)
        mine = dict(sources(self.scheme, self.n, j))[self.me]  # my segment in j's piece
        return self.share_view.read(mine * s + off, k)

    # --- a lost piece --------------------------------------------------------------------
    def piece(self, node: int, open_file: Callable[[str], IO[bytes]]) -> None:
        srcs = [src for src, _ in sources(self.scheme, self.n, node)]
        if self.scheme.kind == "partner":
            length = self.lengths[srcs[0]]
        else:
            length = segment_size(self.scheme, self.n, node, self.lengths)
        rounds = [(0, off, k) for off, k in spans(length, self.block)]
        if self.me == node:
            write_checked(self.records, node, self.records.nodes[node].piece,
                          self._receive(rounds, srcs), self._opener(open_file))
        elif self.me in srcs:
            seg = dict(sources(self.scheme, self.n, node))[self.me]
            s = 0 if self.scheme.kind == "partner" else \
                segment_size(self.scheme, self.n, node, self.lengths)
            for _, off, k in rounds:
                self._send(node, self.share_view.read(seg * s + off, k))

    # --- messages ------------------------------------------------------------------------
    def _send(self, node: int, data: Buffer) -> None:
        self.comm.exchange({self.leaders[node]: data}, [])

    def _receive(self, rounds: List[Tuple[int, int, int]], senders: List[int]) -> Iterator[bytes]:
        """The XOR of the senders' blocks, round by round (one sender: its blocks)."""
        for _, _, k in rounds:
            got: Dict[int, Buffer] = self.comm.exchange({}, [self.leaders[m] for m in senders])
            acc = np.zeros(k, dtype=np.uint8)
            for data in got.values():
                np.bitwise_xor(acc, np.frombuffer(data, dtype=np.uint8), out=acc)
            yield acc.tobytes()
