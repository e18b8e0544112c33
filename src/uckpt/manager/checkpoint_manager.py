"""CheckpointManager: numbered checkpoints on one or more storage tiers.

Layout: every tier root holds ``step_00000042/`` per committed checkpoint (see
docs/format.md). Saves commit to the first tier; checkpoints are then copied,
in the background, to the other tiers (durable storage), verified there, and
only then count as durable there. Each tier has its own retention policy.

Call order, from one process: ``should_save`` / ``save`` / ``restore`` /
``steps`` in any order, then ``close`` (or use ``with``). With
``async_save=True``, ``save`` returns once the state is snapshotted to host
memory; ``wait`` blocks until every save and copy so far is done. An error from
background work is raised by the next ``save``, ``wait`` or ``close``.

Who may open a root for what (docs/architecture.md, "A root shared by many
processes"): one writer job and any number of readers at once. A manager is a
reader until its first ``save`` (``role="auto"``), when it takes the root's
writer lock and removes what dead saves left; a reader never creates, renames or
deletes anything, so evaluation jobs may open managers on a training job's root
at any time.
"""
from __future__ import annotations

import atexit
import datetime as _dt
import logging
import os
import threading
import time
import warnings
import weakref
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from . import node_copies, rollback as _rollback
from ..loading.cast import Cast
from ..loading.collective import damage_behind, load_from
from ..loading.report import LoadReport
from ..saving.commit import check_metadata
from ..saving.committed import Committed
from ..saving.collective import (copy_collective, flatten_shared, prepare_collective,
                                 save_collective, submit_async_share)
from ..comm import get_communicator
from .costs import CostRecorder
from ..saving.engine import AsyncSaver, SaveHandle, SerialRunner
from ..errors import (CheckpointExistsError, CheckpointNotFoundError, CorruptCheckpointError,
                      DistributedError, ManifestError, MemoryLimitError, NotACheckpointError,
                      StorageError, UckptError)
from ..storage.claims import check_leases, check_roots, claim_roots
from .options import AsyncOptions, IncrementalOptions, RetentionOptions, manager_options
from ..options import SaveOptions
from ..saving.plan_cache import PlanCache
from .levels import placed, retention_of
from .redundant_level import redundant_level
from .policies import CheckpointInfo, Never, SavePolicy
from ..runtime.nodes import Nodes, node_name
from ..format import Manifest
from ..runtime.gcpause import pausing
from ..saving.incremental import Baseline
from ..loading.reader import read_manifest
from ..saving.reverify import Verifier
from ..storage import local_path
from ..storage.base import step_dir_name, step_of
from .tiers import Tier, as_tier

# what makes restore() fall back to another copy or an older checkpoint; state mismatches do not
_DAMAGE = (CorruptCheckpointError, ManifestError, CheckpointNotFoundError, NotACheckpointError)
_open_managers: "weakref.WeakSet[CheckpointManager]" = weakref.WeakSet()
log = logging.getLogger("uckpt.manager.checkpoint_manager")
_ROLES = ("auto", "writer", "reader")


class CheckpointManager:
    """Saves numbered checkpoints and restores the newest one that reads back intact.

    root / tiers
        ``root`` is one directory; or give ``tiers=[fast, durable, ...]`` (paths
        or :class:`uckpt.Tier`) instead: saves commit to ``tiers[0]`` and are
        copied to the others in the background.
    save_options, retention, async_save, incremental
        the settings in groups (:mod:`uckpt.manager.options`):
        ``save_options=uckpt.SaveOptions(...)`` (layout and compression of saves),
        ``retention=uckpt.RetentionOptions(keep=..., durable_every=...)``,
        ``async_save=uckpt.AsyncOptions(max_inflight=..., late_snapshot=...)`` (or True),
        ``incremental=uckpt.IncrementalOptions(full_every=..., reverify_every=...)`` (or
        True). The flat keywords below are shorthands for their fields; a shorthand and
        its group given together raise :class:`~uckpt.errors.OptionsError`.
    keep_last / keep
        default retention of every tier without its own (``Tier(keep=...)``):
        ``keep_last=n`` keeps the newest n; ``keep`` takes a policy, a list of
        them, or an int (see :mod:`uckpt.manager.policies`). Default: keep all. The
        newest checkpoint of a tier, and one still being copied, are never
        deleted.
    durable_every
        copy only every k-th saved checkpoint to the durable tiers.
    save_policy
        when :meth:`should_save` says yes (e.g. ``EveryNSteps(100) |
        OnSignal()``). After the save that follows a preemption signal, ``save``
        waits for it to be committed and copied, closes the manager and raises
        ``SystemExit(0)``.
    async_save, max_inflight
        snapshot and return; at most ``max_inflight`` snapshots held in host
        memory (a further ``save`` waits for the oldest to be written).
    late_snapshot
        with ``async_save``: a late-copy guard (:mod:`uckpt.saving.late`), e.g.
        ``uckpt.torch.LateSnapshot(optimizer)``: the arrays it covers (parameters,
        optimizer state) are copied while training goes on, at the latest just
        before the next optimizer step, instead of inside ``save``.
    compression, compression_level
        default of every tier without its own (``Tier(compression=...)``):
        ``"zstd"`` compresses chunks (see :func:`uckpt.save`). The usual setup is
        ``tiers=["/local/nvme/run1", uckpt.Tier("/shared/run1", compression="zstd")]``:
        saves stay raw (fast), copies to the durable tier are compressed on the way.
    storage_options
        options of the ``s3://`` tiers without their own (``Tier(...,
        storage_options=...)``): ``endpoint_url``, ``key``, ``secret``, ... (see
        :class:`uckpt.storage.s3.S3Options`); credentials left out come from the
        standard AWS environment variables and files.
    comm
        the ranks that save together (see :func:`uckpt.save`; None detects
        MPI or torch.distributed). With more than one rank, construction,
        ``save`` and ``restore`` are collective: call them on every rank in the
        same order. Each rank writes its part; a tier may be node-local (each
        node's copy holds that node's files) or shared; copies to the durable
        tiers are made by every rank for its own files.
    role
        ``"auto"`` (default): a reader until the first ``save``, which makes this
        manager the writer of its tiers. ``"writer"``: become the writer now (fails
        at once if another job writes there). ``"reader"``: never write; ``save``
        raises. Becoming the writer takes ``<tier>/.uckpt-writer.lock``
        (:class:`~uckpt.errors.RootLockedError`, naming the holder's host and pid,
        if another job holds it) and removes the debris of dead saves (never a
        live save's). On an ``s3://`` tier the lock holds a lease
        (``knobs.lock_lease_s``) that the writer renews in the background: a new
        writer waits at most the rest of a holder's lease and takes it over if it
        was not renewed (its holder died), and a writer that lost its lease raises
        :class:`~uckpt.errors.WriterLeaseLostError` at its next save. With
        ``"auto"``, construction reads (never takes) an ``s3://`` tier's lock and
        logs a warning naming a live writer. Readers never create, rename or
        delete anything: they see only committed checkpoints, and a ``restore``
        that races with the writer's retention falls back to the next checkpoint.
    concurrent_writers
        opt in to sharing the tiers with other writers that opted in too (each
        must save different steps; retention of each applies to every step of
        the root). An exclusive writer and a concurrent one refuse each other, so
        this is no way past an exclusive writer's lock. Only its own saves count for
        ``on_rollback``.
    incremental, full_every
        with ``incremental=True`` a save writes only the chunks whose content hash
        differs from this manager's previous save (held in memory), and refers to the
        others where they already are (docs/format.md section 11.4); arrays are cut into
        slabs of ``SaveOptions.incremental_chunk_bytes``. Every ``full_every``-th save (and
        the first of a manager, and an overwrite) writes everything. Retention never
        deletes a checkpoint that a kept one refers to, and deletes newest first;
        copies to durable tiers bring the checkpoints they refer to along.
    reverify_every
        with ``incremental=True`` a save refers only to chunks that were read back from
        the storage medium (O_DIRECT, or after the page cache dropped them) and matched
        their checksums, on a background thread after the save that wrote them was
        committed; a base is read again, on a background thread at idle I/O priority,
        once every ``reverify_every`` saves that refer to it (default 10). Damage found
        is logged at WARNING with every committed step that refers to it, and the next
        save writes in full. Left at risk: the saves that refer to a chunk damaged after
        its last read, until the next read finds it (at most ``reverify_every`` saves,
        plus those committed while that read runs); restore falls back past them
        (docs/architecture.md, "Incremental saves refer only to verified bytes").
    on_rollback
        what a ``save`` whose step is not above the newest step of the root (any
        tier) does: retention ranks by step and would delete it, and a restart would
        resume the newer, abandoned steps. ``"refuse"`` (default): it raises
        :class:`~uckpt.errors.StepOrderError` before anything is written (the newest
        step itself: ``CheckpointExistsError`` unless ``overwrite``). ``"archive"``:
        it first does ``rollback(to=step - 1)`` (``to=step`` with ``overwrite``).
        :meth:`rollback` moves the newer steps of every tier into an archive under
        the root (``rollback_0001/``; :meth:`archived`), kept whole but out of
        ``restore``, ``steps``, ``uckpt ls`` and retention; a rollback a kill
        interrupted is finished by the next writer, and readers never see it half
        done (docs/architecture.md, "Rollbacks").

    node
        this rank's node name (default: ``$UCKPT_NODE``, else the host name), put
        in place of ``{node}`` in tier paths: ``tiers=[uckpt.Tier("shm://run1-{node}",
        keep=1), "/shared/run1"]``. A tier ``shm://NAME`` is the memory level: a
        directory in the node's shared memory, bounded by its ``keep`` (default 1;
        docs/levels.md).

    A tier may be an ``s3://bucket/prefix`` URL of an S3-compatible object store
    (``pip install 'uckpt[s3]'``), e.g. ``tiers=["/local/nvme/run1",
    "s3://bucket/run1"]``: saves commit to the local tier and are uploaded, verified
    and committed to the bucket in the background (docs/architecture.md).
    """

    def __init__(self, root=None, *,
                 tiers: Optional[Sequence[Union[str, os.PathLike, Tier]]] = None,
                 save_options: Optional[SaveOptions] = None,
                 retention: Optional[RetentionOptions] = None,
                 async_save: Union[bool, AsyncOptions] = False,
                 incremental: Union[bool, IncrementalOptions] = False,
                 save_policy: Optional[SavePolicy] = None, comm: Any = None,
                 role: str = "auto", concurrent_writers: bool = False,
                 storage_options: Optional[Mapping[str, Any]] = None,
                 on_rollback: str = "refuse",
                 keep_last: Optional[int] = None, keep: Any = None,
                 durable_every: Optional[int] = None, max_inflight: Optional[int] = None,
                 late_snapshot: Any = None, compression: Optional[str] = None,
                 compression_level: Optional[int] = None, full_every: Optional[int] = None,
                 reverify_every: Optional[int] = None, node: Optional[str] = None) -> None:
        if (root is None) == (tiers is None):
            raise ValueError("give either root or tiers=[fast, durable, ...], not both or neither")
        self.options = o = manager_options(
            save_options=save_options, retention=retention, keep_last=keep_last, keep=keep,
            durable_every=durable_every, async_save=async_save, max_inflight=max_inflight,
            late_snapshot=late_snapshot, compression=compression,
            compression_level=compression_level, incremental=incremental,
            full_every=full_every, reverify_every=reverify_every,
            concurrent_writers=concurrent_writers)
        self.late_snapshot = o.async_save.late_snapshot if o.async_save else None
        if role not in _ROLES:
            raise ValueError(f"role must be one of {', '.join(map(repr, _ROLES))}, got {role!r}")
        self.compression = o.save.codec
        self.on_rollback = _rollback.check_mode(on_rollback)
        self._newest = -1  # the newest step of the live line (known once a writer)
        self.role = role
        self.concurrent_writers = bool(concurrent_writers)
        self._locks: List[Any] = []
        self.comm = get_communicator(comm)
        #: which ranks share a node (one all-gather of the node names)
        self.nodes = Nodes.gather(self.comm, node_name(node))
        self.tiers: List[Tier] = [placed(as_tier(t, storage_options), self.nodes)
                                  for t in (tiers if tiers is not None else [root])]
        if not self.tiers:
            raise ValueError("tiers must name at least one directory")
        self._retention = [retention_of(t, o.retention.keep) for t in self.tiers]
        #: the first tier's redundancy across nodes (uckpt.manager.redundant_level)
        self._redundant = redundant_level(self.tiers, self.nodes, o.incremental is not None)
        # one retention pass per tier at a time; tiers apart, so that the local tier's
        # (run by a save, before its staging memory is released) never waits for an
        # object store's listing and deletions
        self._retaining = [threading.Lock() for _ in self.tiers]
        self.root = self.tiers[0].path
        self.keep_last = keep_last
        self.durable_every = o.retention.durable_every
        self.save_policy: SavePolicy = save_policy if save_policy is not None else Never()
        distributed = self.comm.size > 1
        self._saver = AsyncSaver(o.async_save.max_inflight, "uckpt-save") if o.async_save \
            else None
        self._flusher = SerialRunner("uckpt-flush")
        # background threads talk over communicators of their own (collective to make)
        self._save_comm = self.comm.duplicate() if distributed and self._saver else self.comm
        self._copy_comm = (self.comm.duplicate() if distributed and len(self.tiers) > 1
                           else self.comm)
        self._pending: List[SaveHandle] = []
        self._pins: Dict[int, int] = {}  # steps on tier 0 still to be copied -> count
        self._info_cache: Dict[tuple, CheckpointInfo] = {}
        self._nbytes: Dict[tuple, int] = {}  # (tier, step) -> bytes of its data files
        self._lock = threading.RLock()  # pins and pending handles
        self._saves = 0
        self._plans = PlanCache()  # the last save's plan, reused while the structure holds
        self.incremental = o.incremental is not None
        self.full_every = (o.incremental or IncrementalOptions()).full_every
        self._baseline: Optional[Baseline] = None  # chunks of this manager's last save
        self._chain = 0  # incremental saves since the last full one
        # which chunks of this rank the next save may refer to (read back, re-read)
        self._verifier = Verifier(self.tiers[0].store, self.comm.rank,
                                  o.incremental.reverify_every,
                                  step_dir_name) if o.incremental else None
        self._bases: Dict[tuple, Optional[List[int]]] = {}  # (tier, step) -> steps it refers to
        self._exit_agreed = False  # several ranks: some rank's policy asked to exit
        self._closed = False
        # rank 0 records what saves cost beside a local first tier (uckpt.manager.costs)
        self._costs = CostRecorder(local_path(self.root) if self.comm.rank == 0 else None)
        self._tell_policy_costs()
        _open_managers.add(self)
        if role == "writer":
            self._become_writer()
        elif role == "auto":  # a writer of an object store root is named now, not at a save
            check_roots([t.store for t in self.tiers], self.comm)

    # -- context manager ---------------------------------------------------------------------
    def __enter__(self) -> "CheckpointManager":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Finish every save and copy; raise the first background error, if any."""
        if self._closed:
            return
        try:
            self.wait()
        finally:
            self._closed = True
            self.save_policy.close()
            if self._verifier is not None:
                self._verifier.close()
            _open_managers.discard(self)
            for lock in self._locks:
                lock.release()

    @property
    def is_writer(self) -> bool:
        """Whether this manager holds its tiers as their writer (see ``role``)."""
        return bool(self._locks)

    def _become_writer(self) -> None:
        """Collective: take every tier's writer lock, then remove dead saves' debris; later
        calls check that no lock's lease was lost."""
        if self._locks:
            check_leases(self._locks, self.comm)
            return
        if self.role == "reader":
            raise PermissionError("this CheckpointManager was opened with role='reader': it "
                                  "never writes; open one with role='auto' or 'writer' to save")
        self._locks = claim_roots([t.store for t in self.tiers], self.comm,
                                  self.concurrent_writers)
        for tier in self.tiers:
            if tier.store.acts_here(self.comm.rank):
                tier.store.remove_debris()
        self._costs.remove_debris()
        if self.comm.size > 1:  # no rank may start a save while another still removes debris
            self.comm.barrier()
        node_copies.drop_partial(self)  # steps committed on some nodes' copies only
        _rollback.resume(self)  # finishes a rollback a killed writer left

    def wait(self) -> None:
        """Block until every save and copy so far is done; raise a background error."""
        if self._saver is not None:
            self._saver.join()
        self._flusher.join()
        self._raise_background_errors()

    # -- queries -----------------------------------------------------------------------------
    def path(self, step: int, tier: int = 0, archive: Optional[str] = None) -> Union[Path, str]:
        """Where checkpoint ``step`` is (or would be) on ``tier``: a Path, or a URL;
        ``archive``: in that archive of rolled-back steps (see :meth:`archived`)."""
        store = self.tiers[tier].store
        return (store.within(archive) if archive else store).location(step_dir_name(step))

    def steps(self) -> List[int]:
        """Steps of the live line committed on any tier, oldest first (archived ones:
        :meth:`archived`)."""
        return sorted({s for t in self.tiers for s in t.store.steps()})

    def latest_step(self) -> Optional[int]:
        steps = self.steps()
        return steps[-1] if steps else None

    def tiers_of(self, step: int) -> List[str]:
        """Names of the tiers holding a committed copy of ``step``."""
        return [t.name for t in self.tiers if t.store.has(step_dir_name(step))]

    def manifest(self, step: int, tier: Optional[int] = None) -> Manifest:
        """The validated manifest of checkpoint ``step`` on ``tier`` (default: the first
        tier holding a readable one); raises the first tier's error if none does."""
        error: Optional[UckptError] = None
        for i in [tier] if tier is not None else range(len(self.tiers)):
            try:
                return read_manifest(self.tiers[i].store.source(step_dir_name(step)))
            except UckptError as e:
                error = error or e
        assert error is not None
        raise error

    def should_save(self, step: int) -> bool:
        """Whether the save policy asks for a checkpoint at ``step``.

        With several ranks and a policy that does not depend on the step alone
        (``EveryNSeconds``, ``OnSignal``), this is collective: the ranks agree (one
        small all-gather) to save, and to exit after the save, if any rank wants to,
        so that a signal delivered to one rank stops every rank at the same step.
        """
        want = self.save_policy.should_save(step, time.monotonic())
        if self.comm.size == 1 or self.save_policy.step_determined:
            return want
        votes = self.comm.all_gather([bool(want), bool(self.save_policy.pending_exit)])
        self._exit_agreed = any(exit_ for _, exit_ in votes)
        return any(w for w, _ in votes)

    # -- save --------------------------------------------------------------------------------
    @pausing
    def save(self, step: int, state: Mapping[str, Any], *,
             metadata: Optional[Dict[str, Any]] = None,
             metrics: Optional[Dict[str, float]] = None, overwrite: bool = False
             ) -> Union[Path, str, SaveHandle]:
        """Save ``state`` as checkpoint ``step``; refuses an existing step unless ``overwrite``.

        ``metrics`` (numbers, e.g. ``{"val_loss": 0.31}``) are stored in the
        metadata under ``"metrics"`` and used by ``KeepBest``. Returns the path,
        or a :class:`~uckpt.saving.engine.SaveHandle` with ``async_save``.

        With several ranks this is collective; the checkpoint's metadata and
        metrics are rank 0's. Whether to exit after the save (``OnSignal``) is
        what the ranks agreed on in the latest ``should_save``.
        """
        self._check_open()
        self._raise_background_errors()
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"step must be a non-negative int, got {step!r}")
        meta = dict(metadata or {})
        if metrics is not None:
            bad = {k: v for k, v in dict(metrics).items()
                   if not isinstance(k, str) or isinstance(v, bool)
                   or not isinstance(v, (int, float))}
            if bad:
                raise ValueError(f"metrics must map names to numbers, got {bad!r}")
            meta["metrics"] = {k: float(v) for k, v in metrics.items()}
        check_metadata(meta)
        self._become_writer()
        _rollback.before_save(self, step, overwrite)
        # one path for any number of ranks; with several, an error before the save is told
        # to the other ranks (in one process it is raised here, before anything is written)
        flat = flatten_shared(state, self.comm)
        self._saves += 1
        copy = len(self.tiers) > 1 and self._saves % self.durable_every == 0
        if copy:
            self._pin(step)
        self._costs.started(step, self._saver is not None,
                            "copy" if copy else "commit" if len(self.tiers) == 1 else "never")

        def committed(path):
            self._costs.committed(step)
            if copy:
                self._schedule_copy(step)
            self._retain(0)
            return path

        # several ranks: the same on every rank (should_save agreed on it)
        exiting = self._exit_agreed if self.comm.size > 1 else self.save_policy.pending_exit
        store, name, what = self.tiers[0].store, step_dir_name(step), f"save of step {step}"
        retains = store.acts_here(self.comm.rank)
        options: Dict[str, Any] = dict(
            options=self.options.save.compressed(self.tiers[0].codec(self.compression)),
            cache=self._plans)
        if self._redundant is not None:
            options.update(protect=self._redundant.protect)
        if retains:  # retention learns of the new checkpoint without parsing it back
            options.update(on_commit=lambda c: self._learn(0, step, c))
        if self.incremental:
            if overwrite:
                self._refuse_overwriting_a_base(step)

            def on_commit(c: Committed) -> None:
                if retains:
                    self._learn(0, step, c)
                assert c.manifest is not None  # (an incremental save: every rank has it)
                self._committed_baseline(c.manifest, name)

            options.update(baseline=lambda: self._next_baseline(overwrite), on_commit=on_commit)
        try:
            if self._saver is not None and not exiting:
                prepared = prepare_collective(store, name, flat, self.comm, step=step,
                                              metadata=meta, overwrite=overwrite, what=what,
                                              **options)
                result: Union[Path, str, SaveHandle] = self._track(submit_async_share(
                    self._saver, prepared, self.comm, self._save_comm, what,
                    then=committed, failed=(lambda: self._unpin(step)) if copy else None,
                    guard=self.late_snapshot))
            else:
                if self._saver is not None:
                    self._saver.join()  # the final save follows the ones in flight
                result = committed(save_collective(store, name, flat, self.comm, step=step,
                                                   metadata=meta, overwrite=overwrite,
                                                   what=what, **options))
        except BaseException:
            if copy:
                self._unpin(step)
            raise
        self._costs.stalled(step)
        self.save_policy.saved(step, time.monotonic())
        self._tell_policy_costs()
        if exiting:
            self._exit_after_final_save(step)
        return result

    def rollback(self, to: int) -> List[int]:
        """Take every step above ``to`` off the live line, on every tier, and keep it in an
        archive of the root (see ``on_rollback``); returns those steps (oldest first).
        Collective with several ranks; makes this manager the writer."""
        if not isinstance(to, int) or isinstance(to, bool) or to < 0:
            raise ValueError(f"to must be a step (an int >= 0), got {to!r}")
        self._check_open()
        self.wait()
        self._become_writer()
        return _rollback.roll_back(self, to)

    def archived(self) -> Dict[str, List[int]]:
        """The archives of rolled-back steps: ``{"rollback_0001": [8, 9, 10], ...}``; each is
        a root of its own, ``self.path(step, archive=...)`` a checkpoint in it."""
        return _rollback.archived(self)

    def save_costs(self):
        """Medians of what recent saves cost (:class:`uckpt.manager.costs.CostSummary`: stall,
        time to commit, time to durable, in seconds), or None before any was measured."""
        return self._costs.summary()

    def _tell_policy_costs(self) -> None:
        summary = self._costs.summary()
        if summary is not None:
            self.save_policy.measured(summary.stall, summary.durable)

    # -- incremental saves ------------------------------------------------------------------
    def _next_baseline(self, overwrite: bool) -> Baseline:
        """What the save being written compares with (runs when it writes, after the
        saves before it committed): the last save's verified chunks, or nothing (a full
        save)."""
        full = self._baseline is None or overwrite or self._chain + 1 >= self.full_every
        assert self._verifier is not None
        return self._verifier.usable(None if full else self._baseline)

    def _committed_baseline(self, manifest: Manifest, name: str) -> None:
        self._chain = self._chain + 1 if manifest.bases else 0
        self._baseline = Baseline.of(manifest, name)
        assert self._verifier is not None
        self._verifier.committed(manifest, name)  # raises if it refers to damage found

    def _refuse_overwriting_a_base(self, step: int) -> None:
        store = self.tiers[0].store
        for s in store.steps():
            if s > step and step in (self._bases_of(0, s) or ()):
                raise CheckpointExistsError(
                    f"step {step} cannot be overwritten: step {s} refers to its data "
                    f"({self.path(s)})", path=str(self.path(step)),
                    hint="save under a new step, or delete the checkpoints that refer to it")

    def _bases_of(self, tier: int, step: int) -> Optional[List[int]]:
        """The steps checkpoint ``step`` of ``tier`` refers to (None: its manifest cannot
        be read, so nothing older is safe to delete)."""
        key = (tier, step)
        if key not in self._bases:
            try:
                self._learn(tier, step, Committed.of(self.manifest(step, tier)))
            except UckptError:
                return None  # not cached: it may read back later
        return self._bases[key]

    def _exit_after_final_save(self, step: int) -> None:
        self.close()  # the final checkpoint is committed and copied before we leave
        log.warning("uckpt: saved step %d after a preemption signal; exiting", step)
        raise SystemExit(0)

    # -- restore -----------------------------------------------------------------------------
    def restore(self, state: Mapping[str, Any], step: Optional[int] = None, *,
                strict: bool = True, max_bytes: Optional[int] = None, cast: Cast = None,
                report: Optional[LoadReport] = None,
                select: Optional[Union[str, Sequence[str]]] = None,
                cooperative: Any = None) -> Optional[int]:
        """Restore ``state`` in place; returns the step restored, or None if there is none.

        With ``step=None`` the newest checkpoint that reads back intact is
        used, the first tier's copy first; damaged copies are skipped with a
        warning naming them and why. State mismatches are raised, not skipped.

        ``max_bytes``: as for :func:`uckpt.load`, the most bytes of new arrays a restore
        allocates (arrays of ``state`` are filled in place). A checkpoint refused for
        memory (:class:`~uckpt.errors.MemoryLimitError`) is verified, streaming: if it is
        damaged (a hostile manifest declaring more than its frames hold), it is skipped
        like any damaged copy; if it is intact, it is genuinely too large for this
        process, and the MemoryLimitError is raised (an older checkpoint is not silently
        restored instead).

        ``strict``, ``cast``, ``report`` and ``cooperative`` as for :func:`uckpt.load`:
        ``report`` holds the keys skipped by the load of the step restored and the bytes it
        read; ranks share reads per node as this manager names them (``node=``).
        ``select``: restore only the leaves these glob patterns pick, reading only their
        chunks, and leave the rest of ``state`` untouched (as for :func:`uckpt.load`).
        """
        self._check_open()
        self.wait()

        def available() -> Dict[str, List[int]]:  # this rank's view: step -> tiers
            # (as -1 - tier where this rank's copy lacks other nodes' files: node-local)
            out: Dict[str, List[int]] = {}
            for i, tier in enumerate(self.tiers):
                try:
                    steps = tier.store.steps()
                except StorageError as e:
                    if len(self.tiers) == 1:
                        raise
                    warnings.warn(f"uckpt: tier {tier.name!r} ({tier.path}) cannot be listed, "
                                  f"restoring from the others: {e}", RuntimeWarning,
                                  stacklevel=3)
                    continue
                for s in steps:
                    if step is None or s == step:
                        whole = self.comm.size == 1 or _files_present(tier.store,
                                                                     step_dir_name(s))
                        out.setdefault(str(s), []).append(i if whole else -1 - i)
            return out

        # one path for any number of ranks: all ranks restore the same step, from the first
        # tier where every rank sees it committed, falling back together past damaged copies
        # and past node-local copies where some rank's node lacks what that rank reads
        views = self.comm.gather_outcomes(available, "restore (listing checkpoints)")
        if self._redundant is not None and self._redundant.rebuild_newest(self, views):
            views = self.comm.gather_outcomes(available, "restore (listing checkpoints)")
        partial = {(int(s), -1 - i) for v in views for s, tiers in v.items()
                   for i in tiers if i < 0}
        common = set.intersection(*({(int(s), max(i, -1 - i)) for s, tiers in v.items()
                                     for i in tiers} for v in views))
        lost = node_copies.lost_nodes([node_copies.held_of(v) for v in views], self.nodes,
                                      len(self.tiers)) if self.comm.size > 1 else {}
        node_copies.warn_lost(self, lost)
        failures, lacking = [], []
        todo = sorted(common, key=lambda c: (-c[0], c[1]))
        while todo:
            s, i = todo.pop(0)
            tier, name = self.tiers[i], step_dir_name(s)
            start = time.perf_counter()
            try:
                # both lambdas are called before the loop moves on
                load_from(lambda: tier.store.source(name), state, strict,  # noqa: B023
                          self.comm,
                          f"restore of step {s} from tier {tier.name!r}", max_bytes,
                          peers=(s, i) in partial, cast=cast, report=report,
                          select=select, cooperative=cooperative,
                          node=self.nodes.name)
            except (DistributedError, MemoryLimitError) + _DAMAGE as e:
                if isinstance(e, MemoryLimitError) or (isinstance(e, DistributedError) and
                                                       e.failed_with(MemoryLimitError)):
                    damage = damage_behind(lambda: tier.store.source(name),  # noqa: B023
                                           self.comm,
                                           f"verify of step {s}, refused for memory")
                    if damage is None:
                        raise  # intact, too large for this process: not damage
                    e = damage
                elif isinstance(e, DistributedError) and not e.failed_with(*_DAMAGE):
                    raise
                if (s, i) in partial and _lacks_file(e):
                    if i == 0 and self._redundant is not None and \
                            self._redundant.rebuild_damaged(self, s, "its ranks read data "
                                                            "files on no node's copy"):
                        todo.insert(0, (s, i))  # a gone node's share rebuilt: load it again
                        continue
                    lacking.append((s, tier.name, e))
                    log.info("step %d on tier %r: a node's copy lacks data files its ranks "
                             "read (node-local storage); trying the next copy", s, tier.name)
                    continue
                if i == 0 and self._redundant is not None and \
                        self._redundant.rebuild_damaged(self, s):
                    todo.insert(0, (s, i))  # rebuilt from redundancy: load it again
                    continue
                if not tier.store.has(name):  # retention deleted it meanwhile
                    log.info("step %d on tier %r was deleted while being restored; "
                             "trying the next one", s, tier.name)
                    continue
                warnings.warn(f"uckpt: skipping checkpoint step {s} on tier {tier.name!r} "
                              f"({self.path(s, i)}): {e}", RuntimeWarning, stacklevel=2)
                failures.append((s, tier.name, e))
                continue
            log.info("restored step %d from tier %r (%s), %.3f s", s, tier.name,
                     self.path(s, i), time.perf_counter() - start)
            return s
        if self._redundant is not None and self._redundant.lost is not None:
            # a share that its redundancy could not rebuild, and no tier to fall back to:
            # the error that names its node, ranks and step
            raise self._redundant.lost from (failures[0][2] if failures else None)
        if lost or lacking:
            raise node_copies.no_copy_error(self, lost, lacking) from (
                failures[0][2] if failures else lacking[0][2] if lacking else None)
        if failures:
            raise CorruptCheckpointError(
                f"no checkpoint under {', '.join(str(t.path) for t in self.tiers)} reads back "
                "intact" + (" on every rank" if self.comm.size > 1 else "") + ": " +
                "; ".join(f"step {s} on {t}: {type(e).__name__}" for s, t, e in failures),
                path=str(self.root)) from failures[0][2]
        if step is not None:
            raise CheckpointNotFoundError(
                f"no tier holds a committed checkpoint of step {step}"
                + (" that every rank can read" if self.comm.size > 1 else "")
                + f" (tiers: {', '.join(str(t.path) for t in self.tiers)})",
                path=str(self.path(step)))
        return None

    # -- background work ---------------------------------------------------------------------
    def _track(self, handle: SaveHandle) -> SaveHandle:
        with self._lock:
            self._pending.append(handle)
        return handle

    def _raise_background_errors(self) -> None:
        with self._lock:
            failed = [h for h in self._pending if h.done() and h.exception() is not None]
            self._pending = [h for h in self._pending if not h.done()]
        if failed:
            for other in failed[1:]:
                warnings.warn(f"uckpt: another background failure: {other!r}: "
                              f"{other.exception()}", RuntimeWarning, stacklevel=3)
            raise failed[0].exception()

    def _schedule_copy(self, step: int) -> None:
        def job():
            try:
                for i in range(1, len(self.tiers)):
                    self._copy_with_bases(i, step)
                    self._retain(i)
                self._costs.durable(step)
            finally:
                self._unpin(step)
                self._retain(0)
            return self.path(step, len(self.tiers) - 1)

        self._track(self._flusher.run(SaveHandle(f"copy of step {step} to the durable tier"), job))

    def _copy_with_bases(self, tier: int, step: int) -> None:
        """Copy ``step`` to ``tier``, after every checkpoint it refers to that is not
        committed there (recursively): a tier's checkpoints read from that tier alone."""
        for base in self._bases_of(0, step) or ():
            if not self.tiers[tier].store.has(step_dir_name(base)):
                self._copy_with_bases(tier, base)
        copy_collective(self.tiers[0].store, self.tiers[tier].store, step_dir_name(step),
                        self._copy_comm, compression=self.tiers[tier].codec(self.compression),
                        alignment=self.options.save.alignment)

    def _pin(self, step: int) -> None:
        with self._lock:
            self._pins[step] = self._pins.get(step, 0) + 1

    def _unpin(self, step: int) -> None:
        with self._lock:
            if step not in self._pins:  # a failed async save may unpin from both threads
                return
            self._pins[step] -= 1
            if not self._pins[step]:
                del self._pins[step]

    # -- retention ---------------------------------------------------------------------------
    def _info(self, tier: int, step: int) -> CheckpointInfo:
        key = (tier, step)
        if key not in self._info_cache:
            try:
                self._learn(tier, step, Committed.of(self.manifest(step, tier)))
            except UckptError:  # a damaged checkpoint has no metrics; retention may drop it
                self._info_cache[key] = CheckpointInfo(step=step, metrics={}, created=0.0)
        return self._info_cache[key]

    def _learn(self, tier: int, step: int, c: Committed) -> None:
        """Cache what retention needs of checkpoint ``step`` on ``tier`` from its facts
        (of its manifest read once, or of the save this manager just committed: never
        parsed back)."""
        key = (tier, step)
        self._nbytes[key] = c.nbytes
        metrics = c.metadata["metrics"] if isinstance(c.metadata.get("metrics"), dict) else {}
        try:
            created = _dt.datetime.strptime(c.created[:19], "%Y-%m-%dT%H:%M:%S").replace(
                tzinfo=_dt.timezone.utc).timestamp()
        except ValueError:
            created = 0.0
        self._info_cache[key] = CheckpointInfo(step=step, metrics=metrics, created=created)
        self._bases[key] = sorted(s for s in map(step_of, c.bases) if s is not None)

    def _retain(self, tier: int) -> None:
        store = self.tiers[tier].store
        if not store.acts_here(self.comm.rank):
            return  # every rank sees the same objects: rank 0 deletes for all
        # not under self._lock: listing and deleting in an object store take network round
        # trips, and save() must not wait for them (it takes self._lock to pin a step)
        with self._retaining[tier]:
            steps = store.steps()
            if not steps:
                return
            keep = self._retention[tier].keep([self._info(tier, s) for s in steps])
            keep |= {steps[-1]}  # never the newest
            if tier == 0:
                with self._lock:  # after the listing: a step listed was pinned before it
                    keep |= set(self._pins)  # never one still to be copied
                baseline = self._baseline  # never one the next save may refer to
                if baseline is not None:
                    keep |= {s for s in map(step_of, baseline.holders()) if s is not None}
            keep = self._with_bases(tier, steps, keep)
            for s in reversed(steps):  # newest first: bases outlive what refers to them
                if s not in keep:
                    self._delete(tier, s)

    def _with_bases(self, tier: int, steps: List[int], keep: set) -> set:
        """``keep`` and every checkpoint a kept one refers to; where a kept checkpoint's
        manifest cannot be read, every older one too."""
        keep = set(keep)
        todo = sorted(keep)
        while todo:
            s = todo.pop()
            bases = self._bases_of(tier, s) if s in steps else []
            if bases is None:
                older = {t for t in steps if t < s} - keep
                log.info("keeping steps %s on tier %r: step %d, which may refer to them, "
                         "cannot be read", sorted(older), self.tiers[tier].name, s)
            else:
                older = set(bases) - keep
            keep |= older
            todo.extend(older)
        return keep

    def _delete(self, tier: int, step: int) -> None:
        """Un-commit first (hide or delete the manifest), then delete the data: a crash
        never leaves a half-deleted checkpoint visible."""
        start = time.perf_counter()
        self._info_cache.pop((tier, step), None)
        self._bases.pop((tier, step), None)
        nbytes = self._nbytes.pop((tier, step), None)
        if not self.tiers[tier].store.delete(step_dir_name(step)):
            return  # another rank sharing this tier deleted it first
        log.info("deleted step %d from tier %r: not kept by its retention policy (%s bytes, "
                 "%.3f s)", step, self.tiers[tier].name, "?" if nbytes is None else nbytes,
                 time.perf_counter() - start)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this CheckpointManager is closed")

    def __repr__(self) -> str:
        tiers = ", ".join(f"{t.name}={str(t.path)!r}" for t in self.tiers)
        return f"CheckpointManager({tiers}, async_save={self._saver is not None})"


def _files_present(store, name: str) -> bool:
    """Whether this rank sees every data file of a committed checkpoint (a node-local
    tier holds only its node's files)."""
    try:
        files = list(read_manifest(store.source(name)).files)
    except UckptError:
        return True  # damaged: let the load report it and fall back
    return store.files_present(name, files)


def _lacks_file(e: BaseException) -> bool:
    """Whether ``e`` (on some rank) is a data file missing from its copy."""
    if isinstance(e, DistributedError):
        return e.failed_with(CheckpointNotFoundError)
    return isinstance(e, CheckpointNotFoundError)


@atexit.register
def _report_unclosed() -> None:
    """At exit, background work has finished (its threads are joined); say what failed,
    and give up the writer locks (an object store's lock object outlives the process)."""
    for manager in list(_open_managers):
        try:
            manager.wait()
        except BaseException as e:  # noqa: BLE001 - nobody is left to raise it to
            log.error("uckpt: a background save failed and was never reported: %s: %s",
                      type(e).__name__, e)
        finally:
            for lock in manager._locks:
                lock.release()
