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
from typing import IO, Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

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
    leaders = _leaders(nodes, records)
    gone = {i: "node not in the job" for i, r in enumerate(leaders) if r is None}
    me = leaders.index(comm.rank) if comm.rank in leaders else None

    def check() -> Any:
        return None if me is None else list(node_damage(records.nodes[me], read, block))

    found = comm.gather_outcomes(check, "checking the shares")
    shares = {i: found[r][0] for i, r in enumerate(leaders)
              if r is not None and found[r][0] is not None}
    pieces = {i: found[r][1] for i, r in enumerate(leaders)
              if r is not None and found[r][1] is not None}
    check_recoverable(records, {**shares, **gone}, {**pieces, **gone})  # the same everywhere
    shares.update(gone)
    if gone:
        pieces = {}  # on fewer nodes, the next save makes the pieces of the new layout

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
        log.info("step %s: rebuilt the share of %s (%s) from %s over the communicator%s",
                 records.step, records.describe(lost), shares[lost], records.scheme,
                 f", into the copy of {records.describe(host(records, leaders, lost))}"
                 if lost in gone else "")
    return Repaired(shares, pieces, time.monotonic() - start)


def _leaders(nodes: Sequence[str], records: Records) -> List[Optional[int]]:
    """The job's leader of each node of the records, matched by node name whatever the
    job's order (an elastic launcher may number the nodes anew); None: a node not in the
    job, whose share is rebuilt into another node's copy. ValueError where the job has a
    node the records lack."""
    names, ranks = node_map(nodes)
    known = [n.name for n in records.nodes]
    if not set(names) <= set(known):
        raise ValueError(f"the job's nodes {names} (ranks {ranks}) are not the records' "
                         f"{known} or some of them: a rebuild needs the same nodes, or "
                         "fewer of them")
    first = dict(zip(names, (r[0] for r in ranks)))
    return [first.get(n) for n in known]


def host(records: Records, leaders: Sequence[Optional[int]], node: int) -> int:
    """The node (of the records) whose copy holds the rebuilt share of ``node``: ``node``
    itself where it is in the job, else the node that keeps its partner copy (``partner``)
    or the lowest other member of its XOR group (both in the job, or the share could not
    be rebuilt)."""
    if leaders[node] is not None:
        return node
    n, scheme = len(records.nodes), records.scheme
    if scheme.kind == "partner":
        return holder(scheme, n, node, 0)
    return next(m for m in group_of(scheme, n, node) if m != node)


class _Steps:
    """One leader's part in each rebuild: send its blocks, or receive and write."""

    def __init__(self, comm: Communicator, records: Records, leaders: List[Optional[int]],
                 me: int, read: Reader, block: int) -> None:
        self.comm, self.records, self.me = comm, records, me
        # the rank that receives what each node's copy gets (a gone node's: its host's)
        self.hosts = [host(records, leaders, i) for i in range(len(leaders))]
        hosted = [leaders[h] for h in self.hosts]
        self.leaders: List[int] = [r for r in hosted if r is not None]
        if len(self.leaders) != len(hosted):  # (check_recoverable refused it before)
            raise ValueError(f"step {records.step}: a lost node's host is not in the job")
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
        if self.me == self.hosts[lost]:  # (a host of a gone node is one of its senders)
            own = (lambda seg, off, k: self._share_block(lost, seg, off, k)) \
                if self.me in senders else None
            stream = BlockStream(self._receive(rounds, [m for m in senders if m != self.me],
                                               own))
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

    def _receive(self, rounds: List[Tuple[int, int, int]], senders: List[int],
                 own: Optional[Callable[[int, int, int], bytes]] = None) -> Iterator[bytes]:
        """The XOR of the senders' blocks, round by round (one sender: its blocks), and of
        this node's own (``own(segment, offset, bytes)``) where it is one of them."""
        for seg, off, k in rounds:
            got: Dict[int, Buffer] = self.comm.exchange(
                {}, [self.leaders[m] for m in senders]) if senders else {}
            if own is not None:
                got = {**got, self.comm.rank: own(seg, off, k)}
            acc = np.zeros(k, dtype=np.uint8)
            for data in got.values():
                np.bitwise_xor(acc, np.frombuffer(data, dtype=np.uint8), out=acc)
            yield acc.tobytes()
