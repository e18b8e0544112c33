"""What a manager's tier becomes on this rank: ``{node}`` replaced by the rank's node
name, and the bounded retention of a memory level (``shm://``); see docs/levels.md.

* ``{node}`` may appear in the path of a node-local tier (a local path or an ``shm://``
  URL), never in a URL of storage every node shares; any other ``{...}`` is refused, and
  so is a path where two nodes would land on one root.
* A ``shm://`` tier keeps a bounded number of checkpoints: its ``keep`` (or the
  manager's default) must be an int n, ``KeepLast(n)``, ``KeepBest(n, ...)`` or a union
  of them; with neither given it keeps 1. Anything that may keep without bound
  (``KeepAll``, ``KeepEvery``, a policy of the user's) is refused.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import re
from typing import Any, Optional

from ..errors import OptionsError, StorageConfigError
from ..runtime.nodes import Nodes
from ..storage import canonical, local_path
from .policies import KeepBest, KeepLast, KeepUnion, RetentionPolicy, as_retention
from .tiers import Tier

log = logging.getLogger("uckpt.manager.levels")
_FIELD = re.compile(r"\{([^{}]*)\}")
#: what a memory level keeps when neither it nor the manager says
SHM_DEFAULT_KEEP = 1


def is_memory_level(tier: Tier) -> bool:
    return isinstance(tier.path, str) and tier.path.startswith("shm://")


def is_node_local(tier: Tier) -> bool:
    """Whether ``tier`` may be a root of each node's own (a local path or a memory
    level), not storage every node shares (an object store, ``memory://``, fsspec)."""
    return local_path(str(tier.path)) is not None or is_memory_level(tier)


def placed(tier: Tier, nodes: Nodes) -> Tier:
    """``tier`` with ``{node}`` replaced by this rank's node name (``tier`` itself where
    its path has no placeholder)."""
    text = str(tier.path)
    fields = _FIELD.findall(text)
    if not fields:
        return tier
    unknown = sorted({f for f in fields if f != "node"})
    if unknown:
        raise StorageConfigError(
            f"tier {tier.name!r} ({text}): unknown placeholder {{{unknown[0]}}}; only "
            "{node} is replaced (by the rank's node name)", path=text,
            hint="write {node}, or leave braces out of tier paths")
    if not is_node_local(tier):
        raise StorageConfigError(
            f"tier {tier.name!r} ({text}): {{node}} names a node-local root, but this URL "
            "names storage every node shares", path=text,
            hint="use {node} in a local path or an shm:// URL only")
    roots = {os.path.normpath(canonical(text.replace("{node}", n))): n for n in nodes.order}
    if len(roots) < len(nodes.order):
        raise StorageConfigError(f"tier {tier.name!r} ({text}): two nodes would share one "
                                 "root", path=text,
                                 hint="put {node} where it makes a root of its own per node")
    name = tier.name.replace("{node}", nodes.name)
    return dataclasses.replace(tier, path=text.replace("{node}", nodes.name), name=name)


def retention_of(tier: Tier, default: Any) -> RetentionPolicy:
    """The retention policy of ``tier``: its own ``keep``, else ``default``; for a memory
    level a bounded one (OptionsError otherwise)."""
    keep = tier.keep if tier.keep is not None else default
    if not is_memory_level(tier):
        return as_retention(keep)
    if keep is None:
        return KeepLast(SHM_DEFAULT_KEEP)
    policy = as_retention(keep)
    if bound(policy) is None:
        raise OptionsError(
            f"the memory level {tier.path} (tier {tier.name!r}) would keep checkpoints "
            f"without bound ({policy!r}); its capacity is the node's shared memory",
            hint=f"give it Tier({tier.path!r}, keep=1) (or 2), and the unbounded policy "
                 "to a durable tier")
    return policy


def bound(policy: RetentionPolicy) -> Optional[int]:
    """The most checkpoints ``policy`` keeps, or None where it has no bound."""
    if isinstance(policy, (KeepLast, KeepBest)):
        return policy.n
    if isinstance(policy, KeepUnion):
        counts = [bound(p) for p in policy.policies]
        return None if None in counts else sum(c for c in counts if c is not None)
    return None
