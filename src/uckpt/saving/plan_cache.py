"""Plans kept across saves: a save whose structure is unchanged reuses the last plan.

The global plan (:func:`uckpt.saving.global_plan.global_plan`) depends only on the state's
*structure* on every rank: each array leaf's path, dtype, global shape and box, in order,
the world and the options that shape the layout. Each rank digests its share of that
(:func:`structure_key`, 16 bytes) every save. Once a plan is made, every rank keeps it in
its :class:`PlanCache` with the digest of every rank's key (the plan's *id*).

A later save (:func:`uckpt.saving.collective.prepare_collective`) whose key on this rank is the
one it kept sends a *lean* record instead of its metadata (:func:`lean`): its key, the id
of the plan it kept, a digest of what must be equal on every rank at each save (the
shared tree with its plain values, the replicated leaves with their checksums:
:func:`values_check`) and its :class:`~uckpt.PerRank` subtrees (values, for the
manifest). When every rank kept the plan whose id is the digest of all the keys sent, and
every rank's check is the same, every rank reuses the plan (:meth:`PlanCache.reuse`);
otherwise every rank plans again, together, from every rank's full metadata, and gets
today's errors for an inconsistent state. What a rank receives on a reuse: per rank
about 200 bytes (three digests and the record's keys) plus that rank's PerRank subtrees,
plus rank 0's token and user metadata.

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


def lean(meta: Dict[str, Any], key: str, kept: str) -> Dict[str, Any]:
    """What a rank sends when its structure is the one it kept the plan ``kept`` for."""
    return {"key": key, "kept": kept, "check": values_check(meta), "per_rank": meta["per_rank"]}


@dataclass(frozen=True)
class _Kept:
    key: str
    id: str
    plan: GlobalPlan


class PlanCache:
    """This rank's last global plan, for the saves of one sequence over one communicator
    (a :class:`~uckpt.CheckpointManager` holds one). Used by the thread that plans.

    Call order, per save on every rank: :meth:`kept_for` (before the plan exchange),
    then :meth:`reuse` on what every rank sent; when it gives None, plan, then
    :meth:`keep` the plan made."""

    def __init__(self) -> None:
        self._kept: Optional[_Kept] = None

    def kept_for(self, key: str) -> Optional[str]:
        """The id of the plan kept, if it was made with this rank's structure ``key``."""
        return self._kept.id if self._kept is not None and self._kept.key == key else None

    def reuse(self, gathered: List[Dict[str, Any]], what: str) -> Optional[GlobalPlan]:
        """The plan kept, if every rank's record in ``gathered`` is lean, names it, and
        agrees with the others' checks; else None (every rank decides the same)."""
        ids = {g.get("kept") for g in gathered}
        checks = {g.get("check") for g in gathered}
        if self._kept is None or ids != {self._kept.id} or len(checks) != 1 \
                or plan_id([g["key"] for g in gathered]) != self._kept.id:
            changed = [r for r, g in enumerate(gathered) if g.get("kept") is None]
            why = "first save" if self._kept is None else \
                f"structure changed on rank(s) {', '.join(map(str, changed))}" if changed else \
                "values differ between ranks" if len(checks) != 1 else "ranks kept other plans"
            log.debug("%s: planning (%s)", what, why)
            return None
        log.debug("%s: plan reused (structure unchanged on all %d rank(s))", what,
                  len(gathered))
        return self._kept.plan

    def keep(self, key: str, keys: List[str], plan: GlobalPlan) -> None:
        """Keep ``plan``, made from ranks whose structure keys are ``keys``."""
        self._kept = _Kept(key, plan_id(keys), plan)


def _hash(obj: Any) -> str:
    text = json.dumps(obj, separators=(",", ":"), allow_nan=True)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()
