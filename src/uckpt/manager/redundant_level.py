"""A manager's first tier with ``redundancy=`` (docs/levels.md, "Redundancy across
nodes"): which tiers may have it, the hook that protects each save
(:class:`~uckpt.levels.save_level.Protector`), and the restore's rebuilds
(:func:`~uckpt.manager.restore_level.rebuild`): of the newest step some node lacks,
before the restore chooses a step, and of a step whose load found damage.

* ``redundancy=`` on a tier whose storage every node shares (``s3://``, ``fsspec+``,
  ``memory://``), on a tier other than the first, or with incremental saves:
  :class:`~uckpt.errors.RedundancyConfigError` when the manager is made.
* a job on one node: one INFO line, and the tier is saved without redundancy; so is a
  local path every node sees as one directory (found at the first save, one INFO line).
"""
from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Sequence, Set

from ..errors import RedundancyConfigError, ShareLostError, UckptError
from .restore_level import rebuild
from ..levels.save_level import Protector
from ..runtime.nodes import Nodes
from ..storage.base import step_dir_name
from ..storage.claims import claim_roots
from .levels import is_node_local
from .tiers import Tier

log = logging.getLogger("uckpt.manager.redundant_level")


def redundant_level(tiers: Sequence[Tier], nodes: Nodes, incremental: bool
                    ) -> Optional["RedundantLevel"]:
    """The first tier's redundancy, where it has one and the job more than one node;
    RedundancyConfigError for a ``redundancy=`` that cannot be kept (module docstring)."""
    for i, t in enumerate(tiers):
        if t.redundancy is None:
            continue
        where = f"tier {t.name!r} ({t.path}) has redundancy={t.redundancy!r}"
        if not is_node_local(t):
            raise RedundancyConfigError(
                f"{where}, but every node shares its storage: redundancy across nodes "
                "protects node-local levels", hint="give redundancy= to a local path or "
                "an shm:// tier with {node} in it, or leave it out")
        if i > 0:
            raise RedundancyConfigError(
                f"{where}: only the first tier's redundancy is kept (saves go there)",
                hint="make that tier the first, or leave redundancy= out")
        if incremental:
            raise RedundancyConfigError(
                f"{where}: incremental saves do not keep redundancy across nodes",
                hint="save in full (incremental=False), or leave redundancy= out")
    tier = tiers[0]
    scheme = tier.redundancy_scheme
    if scheme is None:
        return None
    if len(nodes.order) < 2:
        if nodes.rank == 0:
            log.info("tier %r has redundancy=%r, but the job runs on one node (%s): saved "
                     "without redundancy across nodes", tier.name, tier.redundancy,
                     nodes.name)
        return None
    return RedundantLevel(tier, Protector(scheme, nodes, tier.name), nodes)


class RedundantLevel:
    """The first tier of a manager, with redundancy across ``nodes``."""

    def __init__(self, tier: Tier, protect: Protector, nodes: Nodes) -> None:
        self.tier, self.protect, self.nodes = tier, protect, nodes
        self._tried: Set[int] = set()
        #: the last share of this restore that its redundancy could not rebuild (raised
        #: by the restore where no tier holds a copy: it names node, ranks and step)
        self.lost: Optional[ShareLostError] = None

    def rebuild_newest(self, manager: Any, views: List[Dict[str, List[int]]]) -> bool:
        """Collective, before a restore: where the newest step of the first tier that any
        node holds is not committed on every node (``views``: each rank's step -> tier
        codes, 0 or -1 for the first tier), rebuild the nodes' copies; whether it did."""
        def here(view: Dict[str, List[int]]) -> Set[int]:
            return {int(s) for s, tiers in view.items() if 0 in tiers or -1 in tiers}

        self._tried.clear()  # a new restore
        self.lost = None
        seen = set().union(*map(here, views))
        if not seen:
            return False
        newest = max(seen)
        if all(newest in here(v) for v in views):
            return False
        return self._rebuild(manager, newest, "a node's copy lacks it")

    def rebuild_damaged(self, manager: Any, step: int, why: str = "its load found damage"
                        ) -> bool:
        """Collective, after the load of ``step`` from the first tier found damage, or
        data files on no node's copy (a restart on fewer nodes): rebuild what its
        redundancy can; whether anything was rebuilt (once per step and restore:
        :meth:`rebuild_newest` starts each restore)."""
        if step in self._tried:
            return False
        return self._rebuild(manager, step, why)

    def _rebuild(self, manager: Any, step: int, why: str) -> bool:
        self._tried.add(step)
        name = step_dir_name(step)
        if manager.role == "reader":
            log.info("step %d on tier %r: %s, and a reader does not rebuild it; trying the "
                     "next copy", step, self.tier.name, why)
            return False
        # the writer lock of this tier alone (a durable tier out of reach stays untouched)
        locks = [] if manager.is_writer else \
            claim_roots([self.tier.store], manager.comm, manager.concurrent_writers)
        try:
            done = rebuild(manager.comm, self.nodes, self.tier.store, name, self.tier.name)
        except ShareLostError as e:
            self.lost = e
            log.warning("step %d on tier %r cannot be rebuilt from its redundancy (%s): %s; "
                        "restoring from the next tier that holds it", step, self.tier.name,
                        why, str(e).splitlines()[0])
            return False
        except (UckptError, ValueError, OSError) as e:
            log.warning("step %d on tier %r: %s, and rebuilding it failed: %s: %s; "
                        "restoring from the next tier that holds it", step, self.tier.name,
                        why, type(e).__name__, str(e).splitlines()[0])
            return False
        finally:
            for lock in locks:
                lock.release()
        return done is not None and bool(done.shares or done.pieces)
