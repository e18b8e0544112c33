"""Reads shared across ranks (cooperative loads, docs/distributed.md): each chunk that
several ranks of a node (``"node"``) or of the job (``"job"``) read is read from storage by
one of them, checked, and sent to the others over the communicator; every rank still
checks each chunk it receives against the manifest's checksum. ``"auto"`` (the default) is
``"node"`` where the ranks read from a store without a shared page cache (an object
store), else every rank reads what it loads (local files: the node's page cache shares
the reads already, and reading it is cheaper than sending: docs/benchmarks.md).

A collective load (:func:`uckpt.loading.collective.load_from`) with cooperation runs its
reads through a :class:`CooperativeReader` on every rank:

1. each rank plans its read (what ``read_arrays`` would read), allocates its new arrays and
   lists the chunks it reads, with its node: one exchange of outcomes (a failure on any
   rank is raised, as a :class:`~uckpt.errors.DistributedError`, on all);
2. every rank computes the same :func:`assign`: in each group (a node, or the job), each
   chunk that more than one of its ranks read goes to one of them, the least loaded by
   bytes so far, largest chunks first; and the same :func:`rounds`: those chunks, in file
   order, in rounds in which no rank reads or receives more than
   ``knobs.cooperative_round_bytes``;
3. in each round the readers read their chunks from storage, checking each CRC-32C (an
   exchange of outcomes: a damaged chunk raises its
   :class:`~uckpt.errors.ChecksumMismatchError`, inside a DistributedError, on every
   rank), send them to the ranks that read them too
   (:meth:`~uckpt.comm.Communicator.exchange`, point to point, the bytes as they are
   stored), and every rank reads that round's chunks into its arrays from those bytes
   through the usual reading path (:class:`~uckpt.loading.peer_chunks.WithPeerChunks`),
   checking every CRC again: a transfer that damaged a chunk fails there, and is raised on
   every rank at the next exchange of outcomes (the next round's, or the load's);
4. the chunks no other rank of its group reads: read from storage as any load does.

Memory beyond the arrays: per round, what a rank reads plus what it receives, each at
most ``knobs.cooperative_round_bytes`` (or one chunk, where a chunk is larger).
"""
from __future__ import annotations

import logging
from collections import Counter
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from .. import knobs
from ..comm import Communicator
from ..errors import DistributedError, OptionsError
from ..format import Chunk
from ..runtime import memory
from ..runtime.parallel import parallel_map
from .peer_chunks import WithPeerChunks
from .reader import CheckpointReader, allocated

log = logging.getLogger("uckpt.loading.cooperative")

#: a chunk as the ranks name it to each other: (base checkpoint, "" for this one; data
#: file; byte offset; length)
Key = Tuple[str, str, int, int]
#: what ``cooperative=`` takes besides False / "off"
MODES = ("auto", "node", "job")


def mode_of(cooperative: Any) -> Optional[str]:
    """The cooperation a load asks for with ``cooperative=``: ``"auto"``, ``"node"``,
    ``"job"``, or None (off: False or ``"off"``); None given: ``knobs.cooperative_load``
    (``UCKPT_COOPERATIVE_LOAD``). Anything else is an OptionsError."""
    value = knobs.cooperative_load if cooperative is None else cooperative
    if value is False or value == "off":
        return None
    if isinstance(value, str) and value in MODES:
        return value
    source = "UCKPT_COOPERATIVE_LOAD" if cooperative is None else "cooperative="
    raise OptionsError(f"{source} {value!r} is not a way to share reads across ranks",
                       hint='use "node" (each chunk read once per node), "job" (once per '
                            'job), "auto" ("node" from an object store, else off) or False '
                            '/ "off" (every rank reads what it loads)')


def key(chunk: Chunk) -> Key:
    return chunk.base or "", chunk.file, chunk.offset, chunk.length


class Transfer(NamedTuple):
    """A chunk that ``reader`` reads from storage and sends to the ranks ``to``."""
    key: Key
    reader: int
    to: Tuple[int, ...]


def assign(needs: Sequence[Sequence[Key]], groups: Sequence[Any]) -> List[Transfer]:
    """The transfers of the chunks ranks share (``needs[r]``: the chunks rank ``r`` reads;
    ``groups[r]``: its group, a node's name or one name for the job): in each group, each
    chunk that more than one of its ranks read is read by one of them, the one that has
    been given the fewest bytes so far (largest chunks first; ties: the lowest rank), and
    sent to the others. Pure: the same on every rank. In file order."""
    needers: Dict[Tuple[str, Key], List[int]] = {}
    for rank, keys in enumerate(needs):
        for k in keys:
            needers.setdefault((str(groups[rank]), k), []).append(rank)
    shared = sorted(((g, k) for (g, k), ranks in needers.items() if len(ranks) > 1),
                    key=lambda gk: (-gk[1][3], gk[1], gk[0]))
    given = [0] * len(needs)
    out = []
    for g, k in shared:
        ranks = needers[(g, k)]
        reader = min(ranks, key=lambda r: (given[r], r))
        given[reader] += k[3]
        out.append(Transfer(k, reader, tuple(r for r in ranks if r != reader)))
    return sorted(out)


def rounds(transfers: Sequence[Transfer], limit: int) -> List[List[Transfer]]:
    """``transfers`` in order, cut into rounds in which no rank reads, and none receives,
    more than ``limit`` bytes (a round holds at least one transfer)."""
    out: List[List[Transfer]] = []
    batch: List[Transfer] = []
    read: Counter = Counter()
    got: Counter = Counter()
    for t in transfers:
        n = t.key[3]
        if batch and (read[t.reader] + n > limit or any(got[r] + n > limit for r in t.to)):
            out.append(batch)
            batch, read, got = [], Counter(), Counter()
        batch.append(t)
        read[t.reader] += n
        for r in t.to:
            got[r] += n
    if batch:
        out.append(batch)
    return out


class Cooperation:
    """One cooperative load on ``comm`` (``mode``: ``"node"`` or ``"job"``; ``node``: this
    rank's node name). :meth:`run` runs the load; its :class:`CooperativeReader` takes
    part in the exchanges. Every exchange of outcomes is one that every rank makes: a
    failure agreed in one (:attr:`agreed`) is raised by every rank as it is."""

    def __init__(self, comm: Communicator, mode: str, node: str, what: str) -> None:
        self.comm, self.mode, self.node, self.what = comm, mode, node, what
        self.started = False  # whether this rank's reader began its exchanges
        self.agreed: Optional[DistributedError] = None

    def step(self, fn: Callable[[], Any], doing: str) -> List[Any]:
        """Collective: ``fn()`` on every rank, every rank's result (gather_outcomes)."""
        try:
            return self.comm.gather_outcomes(fn, f"{self.what} ({doing})")
        except DistributedError as e:
            self.agreed = e
            raise

    def run(self, job: Callable[[], Any]) -> Any:
        """Collective: ``job()`` (a load through a :class:`CooperativeReader`) on every rank.
        A rank whose load failed before its reader's first exchange takes part in it with
        its error; a failure agreed in an exchange is raised as it is; any other is agreed
        at the end, as by every collective load."""
        error: Optional[BaseException] = None
        out = None
        try:
            out = job()
        except Exception as e:  # noqa: BLE001 - shared with the other ranks, then raised
            error = e
            if not self.started:
                try:
                    self.step(_raising(e), LISTING)
                except DistributedError:
                    pass  # (self.agreed)
        if self.agreed is not None:
            raise self.agreed
        self.comm.gather_outcomes(_raising(error), self.what)
        return out


LISTING = "listing the chunks each rank reads"


def _raising(error: Optional[BaseException]) -> Callable[[], None]:
    def fn() -> None:
        if error is not None:
            raise error
    return fn


class CooperativeReader(CheckpointReader):
    """A :class:`CheckpointReader` whose :meth:`read_arrays` is collective: the chunks this
    rank shares with others of its group are read once and sent (the module's steps 1-4);
    the rest is read as usual. ``received``: the bytes other ranks sent it."""

    def __init__(self, cooperation: Cooperation, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.coop = cooperation
        self.received = 0
        self._share = bytearray()  # this rank's chunks of the round, read
        self._held: Optional[Dict[str, WithPeerChunks]] = None  # during a round's reads

    def _source(self, base: Optional[str]):
        if self._held is not None and (base or "") in self._held:
            return self._held[base or ""]
        return super()._source(base)

    def _mismatch(self, entry: Any, chunk: Chunk, got: str, kind: str = "checksum",
                  hint: str = "the file is corrupted; restore an earlier checkpoint") -> None:
        if self._held is not None and (chunk.base or "") in self._held:
            hint = ("another rank read this chunk, checked it and sent it: its bytes were "
                    "damaged on the way (communicator, memory); load again, or with "
                    "cooperative=False to read every chunk here")
        super()._mismatch(entry, chunk, got, kind, hint)

    def read_arrays(self, wanted: Mapping[str, Any]) -> Dict[str, np.ndarray]:
        coop, me = self.coop, self.coop.comm.rank
        coop.started = True
        mine: Dict[str, Any] = {}

        def prepare() -> list:
            with memory.mapped("reading arrays from", self.source.where):
                mine["plan"] = plan = allocated(self.checked_plan(wanted))
            if coop.mode == "auto" and self.source.shares_cache:
                return [coop.node, None]  # (its node's page cache shares the reads)
            return [coop.node, sorted({key(c) for _, _, _, cs in plan for c in cs})]

        views = coop.step(prepare, LISTING)
        plan = mine["plan"]
        groups = [v[0] if coop.mode != "job" else "" for v in views]
        transfers = [] if any(v[1] is None for v in views) else \
            assign([[tuple(k) for k in v[1]] for v in views], groups)  # type: ignore
        batches = rounds(transfers, knobs.cooperative_round_bytes)
        index = {key(c): (e, c) for e, _, _, cs in plan for c in cs}
        pending: Optional[BaseException] = None
        for i, batch in enumerate(batches):
            share = [t for t in batch if t.reader == me]
            coop.step(lambda: self._read_share(share, index, pending),  # noqa: B023
                      f"reading chunks shared across ranks, round {i + 1} of {len(batches)}")
            held = self._swap(batch, share)
            if pending is None:
                try:
                    self._read_held(plan, held)
                except Exception as e:  # noqa: BLE001 - agreed at the next exchange
                    pending = e
        if pending is not None:
            raise pending
        shared = {t.key for t in transfers if t.reader == me or me in t.to}
        with memory.mapped("reading arrays from", self.source.where):
            self._read_planned(_only(plan, lambda k: k not in shared))
        read = sum(t.key[3] for t in transfers if t.reader == me)
        log.debug("rank %d of %d (cooperative load, per %s): %d chunk(s) shared, %d bytes of "
                 "them read from storage and sent on, %d bytes received in %d round(s)",
                 me, coop.comm.size, coop.mode, len(shared), read, self.received,
                 len(batches))
        return {e.path: t for e, t, _, _ in plan}

    def _read_share(self, share: List[Transfer], index: Mapping[Key, Any],
                    pending: Optional[BaseException]) -> None:
        """Read this rank's chunks of a round from storage, CRC checked, into one buffer
        (kept in ``self._share``); first raise ``pending``, the previous round's failure."""
        if pending is not None:
            raise pending
        starts = np.cumsum([0] + [t.key[3] for t in share]).tolist()
        data = bytearray(starts[-1])
        view = np.frombuffer(data, dtype=np.uint8) if data else np.empty(0, np.uint8)

        def read(i: int) -> None:
            entry, chunk = index[share[i].key]
            at = starts[i]
            self._stream(entry, chunk, lambda done, want: view[at + done:at + done + want])

        parallel_map(read, range(len(share)), self.source.read_threads, "uckpt-coop-read")
        self._share = data

    def _swap(self, batch: List[Transfer], share: List[Transfer]) -> Dict[Key, memoryview]:
        """Send this rank's chunks of a round to the ranks that read them too, receive the
        others' it reads: the bytes of each chunk of the round this rank reads, by key."""
        me, data = self.coop.comm.rank, self._share
        self._share = bytearray()
        view = memoryview(data)
        held: Dict[Key, memoryview] = {}
        at = 0
        for t in share:
            held[t.key] = view[at:at + t.key[3]]
            at += t.key[3]
        sends: Dict[int, Any] = {}
        for dest in sorted({r for t in share for r in t.to}):
            theirs = [t for t in share if dest in t.to]
            sends[dest] = data if len(theirs) == len(share) else \
                bytearray(b"".join(held[t.key] for t in theirs))
        sources = sorted({t.reader for t in batch if me in t.to})
        arrived = self.coop.comm.exchange(sends, sources) if sends or sources else {}
        for source in sources:  # views of the messages: no chunk copied again
            got, at = memoryview(arrived[source]).cast("B"), 0
            self.received += len(got)
            for t in batch:
                if t.reader == source and me in t.to:
                    held[t.key] = got[at:at + t.key[3]]
                    at += t.key[3]
        return held

    def _read_held(self, plan: list, held: Dict[Key, memoryview]) -> None:
        """Read the chunks of ``plan`` in ``held`` into their arrays from those bytes (the
        usual reading path: every CRC checked again)."""
        if not held:
            return
        got: Dict[str, Dict[str, List[Tuple[int, memoryview]]]] = {}
        for (base, name, offset, _), data in held.items():
            got.setdefault(base, {}).setdefault(name, []).append((offset, data))
        m = self.manifest
        self._held = {
            base: WithPeerChunks(CheckpointReader._source(self, base or None), files,
                                 {n: m.bases[base][n] if base else m.files[n].size
                                  for n in files}, "sent by another rank")
            for base, files in got.items()}
        try:
            with memory.mapped("reading arrays from", self.source.where):
                self._read_planned(_only(plan, held.__contains__))
        finally:
            self._held = None


def _only(plan: list, keep: Callable[[Key], bool]) -> list:
    """``plan`` with only the chunks whose keys ``keep`` accepts (arrays left without any
    dropped)."""
    out = []
    for entry, target, start, cs in plan:
        cs = [c for c in cs if keep(key(c))]
        if cs:
            out.append((entry, target, start, cs))
    return out
