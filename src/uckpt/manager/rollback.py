"""Rollbacks: what a ``CheckpointManager`` does with a save that is not above the newest
step of its root, and how the newer steps leave the live line without being lost.

Retention ranks checkpoints by step, so a save of step 6 on a root holding 8, 9 and 10
(training went back to step 5 and continues; or a second stage counts from 1 again)
would be deleted by its own retention, and a restart would resume step 10. The rule
(docs/architecture.md, "Rollbacks"):

* ``on_rollback="refuse"`` (default): such a save raises
  :class:`~uckpt.errors.StepOrderError` before anything is written;
* :meth:`CheckpointManager.rollback` ``(to=N)``, or ``on_rollback="archive"`` (done by
  such a save itself, with ``to`` = its step, less one unless it overwrites): the steps
  above N, on every tier, move into an archive of the root
  (:mod:`uckpt.storage.archive`), kept whole but out of ``restore``, ``steps``,
  ``uckpt ls`` and retention; the next save starts a new incremental chain.

A rollback first writes its intent record on every tier where steps move, then moves
them, then removes the records; a writer that finds a record (a rollback killed midway)
finishes it before anything else, and readers never see the steps it names.
"""
from __future__ import annotations

import logging
from typing import Dict, List

from ..errors import StepOrderError, UckptError
from ..loading.reader import read_manifest
from ..storage.archive import ARCHIVE_NAME, INTENT_NAME, archive_name, decode_intent, encode_intent
from ..storage.base import step_dir_name, step_of

log = logging.getLogger("uckpt.manager.rollback")
MODES = ("refuse", "archive")


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"on_rollback must be one of {', '.join(map(repr, MODES))}, "
                         f"got {mode!r}")
    return mode


def newest(m) -> int:
    """Collective: the newest step of the live line on any tier of any rank, -1 if none;
    with ``concurrent_writers``, the newest of this manager's own saves (the steps of the
    other writers are theirs: they save steps of their own, between these)."""
    if m.concurrent_writers:
        return m._newest
    mine = max((s for t in m.tiers for s in t.store.steps()), default=-1)
    return max(m.comm.all_gather(mine)) if m.comm.size > 1 else mine


def resume(m) -> None:
    """Collective, when ``m`` becomes the writer: finish the rollbacks a killed writer left
    half done (before this writer saves anything), then learn the newest step."""
    for tier in m.tiers:
        if tier.store.acts_here(m.comm.rank):
            record = _intent(tier)
            if record is not None:
                log.warning("finishing a rollback to step %d that was interrupted on tier %r: "
                            "moving steps %s into %s", record["to"], tier.name, record["steps"],
                            tier.store.location(record["archive"]))
                _finish(tier, record)
    if m.comm.size > 1:
        m.comm.barrier()
    m._newest = newest(m)


def before_save(m, step: int, overwrite: bool) -> None:
    """Collective, before a save writes anything: refuse it (``StepOrderError``) or roll
    back (``on_rollback="archive"``) when ``step`` is not above the newest step."""
    # the newest step itself: archived by on_rollback="archive" unless overwritten; else
    # refused as any existing checkpoint is (CheckpointExistsError)
    def behind() -> bool:
        return step < m._newest or (step == m._newest and not overwrite and
                                    m.on_rollback == "archive")

    if behind():
        m.wait()  # a save still in flight counts; one that failed does not
        m._newest = newest(m)
    if behind():
        to = step if overwrite else step - 1
        newer = [s for s in m.steps() if s > step]
        if m.on_rollback != "archive":
            if overwrite and m.incremental:
                m._refuse_overwriting_a_base(step)  # the more specific reason first
            also = f" (and step {step} itself)" if to < step and step in m.steps() else ""
            raise StepOrderError(
                f"save of step {step} refused: {m.root} holds newer steps "
                f"{', '.join(map(str, newer))}{also}; retention ranks checkpoints by step and "
                f"would delete step {step} as soon as it is saved, and a restart would "
                f"resume from step {m._newest}. Nothing was written", path=str(m.root),
                step=step, newer=newer,
                hint=f"to continue from an earlier step, call manager.rollback(to={to}) "
                     f"first (steps above {to} are moved into an archive under the root, "
                     "not deleted), or open the manager with on_rollback='archive' to do so "
                     "on such a save; or save this run under a new root")
        roll_back(m, to, f"the save of step {step}")
    m._newest = max(m._newest, step)


def roll_back(m, to: int, why: str = "rollback()") -> List[int]:
    """Collective: move every step above ``to`` out of the live line of every tier into a
    new archive; returns the steps moved (none: nothing happens)."""
    if not isinstance(to, int) or isinstance(to, bool) or to < -1:
        raise ValueError(f"to must be a step (an int >= 0), got {to!r}")
    moving: Dict[int, List[int]] = {}
    numbers = [0]
    for i, tier in enumerate(m.tiers):
        if tier.store.acts_here(m.comm.rank):
            newer = [s for s in tier.store.steps() if s > to]
            if newer:
                moving[i] = newer
            numbers += [int(ARCHIVE_NAME.match(a).group(1)) for a in tier.store.archives()]
    views = m.comm.all_gather((sorted(moving.items()), max(numbers))) if m.comm.size > 1 \
        else [(sorted(moving.items()), max(numbers))]
    moved = sorted({s for view, _ in views for _, steps in view for s in steps})
    if not moved:
        return []
    into = archive_name(1 + max(n for _, n in views))  # the same on every rank and tier
    records = {i: {"to": to, "archive": into, "steps": steps} for i, steps in moving.items()}
    for i, record in records.items():  # every tier's record before anything moves
        m.tiers[i].store.put_record(INTENT_NAME, encode_intent(**record))
    for i, record in records.items():
        _finish(m.tiers[i], record)
    if m.comm.size > 1:
        m.comm.barrier()
    _forget(m, moved)
    m._newest = min(m._newest, to)  # (concurrent writers: only their own saves count)
    m._newest = newest(m)
    log.warning("rolled back to step %d (for %s): steps %s left the live line; they are "
                "kept in %s", to, why, moved,
                ", ".join(str(m.tiers[i].store.location(into)) for i in sorted(records)) or into)
    return moved


def _forget(m, steps: List[int]) -> None:
    """Forget what ``m`` cached of steps that left the live line; its next save starts a
    new incremental chain (never referring to an archived checkpoint)."""
    for cache in (m._info_cache, m._bases, m._nbytes):
        for key in [k for k in cache if k[1] in steps]:
            del cache[key]
    m._baseline, m._chain = None, 0
    if m._verifier is not None:  # what it read of them is not of the new line's
        m._verifier.forget({step_dir_name(s) for s in steps})


def archived(m) -> Dict[str, List[int]]:
    """Archive name -> the steps committed in it on any tier (of this rank's view)."""
    out: Dict[str, set] = {}
    for tier in m.tiers:
        for name in tier.store.archives():
            out.setdefault(name, set()).update(tier.store.within(name).steps())
    return {name: sorted(steps) for name, steps in sorted(out.items())}


def _intent(tier):
    store = tier.store
    return decode_intent(store.record(INTENT_NAME), f"{store.location(INTENT_NAME)}")


def _finish(tier, record) -> None:
    """Move the steps of ``record`` into its archive, after the bases of the live line
    they refer to; idempotent (what a kill left done is skipped); then drop the record."""
    store, into, steps = tier.store, record["archive"], record["steps"]
    bases = set()
    for s in steps:
        name = step_dir_name(s)
        where = store if store.has(name) else store.within(into)
        try:
            bases.update(read_manifest(where.source(name)).bases)
        except UckptError as e:
            log.warning("step %d on tier %r is moved as it is; its manifest cannot be read, so "
                        "the checkpoints it may refer to are not copied along: %s",
                        s, tier.name, e)
    for base in sorted(bases):
        if step_of(base) not in steps and not store.archive(base, into, keep=True):
            log.warning("%s, which an archived checkpoint refers to, is gone from tier %r",
                        base, tier.name)
    for s in steps:
        store.archive(step_dir_name(s), into)
    store.drop_record(INTENT_NAME)
