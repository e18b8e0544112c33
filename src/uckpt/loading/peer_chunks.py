"""Chunks a rank's node-local copy lacks, fetched over the communicator from ranks
whose nodes hold them (docs/levels.md, "Restore from node-local levels").

A node-local copy of a checkpoint holds the whole manifest and the data files of that
node's ranks. A rank whose restore reads chunks of a file its node's copy lacks
(replicated arrays, which the planner spreads over every rank's file; another node's
slices where the state is resharded) gets them here, before its load: every rank lists
the chunks it will read from files its copy lacks (one exchange of outcomes), then which
of those files its own copy holds (one more), and a rank whose copy holds each such file
(its holder: the rank that wrote it where that rank holds it, else one of the ranks of
a node that does, so that a restart on fewer ranks or other nodes is served too) reads
the chunks and sends them to the rank that asked, as raw bytes
(:meth:`~uckpt.comm.Communicator.exchange`, point to point: only those two take part). The load then
reads them from memory (:class:`WithPeerChunks`), checking every chunk's checksum as for
any chunk. Where no rank's copy holds a file asked for (its node was wiped, or is not
in the job any more), the :class:`~uckpt.errors.CheckpointNotFoundError` of the lowest
rank that asked is raised on every rank.
"""
from __future__ import annotations

import bisect
import logging
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..comm import Communicator
from ..storage.base import CheckpointSource, MediumReader
from ..storage.readback import SourceReader
from .reader import CheckpointReader
from .cast import Cast, CastPolicy
from .restore import matched
from .selection import Patterns, selection_of

log = logging.getLogger("uckpt.loading.peer_chunks")

#: a chunk asked for: (data file, offset, length, the rank that wrote the file, the
#: file's size)
Ask = Tuple[str, int, int, int, int]


def with_peer_chunks(open_: Callable[[], CheckpointSource], state: Optional[Mapping[str, Any]],
                     strict: bool, comm: Communicator, what: str, cast: Cast = None,
                     select: Optional[Patterns] = None) -> Callable[[], CheckpointSource]:
    """Collective: fetch the chunks each rank's load of ``state`` (None: everything)
    reads from data files its copy (``open_()``) lacks, of the leaves ``select`` picks
    (None: all); returns the opener of its copy with them (``open_`` itself where this
    rank lacks nothing)."""
    start = time.perf_counter()
    asks: List[List[Ask]] = [[tuple(a) for a in rank_asks] for rank_asks in  # type: ignore[misc]
                             comm.gather_outcomes(lambda: _lacking(open_, state, strict, comm,
                                                                   cast, select),
                                                  f"{what} (listing chunks its node lacks)")]
    if not any(asks):
        return open_
    files = sorted({a[0] for rank_asks in asks for a in rank_asks})
    held = comm.gather_outcomes(lambda: _held(open_, files),
                                f"{what} (finding the copies that hold the chunks)")
    holder = holders(files, asks, held)
    served: Dict[int, bytearray] = {}
    comm.gather_outcomes(lambda: served.update(_serve(open_, asks, holder, comm.rank)),
                         f"{what} (reading chunks other nodes lack)")
    mine = asks[comm.rank]
    sources = sorted({holder[a[0]] for a in mine})
    arrived: Dict[int, Any] = {}
    if served or sources:  # point to point, raw bytes: only the ranks that take part
        arrived = comm.exchange(served, sources)
    got: Dict[str, List[Tuple[int, memoryview]]] = {}
    for source in sources:  # views of the messages: no chunk copied again
        data, at = memoryview(arrived[source]).cast("B"), 0
        for name, offset, length, _, _ in (a for a in mine if holder[a[0]] == source):
            got.setdefault(name, []).append((offset, data[at:at + length]))
            at += length
    if not mine:
        return open_
    sizes = {a[0]: a[4] for a in mine}
    log.info("rank %d read %d chunk(s), %d bytes, of %d data file(s) its node's copy lacks "
             "from the ranks whose copies hold them (%s), %.3f s", comm.rank, len(mine),
             sum(a[2] for a in mine), len(sizes), ", ".join(map(str, sources)),
             time.perf_counter() - start)
    return lambda: WithPeerChunks(open_(), got, sizes)


def _lacking(open_: Callable[[], CheckpointSource], state: Optional[Mapping[str, Any]],
             strict: bool, comm: Communicator, cast: Cast = None,
             select: Optional[Patterns] = None) -> List[Ask]:
    """The chunks this rank's load (of the leaves ``select`` picks) reads from data
    files its copy lacks."""
    with CheckpointReader(open_(), rank=(comm.rank, comm.size)) as reader:
        m = reader.manifest
        sel = selection_of(m.tree, select, str(reader.directory))
        wanted = {p: None for p in m.arrays if sel is None or p in sel.arrays} \
            if state is None else matched(m, state, strict, comm.rank, CastPolicy(cast),
                                          sel=sel)[1]
        chunks = [c for c in reader.chunks_for(wanted) if c.base is None]
        missing = {n for n in {c.file for c in chunks} if not _present(reader.source, n)}
        return sorted({(c.file, c.offset, c.length, m.files[c.file].rank,
                        m.files[c.file].size) for c in chunks if c.file in missing})


def _present(source: CheckpointSource, name: str) -> bool:
    try:
        source.open_file(name)
    except FileNotFoundError:  # (CheckpointNotFoundError)
        return False
    return True


def _held(open_: Callable[[], CheckpointSource], files: Sequence[str]) -> List[int]:
    """The places in ``files`` of those this rank's copy holds."""
    with open_() as source:
        return [i for i, name in enumerate(files) if _present(source, name)]


def holders(files: Sequence[str], asks: Sequence[Sequence[Ask]], held: Sequence[Sequence[int]]
            ) -> Dict[str, int]:
    """The rank that serves each file asked for (``held``: each rank's places in
    ``files`` of those its copy holds): the rank that wrote it where its copy holds it
    (the same job on the same nodes), else one of the ranks whose copies hold it, spread
    by the file's place; none for a file no copy holds. The same on every rank."""
    writer = {a[0]: a[3] for rank_asks in asks for a in rank_asks}
    having: Dict[str, List[int]] = {}
    for r, places in enumerate(held):
        for i in places:
            having.setdefault(files[i], []).append(r)
    out: Dict[str, int] = {}
    for i, name in enumerate(files):
        ranks = having.get(name)
        if ranks:
            out[name] = writer[name] if writer[name] in ranks else ranks[i % len(ranks)]
    return out


def _serve(open_: Callable[[], CheckpointSource], asks: Sequence[Sequence[Ask]],
           holder: Mapping[str, int], me: int) -> Dict[int, bytearray]:
    """What this rank sends each rank that asked for chunks of the files it serves
    (``holder``): their bytes one after another, in the order asked (a chunk cut short is
    padded with zeros, and fails its checksum where it is read). The lowest rank that
    asked for a file no copy holds raises its CheckpointNotFoundError."""
    out: Dict[int, bytearray] = {}
    lost = sorted({a[0] for a in asks[me] if a[0] not in holder})
    for name in lost:
        if all(a[0] != name for r in range(me) for a in asks[r]):
            with open_() as source:
                source.open_file(name)  # CheckpointNotFoundError: on no node's copy
    theirs = {r: [a for a in rank_asks if holder.get(a[0]) == me]
              for r, rank_asks in enumerate(asks)}
    theirs = {r: a for r, a in theirs.items() if a}
    if not theirs:
        return out
    with open_() as source:
        for r, rank_asks in theirs.items():
            buf = bytearray(sum(a[2] for a in rank_asks))
            at = 0
            for name, offset, length, _, _ in rank_asks:
                source.read_into(name, memoryview(buf)[at:at + length], offset)
                at += length
            out[r] = buf  # sent as it is (exchange takes any bytes-like buffer)
    return out


class WithPeerChunks(CheckpointSource):
    """A node-local copy, with chunks of files it lacks held in memory (``got``: file ->
    [(offset, bytes)], fetched from other nodes; ``sizes``: those files' sizes). A read
    of such a file gets those bytes, zeros elsewhere (a chunk not fetched fails its
    checksum). ``origin`` says where they came from, in messages naming such a file
    (cooperative loads, :mod:`uckpt.loading.cooperative`, hold chunks sent by other
    ranks this way)."""

    def __init__(self, inner: CheckpointSource, got: Dict[str, List[Tuple[int, memoryview]]],
                 sizes: Dict[str, int], origin: str = "read from another node") -> None:
        self.inner, self.sizes, self.origin = inner, sizes, origin
        self.got = {name: sorted(ranges, key=lambda r: r[0]) for name, ranges in got.items()}
        self._starts = {name: [o for o, _ in ranges] for name, ranges in self.got.items()}
        self.where = inner.where
        self.block_bytes, self.coalesce = inner.block_bytes, inner.coalesce
        self.read_threads, self.verify_threads = inner.read_threads, inner.verify_threads
        self.shares_cache = inner.shares_cache

    @property
    def location(self) -> Any:
        return self.inner.location

    def manifest_bytes(self) -> bytes:
        return self.inner.manifest_bytes()

    def open_file(self, name: str, what: str = "data file") -> int:
        if name not in self.got:
            return self.inner.open_file(name, what)
        return self.sizes[name]

    def read_into(self, name: str, buf: Any, offset: int) -> int:
        if name not in self.got:
            return self.inner.read_into(name, buf, offset)
        view = memoryview(buf).cast("B")
        view[:] = bytes(len(view))
        end = offset + len(view)
        ranges, starts = self.got[name], self._starts[name]
        for at, data in ranges[max(0, bisect.bisect_right(starts, offset) - 1):]:
            if at >= end:
                break
            lo, hi = max(at, offset), min(at + len(data), end)
            if lo < hi:
                view[lo - offset:hi - offset] = data[lo - at:hi - at]
        return max(0, min(len(view), self.sizes[name] - offset))

    def read_vectored(self, name: str, bufs: Sequence[Any], offset: int) -> int:
        if name not in self.got:
            return self.inner.read_vectored(name, bufs, offset)
        return super().read_vectored(name, bufs, offset)

    def file_where(self, name: str) -> str:
        where = self.inner.file_where(name)
        return where if name not in self.got else f"{where} ({self.origin})"

    def medium_reader(self, name: str) -> MediumReader:
        return SourceReader(self, name) if name in self.got else self.inner.medium_reader(name)

    @property
    def bytes_read(self) -> int:
        return self.inner.bytes_read

    def sibling(self, name: str) -> CheckpointSource:
        return self.inner.sibling(name)

    def close(self) -> None:
        self.inner.close()

