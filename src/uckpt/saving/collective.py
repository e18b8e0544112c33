"""The save path, for any number of ranks: every rank writes its own data file; one commit.

A single process is a world of one (:class:`~uckpt.comm.SingleProcess`) and runs the same
planning, checking and commit code as many ranks. The protocol (see
docs/distributed.md, "How a save runs") runs three exchanges on the communicator; each
ends with every rank knowing whether every other rank succeeded, so a failure anywhere
raises the same :class:`~uckpt.errors.DistributedError` everywhere (in one process: the
error itself) and nothing is committed:

1. *plan*: rank 0 checks the target and opens the save's sink
   (:meth:`~uckpt.storage.base.Store.sink`: a locked temporary directory, or a prefix of
   an object store); every rank sends its metadata
   (:func:`~uckpt.saving.global_plan.local_metadata`) to rank 0, which computes the
   :class:`~uckpt.saving.global_plan.GlobalPlan` (which checks, in one process too, that
   :class:`~uckpt.Shard` boxes tile their arrays) and sends each rank its share
   (:mod:`uckpt.saving.root_plan`); an incremental save all-gathers the metadata and
   every rank computes the whole plan. With a plan kept from the save before
   (:mod:`uckpt.saving.plan_cache`) the ranks first agree by one reduction whether it
   still serves; then no rank sends its metadata;
2. *write*: every rank joins the sink (node-local storage: its own copy of the
   directory), writes its data file durably (compressing its chunks first if asked) and,
   with several ranks, its own manifest part (:mod:`uckpt.saving.own_parts`), and sends a small
   record of them and which copy of the storage it wrote into (its *replica*:
   ``sink.replica()``): to rank 0 only (:func:`_to_committer`), unless the ranks wrote
   into several replicas (node-local storage) or the save is incremental (every chunk's
   record), where every rank gets every record;
3. *commit*: the lowest rank of each replica writes the root manifest (the same on every
   replica) last; in a directory by renaming the temporary directory into place, in an
   object store by the manifest object's PUT. With one replica, rank 0 then broadcasts
   the outcome (:meth:`~uckpt.comm.Communicator.gather_outcomes_to`).

A rank that dies makes the others' exchange fail (the backend's error or
:class:`~uckpt.errors.CollectiveTimeoutError`): nothing is committed, and what was
written is removed by the survivors or, failing that, by the root's next writer.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from ..loading import manifest_io
from . import own_parts
from ..comm import Communicator
from .commit import assemble_manifest, check_metadata, check_step
from .committed import Committed
from .engine import submit_collective
from ..errors import CheckpointExistsError, CheckpointNotFoundError, DamagedBaseError
from ..format import Chunk, Manifest
from ..format import encode_manifest_files
from .incremental import Baseline, bases_of, write_changed
from .global_plan import GlobalPlan, compact, expand, global_plan, local_metadata, merged_tree
from ..options import DEFAULT, SaveOptions
from .plan_cache import VOTE_WIDTH, PlanCache, plan_id, structure_key, values_check
from . import root_plan
from ..loading.reader import CheckpointReader
from .recode import recode_files, recoded_manifest, target_bases
from ..storage.save_errors import raise_save_failure
from .staging import Snapshot, snapshot, snapshot_share
from ..storage.base import CheckpointSink, Store
from ..tree.flatten import FlatState, flatten
from ..codecs.pipeline import Compression
from .writer import file_end, write_data_file

log = logging.getLogger("uckpt.saving.collective")


def save_collective(store: Store, name: str, flat: Union[FlatState, BaseException],
                    comm: Communicator, *, step: Optional[int] = None,
                    metadata: Optional[Dict[str, Any]] = None, overwrite: bool = False,
                    what: Optional[str] = None, options: SaveOptions = DEFAULT,
                    baseline: Optional[Callable[[], Baseline]] = None,
                    on_commit: Optional[Callable[[Committed], None]] = None,
                    cache: Optional[PlanCache] = None,
                    protect: Optional[Callable[..., Optional[Dict[str, Any]]]] = None):
    """Collective: save each rank's ``flat`` as checkpoint ``name`` of ``store``, laid
    out (and compressed) as ``options`` say; returns its location.
    ``baseline``, ``on_commit``, ``cache``, ``protect``: see :func:`prepare_collective`
    and :class:`PreparedSave`.

    ``flat`` may be the exception this rank failed with before the save
    (flattening, snapshot): it is reported to the other ranks, and every rank raises.
    """
    prepared = prepare_collective(store, name, flat, comm, step=step, metadata=metadata,
                                  overwrite=overwrite, what=what, options=options,
                                  baseline=baseline, on_commit=on_commit, cache=cache,
                                  protect=protect)
    assert isinstance(flat, FlatState)
    try:  # device arrays to host memory (host arrays are written in place)
        staged: Union[Snapshot, BaseException] = snapshot(flat, None).ready()
    except Exception as e:  # noqa: BLE001 - reported to the other ranks in the write step
        staged = e
    return finish_or_redo(prepared, staged, comm)


def flatten_shared(state, comm: Communicator) -> Union[FlatState, BaseException]:
    """``flatten(state)`` for a collective save: with several ranks, an error is returned
    (to be told to the other ranks by the plan exchange), not raised here alone."""
    try:
        return flatten(state, rank=comm.rank)
    except Exception as e:  # noqa: BLE001 - see above
        if comm.size == 1:
            raise
        return e


@dataclass
class PreparedSave:
    """A save after its plan exchange: what the write and commit need."""

    sink: CheckpointSink
    store: Store
    name: str
    flat: FlatState
    gathered: List[Dict[str, Any]]
    plan: GlobalPlan
    step: Optional[int]
    metadata: Dict[str, Any]
    overwrite: bool
    what: str
    options: SaveOptions = DEFAULT
    #: incremental: gives, when this rank writes, the previous checkpoint's chunks
    #: (unchanged chunks refer to them)
    baseline: Optional[Callable[[], Baseline]] = None
    #: called on every rank once the checkpoint is committed, with its facts
    #: (:class:`~uckpt.saving.committed.Committed`; the whole manifest only where the
    #: rank has it)
    on_commit: Optional[Callable[[Committed], None]] = None
    #: redundancy across nodes: called on every rank after every rank wrote and before
    #: the commit, ``protect(sink, manifest, comm, replicas)`` (``replicas``: the copy
    #: each rank wrote into where there are several, else None; ``manifest()`` the
    #: root's content, known only then); the
    #: extensions it returns go into the root manifest (:mod:`uckpt.levels.save_level`)
    protect: Optional[Callable[..., Optional[Dict[str, Any]]]] = None


def prepare_collective(store: Store, name: str, flat: Union[FlatState, BaseException],
                       comm: Communicator, *, step: Optional[int] = None,
                       metadata: Optional[Dict[str, Any]] = None, overwrite: bool = False,
                       what: Optional[str] = None,
                       options: SaveOptions = DEFAULT,
                       baseline: Optional[Callable[[], Baseline]] = None,
                       on_commit: Optional[Callable[[Committed], None]] = None,
                       cache: Optional[PlanCache] = None,
                       protect: Optional[Callable[..., Optional[Dict[str, Any]]]] = None
                       ) -> PreparedSave:
    """Collective, step 1 (plan): returns the same plan on every rank, or raises on all.

    ``baseline``: make an incremental checkpoint: its chunks are cut into pieces of
    ``options.incremental_chunk_bytes``, and those equal to a chunk of ``baseline()``
    (called when this rank writes, after the saves before it committed) refer to it;
    every checkpoint it refers to is first checked to be committed.

    ``on_commit``: called on every rank once the checkpoint is committed, with its
    :class:`~uckpt.saving.committed.Committed` facts (a rank of a split save never holds
    the whole manifest: the committer broadcasts a constant-size record).

    ``cache``: this rank's :class:`~uckpt.saving.plan_cache.PlanCache` of the saves before,
    over ``comm``: while the structure of the state is unchanged on every rank, the
    plan is reused after one reduction of digests (:mod:`uckpt.saving.plan_cache`)."""
    what = what or f"save to {str(store.location(name))!r}"
    opened: Dict[str, CheckpointSink] = {}
    meta: Dict[str, Any] = {}
    exact_chunk_bytes = options.incremental_chunk_bytes if baseline is not None else 0
    # several ranks, no base: a manifest split by rank, planned by rank 0 alone, each
    # rank keeping its own share of the plan (uckpt.saving.root_plan)
    at_root = comm.size > 1 and baseline is None
    layout = [exact_chunk_bytes, options.chunk_bytes, options.alignment, int(at_root)]

    def plan() -> Dict[str, Any]:
        """This rank's full record (rank 0: having opened the sink)."""
        local()
        return full()

    def local() -> List[int]:
        """This rank's metadata and, with a cache, its vote (rank 0: opens the sink)."""
        if isinstance(flat, BaseException):
            raise flat
        meta.update(local_metadata(flat, compare=comm.size > 1))
        # the structure's digest only where a plan is kept for the next save (a cache)
        meta["key"] = None if cache is None else structure_key(meta, comm.size, comm.rank,
                                                                layout)
        if comm.rank == 0:
            check_metadata(metadata)
            check_step(step)
            try:
                opened["sink"] = store.sink(name, overwrite, shared=comm.size > 1)
            except BaseException as e:
                raise_save_failure(e, what, store.location(name))
        if cache is None:
            return []
        meta["check"] = values_check(meta)
        return cache.vote(meta["key"], meta["check"]) + [1 if meta["per_rank"] else 0]

    def full() -> Dict[str, Any]:
        out = dict(compact(meta, comm.rank), key=meta["key"])
        if cache is not None:
            out.update(kept=cache.kept_for(meta["key"]), check=meta["check"])
        return dict(out, **head())

    def head() -> Dict[str, Any]:
        """What rank 0 tells every rank: the sink's token and the user's metadata."""
        if comm.rank != 0:
            return {}
        # rank 0's metadata: every replica's manifest says the same
        return {"token": opened["sink"].token, "metadata": metadata or {}}

    try:
        gp: Optional[GlobalPlan] = None
        why: Optional[str] = None
        got: Optional[List[Dict[str, Any]]]
        if cache is None:
            got = comm.gather_outcomes_to(plan, 0, f"{what} (planning)") if at_root else \
                comm.gather_outcomes(plan, f"{what} (planning)")
        else:  # one reduction; while the plan holds, no rank receives any rank's metadata
            mins, maxs = comm.agree_outcomes(local, VOTE_WIDTH + 1, f"{what} (planning)")
            gp = cache.agreed(mins[:-1], maxs[:-1], what)
            if gp is not None:
                got = _lean_records(comm, meta, head(), any_per_rank=maxs[-1] == 1)
            else:
                got = comm.gather(full(), 0) if at_root else comm.all_gather(full())
                why = None if got is None else cache.why(got)
        assert isinstance(flat, FlatState)
        if gp is None and at_root:
            gp, got, pid, why = root_plan.plan_at_root(comm, got, meta, head(),
                                                       exact_chunk_bytes, options, cache, why,
                                                       what)
        elif gp is None:
            assert got is not None
            if cache is not None and why is not None:
                cache.planning(what, why)
            gp, pid = _plan(got, meta, comm, exact_chunk_bytes, options), \
                plan_id([g["key"] for g in got]) if cache is not None else ""
        if cache is not None and why is not None:
            cache.keep(meta["key"], pid, comm.size, gp)
        assert got is not None
        gathered = got
    except BaseException:
        if "sink" in opened:
            opened["sink"].abort()
        raise
    sink = opened.get("sink") or store.join_sink(name, gathered[0]["token"])
    return PreparedSave(sink, store, name, flat, gathered, gp, step, gathered[0]["metadata"],
                        overwrite, what, options, baseline, on_commit, protect)


def _lean_records(comm: Communicator, meta: Dict[str, Any], head: Dict[str, Any],
                  any_per_rank: bool) -> List[Dict[str, Any]]:
    """What a save that reuses its plan needs of the other ranks, by rank: rank 0's
    ``head`` (broadcast) and, only if some rank has :class:`~uckpt.PerRank` state,
    every rank's PerRank subtrees (for the manifest's tree; all-gathered)."""
    per_rank = comm.all_gather(meta["per_rank"]) if any_per_rank else [[]] * comm.size
    records: List[Dict[str, Any]] = [{"per_rank": p} for p in per_rank]
    records[0].update(comm.broadcast(head, 0))
    return records


def _plan(gathered: List[Dict[str, Any]], meta: Dict[str, Any], comm: Communicator,
          exact_chunk_bytes: int, options: SaveOptions) -> GlobalPlan:
    """Plan from every rank's metadata (the same plan, or the same error, on every rank)."""
    differ = expand(gathered)
    if differ:  # rare: some rank's replicated leaves differ; fetch them to say which
        full = comm.all_gather(meta["replicated"] if comm.rank in differ else None)
        for r in differ:
            gathered[r]["replicated"] = full[r]
    return global_plan(gathered, comm.rank, exact_chunk_bytes,  # raises the same error everywhere
                       chunk_bytes=options.chunk_bytes, alignment=options.alignment)


def finish_collective(p: PreparedSave, staged: Union[Snapshot, BaseException], comm: Communicator):
    """Collective, steps 2 and 3 (write, commit), over ``comm`` (the plan's ranks, e.g. a
    background duplicate). ``staged`` is this rank's data (a snapshot of its share, or of
    every array: ``Snapshot(flat)`` writes host arrays in place), or the error the snapshot
    failed with. Returns the location."""
    sink, gp, start = p.sink, p.plan, time.perf_counter()
    where = p.store.location(p.name)
    file, size = gp.plan.file_sizes[comm.rank]
    try:
        def write() -> Dict[str, Any]:
            if isinstance(staged, BaseException):
                raise staged
            try:
                replica = sink.replica()
                mine = gp.plan.for_rank(comm.rank)
                file_image = staged.file_images.get(file)
                if p.baseline is None:
                    chunk_of = write_data_file(sink, file, size, mine, staged.flat.arrays,
                                               file_image=file_image, starts=gp.starts,
                                               compression=p.options.codec,
                                               alignment=p.options.alignment)
                    chunks = [chunk_of[it] for it in mine]
                else:
                    baseline = used["baseline"] = p.baseline()
                    check_bases(p.store, p.name, baseline)
                    chunks = write_changed(sink, file, mine, staged.flat.arrays, file_image,
                                           gp.starts, baseline, p.options.codec,
                                           p.options.alignment)
            except BaseException as e:
                raise_save_failure(e, f"{p.what}: writing {file}", where,
                                   f" ({size} bytes)")
            stored = file_end(c for c in chunks if c.base is None)
            log.info("saved %s of %s: step %s, %d bytes%s, %.3f s", file, where,
                     "-" if p.step is None else p.step, stored,
                     f" ({size} raw)" if stored != size else "", time.perf_counter() - start)
            if split:  # its own part, written here; the others get a small record
                try:
                    entry, own["part"] = own_parts.write_own_part(
                        sink, comm.rank, mine, chunks, gp.metas, replicated, codecs)
                except BaseException as e:
                    raise_save_failure(e, f"{p.what}: writing the manifest part of rank "
                                          f"{comm.rank}", where)
                return {**own_parts.own_record(mine, chunks, replicated, entry),
                        "size": stored, "replica": replica}
            return {"chunks": [_compact(c) for c in chunks], "size": stored, "replica": replica}

        # several ranks, no base: a manifest split by rank (uckpt.saving.own_parts)
        split = comm.size > 1 and p.baseline is None
        replicated = own_parts.replicated_paths(p.flat) if split else set()
        codecs = own_parts.pipelines(p.options.codec is not None)
        own: Dict[str, bytes] = {}
        used: Dict[str, Baseline] = {}
        if split:  # records to the committer only (but for node-local storage)
            written, several, told = _to_committer(comm, write, p)
        else:
            written, told = comm.gather_outcomes(write, f"{p.what} (writing)"), None
            several = len({w["replica"] for w in written}) > 1
        built: Dict[str, Any] = {}
        replicas = [w["replica"] for w in written or ()]
        foreign: List[Optional[str]] = []
        if split and several:  # node-local: every replica gets every part (their
            # bytes exchanged only then)
            foreign = comm.gather_outcomes(lambda: own.get("part", b"").decode() or None,
                                           f"{p.what} (exchanging manifest parts)")

        def manifest() -> Manifest:
            """The manifest (split: its root-level content), where ``written`` is known:
            the committer; without a split manifest or with several replicas, every rank."""
            assert written is not None
            if "m" not in built and split:
                built["m"] = own_parts.head_manifest(
                    merged_tree(p.flat.skeleton, p.gathered), gp.metas, gp.plan,
                    [w["size"] for w in written], p.step, p.metadata)
            if "m" not in built:
                # the order the ranks' chunks arrived in
                ordered = sorted(gp.plan.items, key=lambda it: it.rank)
                found = [c for w in written for c in w["chunks"]]
                chunks = {it: _chunk(it, c) for it, c in zip(ordered, found)}
                built["m"] = assemble_manifest(
                    merged_tree(p.flat.skeleton, p.gathered), gp.metas, gp.plan, chunks, p.step,
                    p.metadata, sizes=[w["size"] for w in written],
                    bases=bases_of(chunks.values(), used.get("baseline")))
            return built["m"]

        def facts() -> Committed:
            """What ``on_commit`` receives: without a split manifest, the manifest; else
            the facts of the root the committer wrote (where ``written`` is not known
            here: as the committer broadcast them)."""
            if "c" not in built:
                if not split:
                    built["c"] = Committed.of(manifest())
                elif written is not None:
                    head = manifest()
                    built["c"] = Committed(p.step, sum(f.size for f in head.files.values()),
                                           head.created, p.metadata)
                else:
                    assert told is not None and told.got is not None
                    built["c"] = Committed.from_record(told.got, p.step, p.metadata)
            return built["c"]

        extra = None if p.protect is None else \
            p.protect(sink, manifest, comm, replicas if several else None)

        def commit() -> None:
            if written is None or replicas.index(replicas[comm.rank]) != comm.rank:
                return  # the lowest rank of this replica commits
            parts: List[Tuple[str, bytes]] = []
            if split:
                data = own_parts.encode_root_of(manifest(), written, codecs, extra)
            else:
                data, parts = encode_manifest_files(manifest())
            try:
                if foreign:
                    own_parts.write_foreign_parts(sink, foreign, replicas, comm.rank)
                manifest_io.write_parts(sink, parts)
                sink.commit(data, p.overwrite)
            except BaseException as e:
                raise_save_failure(e, f"{p.what} (commit)", where,
                                   f": writing its manifest of {len(data)} bytes")
            total = sum(w["size"] for w in written)
            log.info("committed %s: step %s, %d bytes in %d file(s), %.3f s", where,
                     "-" if p.step is None else p.step, total, len(gp.plan.file_sizes),
                     time.perf_counter() - start)

        if split and not several:  # one committer, rank 0: it tells the others the outcome
            comm.gather_outcomes_to(commit, 0, f"{p.what} (commit)")
        else:
            comm.gather_outcomes(commit, f"{p.what} (commit)")
        if told is not None and told.wanted:
            told.share(facts() if written is not None else None)
    except BaseException:
        sink.abort()
        raise
    sink.release()  # a rank that made its node's copy but did not commit it
    if p.on_commit is not None:
        p.on_commit(facts())
    return where


class _Told:
    """The committed checkpoint's facts (:meth:`Committed.record`, a constant size), for
    the ranks other than the committer of a split save: broadcast by the committer after
    the commit, only when some such rank has an ``on_commit`` (``wanted``, the same on
    every rank). They never build the manifest, nor receive the data files' sizes."""

    def __init__(self, comm: Communicator, wanted: bool) -> None:
        self.comm, self.wanted = comm, wanted
        self.got: Optional[Dict[str, Any]] = None

    def share(self, mine: Optional[Committed]) -> None:
        self.got = self.comm.broadcast(None if mine is None else mine.record(), 0)


def _to_committer(comm: Communicator, write: Callable[[], Dict[str, Any]], p: PreparedSave
                  ) -> Tuple[Optional[List[Dict[str, Any]]], bool, _Told]:
    """The write step of a split save: ``write()`` on every rank, its record gathered to
    rank 0 only (:meth:`~uckpt.comm.Communicator.gather_outcomes_to`), which then
    broadcasts whether the ranks wrote into several replicas (node-local storage) and
    whether a rank other than it wants the committed checkpoint's facts (an
    ``on_commit``; :class:`_Told`). Several
    replicas: every rank gets every record (an all-gather, as every replica's lowest
    rank commits). Returns (the records, on rank 0 or everywhere; several; sizes)."""
    mine: Dict[str, Any] = {}

    def recorded() -> Dict[str, Any]:
        mine.update(write())
        return dict(mine, needs=p.on_commit is not None)

    gathered = comm.gather_outcomes_to(recorded, 0, f"{p.what} (writing)")
    decided = comm.broadcast(None if gathered is None else [
        len({w["replica"] for w in gathered}) > 1, any(w["needs"] for w in gathered[1:])], 0)
    several, wanted = decided
    if several:
        gathered = comm.all_gather(mine)
    return gathered, several, _Told(comm, wanted and not several)


def finish_or_redo(p: PreparedSave, staged: Union[Snapshot, BaseException], comm: Communicator):
    """:func:`finish_collective`; in one process, an incremental save that was committed
    referring to bytes found damaged meanwhile (:class:`~uckpt.errors.DamagedBaseError`,
    raised by ``on_commit``) is saved again over itself, from the same ``staged`` data;
    ``p.baseline()`` gives nothing to refer to then. Several ranks raise it."""
    try:
        return finish_collective(p, staged, comm)
    except DamagedBaseError as e:
        if comm.size > 1 or isinstance(staged, BaseException):
            raise
        log.warning("%s; saving it again, in full", e)
        again = prepare_collective(p.store, p.name, staged.flat, comm, step=p.step,
                                   metadata=p.metadata, overwrite=True, what=p.what,
                                   options=p.options, baseline=p.baseline,
                                   on_commit=p.on_commit)
        return finish_collective(again, staged, comm)


def _compact(c: Chunk) -> tuple:
    """What a rank tells the others of one of its chunks (its box is in the plan)."""
    return (c.file, c.offset, c.length, c.codec, c.checksum, c.hash, c.base)


def _chunk(it, c: tuple) -> Chunk:
    file, offset, length, codec, checksum, content, base = c
    # (the pipeline may arrive as a list: a communicator may send objects as JSON)
    return Chunk(file, offset, length, it.start, it.shape, tuple(codec), checksum, content,
                 base)


def check_bases(store: Store, name: str, baseline: Baseline) -> None:
    """Refuse an incremental save whose references would not resolve: every checkpoint
    holding chunks of ``baseline`` must be a committed sibling, other than ``name``."""
    for holder in sorted(baseline.holders()):
        if holder == name:
            raise CheckpointExistsError(
                f"{str(store.location(name))!r} cannot be saved over its own base",
                path=str(store.location(name)),
                hint="save to a new name, or save in full (no base) to overwrite")
        if not store.has(holder):
            raise CheckpointNotFoundError(
                f"the base checkpoint {str(store.location(holder))!r} of the incremental "
                f"save to {str(store.location(name))!r} is not committed", path=str(
                    store.location(holder)),
                hint="save in full, or give a committed checkpoint of the same root as base")


def submit_async_share(saver, prepared: PreparedSave, comm: Communicator, background: Communicator,
                       description: str, then: Optional[Callable[[Any], Any]] = None,
                       failed: Optional[Callable[[], None]] = None, guard=None):
    """Snapshot this rank's share of a prepared save into ``saver``'s staging memory and
    finish the save (write, commit, then ``then(location)``; ``failed()`` if it raised)
    in the background over ``background``; returns the
    :class:`~uckpt.saving.engine.SaveHandle`. ``guard``: see :mod:`uckpt.saving.late`."""
    def job(staged):
        try:
            path = finish_or_redo(prepared, staged, background)
        except BaseException:
            if failed is not None:
                failed()
            raise
        return then(path) if then is not None else path

    gp = prepared.plan
    try:
        return submit_collective(saver, prepared.flat, job, description,
                                 make_snapshot=lambda pool: snapshot_share(
                                     prepared.flat, gp.plan, comm.rank, gp.starts, pool, guard))
    except BaseException:
        if comm.size == 1:  # no background job ran: nothing else removes the sink
            prepared.sink.abort()
        raise


def copy_collective(src: Store, dst: Store, name: str, comm: Communicator,
                    verify: bool = True, compression: Optional[Compression] = None,
                    alignment: int = DEFAULT.alignment):
    """Collective: copy committed checkpoint ``name`` of ``src`` (each rank's replica of it)
    to ``dst``; returns its location there, or None if it was already committed there.

    Every rank copies the data files it wrote (the manifest's ``files[...].rank``; in one
    process, every file) and checks every chunk of them read back from ``dst``; then the
    lowest rank of each replica of ``dst`` commits, with the source's manifest bytes. With
    ``compression``, raw chunks are compressed on the way (:mod:`uckpt.saving.recode`; arrays
    start at multiples of ``alignment`` in the new files) and the
    manifest committed is the source's with the new chunks. References to bases (an
    incremental checkpoint) always point at the bases' chunks as ``dst`` holds them
    (same content hash, checked), where the bases must be committed already.
    """
    what = f"copy of {str(src.location(name))!r} to {str(dst.location(name))!r}"
    where = dst.location(name)
    start = time.perf_counter()
    opened: Dict[str, CheckpointSink] = {}

    def plan() -> Dict[str, Any]:
        if comm.rank == 0:
            if dst.has(name):
                return {"skip": True}
            try:
                opened["sink"] = dst.sink(name, False, shared=comm.size > 1)
            except BaseException as e:
                raise_save_failure(e, what, where)
            return {"token": opened["sink"].token}
        return {}

    try:
        gathered = comm.gather_outcomes(plan, f"{what} (planning)")
    except BaseException:
        if "sink" in opened:
            opened["sink"].abort()
        raise
    if gathered[0].get("skip"):
        return None
    sink = opened.get("sink") or dst.join_sink(name, gathered[0]["token"])
    found: Dict[str, Any] = {}  # the source's manifest (bytes, step), bytes copied here

    def copy() -> Dict[str, Any]:
        try:
            replica = sink.replica()
            with src.source(name) as source:  # this rank's replica of the source (node-local)
                data = source.manifest_bytes()
                manifest = manifest_io.read(source, data)
                found.update(data=data, step=manifest.step, manifest=manifest,
                             parts=[(e.file, manifest_io.part_bytes(source, e))
                                    for e in manifest.parts])
                mine = [f.name for f in manifest.files.values()
                        if comm.size == 1 or f.rank == comm.rank]
                recoded = None
                if compression is not None or manifest.bases:
                    found["bases"] = target_bases(dst, manifest)  # copied before (manager)
                if compression is not None:
                    recoded = recode_files(source, manifest, mine, sink, compression,
                                           alignment)
                else:
                    for n in mine:
                        sink.copy_file(source, n, manifest.files[n].size)
                    if manifest.bases:  # files as they are; references re-pointed at the
                        # bases as the target holds them (a tier that once compressed them
                        # stores them differently from the source)
                        recoded = {"chunks": [], "sizes": []}
            found["nbytes"] = sum(manifest.files[n].size for n in mine)
        except BaseException as e:
            raise_save_failure(e, what, where)
        if verify:
            checked = time.perf_counter()
            written = manifest if recoded is None else \
                recoded_manifest(manifest, [recoded], found["bases"])
            with CheckpointReader(sink.written(written), manifest=written) as copied:
                verified = copied.verify(files=set(mine))
            log.info("verified the copy of step %s at %s: %d bytes of chunks read back "
                     "intact, %.3f s", manifest.step, where, verified,
                     time.perf_counter() - checked)
        return {"replica": replica, "recoded": recoded}

    try:
        copied = comm.gather_outcomes(copy, f"{what} (copying)")
        replicas = [c["replica"] for c in copied]
        if copied[0]["recoded"] is not None:  # every rank's new chunks, in one manifest
            found["data"], found["parts"] = encode_manifest_files(recoded_manifest(
                found["manifest"], [c["recoded"] for c in copied], found["bases"]))

        def commit() -> bool:
            if replicas.index(replicas[comm.rank]) != comm.rank:
                return True
            try:
                manifest_io.write_parts(sink, found["parts"])
                sink.commit(found["data"], False)
            except CheckpointExistsError:  # another copy committed it first: done
                sink.abort()
                return False
            except BaseException as e:
                raise_save_failure(e, f"{what} (commit)", where)
            log.info("copied step %s to %s: %d bytes, %.3f s (durable there now)",
                     found["step"], where, found["nbytes"], time.perf_counter() - start)
            return True

        done = comm.gather_outcomes(commit, f"{what} (commit)")
    except BaseException:
        sink.abort()
        raise
    sink.release()
    return where if all(done) else None
