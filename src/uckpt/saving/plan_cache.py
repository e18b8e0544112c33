"""Plans kept across saves: a save whose structure is unchanged reuses the last plan.

The global plan (:func:`uckpt.saving.global_plan.global_plan`) depends only on the state's
*structure* on every rank: each array leaf's path, dtype, global shape and box, in order,
the world and the options that shape the layout. Each rank digests its share of that
(:func:`structure_key`, 16 bytes) every save. Once a plan is made, every rank keeps its
view of it in its :class:`PlanCache` with the digest of every rank's key (the plan's *id*).

A later save (:func:`uckpt.saving.collective.prepare_collective`) agrees by one reduction
(:meth:`~uckpt.comm.Communicator.agree_outcomes`, a constant per rank): each rank
contributes its :meth:`PlanCache.vote`, whether its key is the one it kept, the id of the
plan it kept and a digest of what must be equal on every rank at each save (the shared
tree with its plain values, the replicated leaves with their checksums:
:func:`values_check`), the digests as int64s. A hit (:meth:`PlanCache.agreed`) iff every
rank hit and the minimum and maximum of each digest are equal: every rank reuses the plan.
Otherwise the ranks plan again as for a first save, from every rank's full metadata
(which carries the same three fields, so that the log says why: :meth:`PlanCache.why`):
rank 0 alone, each rank keeping its own share (:mod:`uckpt.saving.root_plan`), or, for
an incremental save, every rank; with today's errors for an inconsistent state.

A new process (a resumed job) starts with an empty cache and plans once.
"""
from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from .global_plan import GlobalPlan, digest

log = logging.getLogger("uckpt.saving.plan_cache")


def structure_key(meta: Dict[str, Any], world: int, rank: int, layout: List[int]) -> str:
    """The digest (32 hex digits) of what this rank's share of the plan depends on: its
    array leaves' paths, dtypes, global shapes and boxes in order (not their values),
    the world, its rank and ``layout`` (the options that shape the plan)."""
    leaves = [[kind, [e[:5] for e in meta[kind]]] for kind in ("replicated", "own")]
    return _hash([world, rank, layout, leaves])


def values_check(meta: Dict[str, Any]) -> str:
    """The digest of what must be equal on every rank at every save: the shared tree
    (with its plain values) and the replicated leaves (with their checksums)."""
    return _hash([meta["tree"], digest(meta["replicated"])])


def plan_id(keys: List[str]) -> str:
    """The id of the plan made from ranks whose structure keys are ``keys`` (by rank)."""
    return _hash(keys)


def as_ints(hexdigest: str) -> List[int]:
    """The first 120 bits of a digest of :func:`_hash` as two non-negative int64s (what a
    reduction over int64 can compare)."""
    return [int(hexdigest[:15], 16), int(hexdigest[15:30], 16)]


#: the number of ints of :meth:`PlanCache.vote`
VOTE_WIDTH = 5


@dataclass(frozen=True)
class _Kept:
    key: str
    id: str
    plan: GlobalPlan


class PlanCache:
    """This rank's last global plan, for the saves of one sequence over one communicator
    (a :class:`~uckpt.CheckpointManager` holds one). Used by the thread that plans.

    Call order, per save on every rank: :meth:`vote` (before the reduction), then
    :meth:`agreed` on its result; when it gives None, :meth:`planning` with :meth:`why`
    of every rank's full record (with :meth:`kept_for` and :func:`values_check` in it;
    computed where those records are), plan, then :meth:`keep` the plan made."""

    def __init__(self) -> None:
        self._kept: Optional[_Kept] = None
        self._world = 0

    def kept_for(self, key: str) -> Optional[str]:
        """The id of the plan kept, if it was made with this rank's structure ``key``."""
        return self._kept.id if self._kept is not None and self._kept.key == key else None

    def vote(self, key: str, check: str) -> List[int]:
        """What this rank contributes to the reduction (:data:`VOTE_WIDTH` ints): 1 if
        it kept a plan for structure ``key`` (else 0), that plan's id and ``check``
        (:func:`values_check`), as int64s."""
        kept = self.kept_for(key)
        return [1 if kept else 0] + (as_ints(kept) if kept else [0, 0]) + as_ints(check)

    def agreed(self, mins: List[int], maxs: List[int], what: str) -> Optional[GlobalPlan]:
        """The plan kept, if the reduction of every rank's :meth:`vote` says every rank
        kept it and every rank's check is the same; else None (every rank decides the
        same, from the same reduction)."""
        if self._kept is None or mins[0] != 1 or mins != maxs \
                or mins[1:3] != as_ints(self._kept.id):
            return None
        log.debug("%s: plan reused (structure unchanged on all %d rank(s))", what,
                  self._world)
        return self._kept.plan

    @staticmethod
    def why(gathered: List[Dict[str, Any]]) -> str:
        """Why the ranks plan again, from every rank's full record (its ``kept``: the id
        of the plan it kept for its structure, or None; its ``check``): for
        :meth:`planning` (computed where every record is: rank 0, or every rank)."""
        changed = [r for r, g in enumerate(gathered) if g.get("kept") is None]
        checks = {g.get("check") for g in gathered}
        return f"structure changed on rank(s) {', '.join(map(str, changed))}" if changed \
            else "values differ between ranks" if len(checks) != 1 else "ranks kept other plans"

    def planning(self, what: str, why: str) -> None:
        """Log that the ranks plan again, and why: this rank's first save, else ``why``
        (:meth:`why`)."""
        log.debug("%s: planning (%s)", what, "first save" if self._kept is None else why)

    def keep(self, key: str, id: str, world: int, plan: GlobalPlan) -> None:
        """Keep ``plan`` (this rank's view of it), made by ``world`` ranks; ``id``: the
        :func:`plan_id` of their structure keys."""
        self._kept = _Kept(key, id, plan)
        self._world = world


def _hash(obj: Any) -> str:
    text = json.dumps(obj, separators=(",", ":"), allow_nan=True)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()
