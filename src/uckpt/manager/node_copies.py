"""The commit across nodes, as the ranks' listings of node-local tiers show it
(docs/levels.md, "The commit across nodes").

Each node's lowest rank commits its node's copy of a checkpoint, so a step is committed
for the job only when every node's copy holds it. Two things follow from the listings of
every rank (gathered by ``restore``, and by a writer before its first save):

* :func:`lost_nodes`: nodes whose copy of a tier holds no checkpoint at all while the
  other nodes' copies hold some (the node was wiped or replaced): ``restore`` says so,
  and raises :class:`~uckpt.errors.NodeCopyLostError` rather than restore nothing;
* :func:`drop_partial`: steps above the newest held by every node, held by some nodes
  only (a kill between the nodes' commits): never restored, they are removed by the
  next writer before it saves, so that the job can save those steps again.
"""
from __future__ import annotations

import logging
from typing import Dict, List, Mapping, Sequence, Set, Tuple

from ..errors import NodeCopyLostError
from ..runtime.nodes import Nodes
from ..storage.base import step_dir_name

log = logging.getLogger("uckpt.manager.node_copies")

#: one rank's listing: tier index -> the steps committed on its copy of the tier
Held = Dict[int, Set[int]]


def held_of(view: Mapping[str, Sequence[int]]) -> Held:
    """A rank's listing from ``restore``'s view (step -> tiers, ``-1 - i`` for a copy
    that lacks other nodes' files)."""
    out: Held = {}
    for s, tiers in view.items():
        for i in tiers:
            out.setdefault(max(i, -1 - i), set()).add(int(s))
    return out


def lost_nodes(held: Sequence[Held], nodes: Nodes, tiers: int) -> Dict[int, Tuple[List[str], int]]:
    """Tier index -> (the nodes whose ranks see none of its checkpoints, the newest step
    the others see), for each tier where some but not all nodes see checkpoints."""
    out: Dict[int, Tuple[List[str], int]] = {}
    for i in range(tiers):
        seen = {r: h.get(i, set()) for r, h in enumerate(held)}
        if not any(seen.values()):
            continue
        empty = [n for n, ranks in nodes.ranks().items() if not any(seen[r] for r in ranks)]
        if empty:
            out[i] = (empty, max(max(v) for v in seen.values() if v))
    return out


def no_copy_error(m, lost: Dict[int, Tuple[List[str], int]],
                  lacking: Sequence[Tuple[int, str, BaseException]]) -> NodeCopyLostError:
    """What ``restore`` raises where nothing every rank can read is left: ``lost`` (see
    :func:`lost_nodes`), ``lacking`` (step, tier name, error) of the copies whose data
    files some rank found on no node."""
    said = [f"tier {m.tiers[i].name!r}: node(s) {', '.join(names)} hold none of its "
            f"checkpoints (the others hold up to step {step})"
            for i, (names, step) in sorted(lost.items())]
    said += [f"step {s} on tier {name!r}: data files its ranks read are on no node's copy "
             f"({e})" for s, name, e in lacking]
    where, step = (str(m.tiers[min(lost)].path), lost[min(lost)][1]) if lost else \
        (str(m.root), lacking[0][0])
    return NodeCopyLostError(
        f"no checkpoint that every rank can read: {'; '.join(said)}. Node-local copies "
        "were wiped or nodes replaced, and no tier holds a copy of what their ranks wrote",
        path=where, step=step,
        hint="restore from a durable copy (give the manager a tier every node shares, a "
             "shared directory or s3://, that holds the step), or restart on the nodes "
             "that hold the copies; to start the job over on purpose, remove the other "
             "nodes' copies. Keep a durable tier in tiers= so that a node's loss is "
             "survived")


def warn_lost(m, lost: Dict[int, Tuple[List[str], int]]) -> None:
    for i, (names, step) in sorted(lost.items()):
        log.warning("tier %r: node(s) %s hold none of its checkpoints while the other "
                    "nodes hold steps up to %d (wiped or replaced?); restoring a step "
                    "that every rank can read elsewhere", m.tiers[i].name, ", ".join(names),
                    step)


def drop_partial(m) -> None:
    """Collective (a writer, before its first save): on each tier, remove from the copies
    that hold them the steps above the newest step every rank's copy holds (committed on
    some nodes only), where every rank's copy holds some step of the tier. Not with
    ``concurrent_writers`` (the others' saves in flight would look the same)."""
    if m.comm.size == 1 or m.concurrent_writers:
        return
    mine = [sorted(t.store.steps()) for t in m.tiers]
    every = m.comm.all_gather(mine)
    for i, tier in enumerate(m.tiers):
        sets = [set(r[i]) for r in every]
        if all(s == sets[0] for s in sets) or not all(sets):
            continue  # one view, or a node that holds nothing (restore names it)
        common = set.intersection(*sets)
        if not common:
            continue
        partial = sorted(s for s in set(mine[i]) - common if s > max(common))
        if not partial or not tier.store.acts_here(m.comm.rank):
            continue
        holders = sorted({m.nodes.of_rank[r] for r, s in enumerate(sets) if s & set(partial)})
        for s in partial:
            if tier.store.delete(step_dir_name(s)):
                log.info("removed step %d from tier %r: committed on the copies of node(s) "
                         "%s only, never on every node's (a save interrupted between the "
                         "nodes' commits); never restored", s, tier.name, ", ".join(holders))
