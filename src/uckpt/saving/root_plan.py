"""The plan of a save by several ranks, made once, by rank 0: each rank gets its own share.

Before, every rank all-gathered every rank's metadata and computed the whole
:class:`~uckpt.saving.global_plan.GlobalPlan` itself: per rank O(ranks x arrays) bytes
received, memory and CPU, every first save (or changed structure). For a save with a
split manifest (several ranks, no base: :mod:`uckpt.saving.own_parts`), a rank needs
only its own write items, the array table and the data files' sizes; so
(:func:`plan_at_root`, after the ranks' metadata was gathered to rank 0):

1. rank 0 broadcasts which ranks' replicated leaves differ from its own (almost always
   none; else those ranks send their lists to it, to say which values differ);
2. rank 0 checks and plans (:func:`~uckpt.saving.global_plan.global_plan`) and broadcasts
   what every rank needs: the array table, the data files' sizes, the plan's id, its
   token and metadata, why it planned; or the error it raised, which every rank raises
   (a :class:`~uckpt.errors.StateMismatchError` as itself);
3. rank 0 scatters each rank its write items, as columns
   (:meth:`~uckpt.comm.Communicator.scatter`, :meth:`~uckpt.saving.plan_columns.Columns.shares`);
4. if some rank has ``PerRank`` state, the ranks all-gather those subtrees (for the
   manifest's tree, as a later save does).

Each rank's view is a :class:`GlobalPlan` whose :class:`~uckpt.saving.plan.SavePlan`
holds its own items only (``file_sizes`` for every rank): its items are the whole plan's,
bit for bit. A save that refers to a base needs every rank's chunks on every rank (the
baseline of the next save) and plans on every rank as before.
"""
from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Tuple

from ..comm import Communicator
from ..comm.base import describe_exception, exception_kinds, raise_failed
from ..errors import StateMismatchError
from ..format import data_file_name
from ..options import SaveOptions
from .global_plan import GlobalPlan, expand, global_columns, own_starts
from .plan import ArrayMeta, SavePlan, WriteItem
from .plan_cache import PlanCache, plan_id

log = logging.getLogger("uckpt.saving.root_plan")


def plan_at_root(comm: Communicator, gathered: Optional[List[Dict[str, Any]]],
                 meta: Dict[str, Any], head: Dict[str, Any], exact_chunk_bytes: int,
                 options: SaveOptions, cache: Optional[PlanCache], why: Optional[str],
                 what: str) -> Tuple[GlobalPlan, List[Dict[str, Any]], str, Optional[str]]:
    """Collective (see the module): ``gathered``, every rank's record on rank 0 (None on
    the others); ``meta``, this rank's metadata; ``head``, rank 0's token and metadata;
    ``why``, rank 0's reason to plan (:meth:`PlanCache.why`), which every rank logs
    through ``cache`` before it plans or raises. Returns this rank's view of the plan, the
    records the save keeps (each rank's ``per_rank``, rank 0's ``head``), the plan's id
    and ``why``, on every rank."""
    differ = comm.broadcast(None if gathered is None else expand(gathered), 0)
    if differ:  # rare: some rank's replicated leaves differ; fetch them to say which
        full = comm.gather(meta["replicated"] if comm.rank in differ else None, 0)
        if gathered is not None and full is not None:
            for r in differ:
                gathered[r]["replicated"] = full[r]
    mine: Optional[BaseException] = None
    common: Optional[Dict[str, Any]] = None
    shares: Optional[List[List[Any]]] = None
    if gathered is not None:
        try:
            metas, columns = global_columns(gathered, exact_chunk_bytes,
                                            chunk_bytes=options.chunk_bytes,
                                            alignment=options.alignment)
            common = {"metas": [[p, m.dtype, m.shape] for p, m in metas.items()],
                      "sizes": list(columns.sizes),
                      "id": plan_id([g["key"] for g in gathered]) if cache is not None
                      else "", "why": why, "head": head,
                      "per_rank": any(g["per_rank"] for g in gathered)}
            shares = columns.shares()  # no WriteItem per chunk of the whole plan
        except Exception as e:  # noqa: BLE001 - told to every rank, then raised everywhere
            mine, common = e, {"error": _told(e), "why": why}
    common = comm.broadcast(common, 0)
    assert common is not None
    if cache is not None and common["why"] is not None:
        cache.planning(what, common["why"])
    if "error" in common:
        _raise(mine, common["error"], comm.size, what)
    items = comm.scatter(shares, 0)
    names = [data_file_name(r) for r in range(comm.size)]
    plan = SavePlan(comm.size, tuple(WriteItem(p, tuple(start), tuple(shape), comm.rank,
                                               names[comm.rank], offset, length)
                                     for p, start, shape, offset, length in zip(*items)),
                    tuple(zip(names, common["sizes"])))
    metas = {p: ArrayMeta(dtype, tuple(shape)) for p, dtype, shape in common["metas"]}
    per_rank = comm.all_gather(meta["per_rank"]) if common["per_rank"] else [[]] * comm.size
    records: List[Dict[str, Any]] = [{"per_rank": p} for p in per_rank]
    records[0].update(common["head"])
    return (GlobalPlan(plan, metas, own_starts(meta["own"])), records, common["id"],
            common["why"])


def _told(e: BaseException) -> Dict[str, Any]:
    """What rank 0 tells the others of the error its planning raised."""
    told: Dict[str, Any] = {"error": describe_exception(e), "kinds": exception_kinds(e)}
    if isinstance(e, StateMismatchError):  # raised as itself on every rank
        text = str(e.args[0]) if e.args else ""
        if e.hint and text.endswith(f"\n  hint: {e.hint}"):
            text = text[:-len(f"\n  hint: {e.hint}")]
        told["mismatch"] = {"message": text, "hint": e.hint, "where": e.where}
    return told


def _raise(mine: Optional[BaseException], told: Dict[str, Any], size: int, what: str) -> None:
    """Raise the error rank 0's planning raised: on rank 0 itself; elsewhere a
    :class:`StateMismatchError` as itself, anything else as a
    :class:`~uckpt.errors.DistributedError` naming rank 0."""
    if mine is not None:
        raise mine
    mismatch = told.get("mismatch")
    if mismatch is not None:
        raise StateMismatchError(mismatch["message"], hint=mismatch["hint"],
                                 **mismatch["where"])
    raise_failed([(0, told["error"], told["kinds"])], size, None, what)
