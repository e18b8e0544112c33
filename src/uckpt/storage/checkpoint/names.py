"""Key layout of a checkpoint root on a blob store, and this process's live saves.

Under the root's prefix: ``<name>/manifest.json`` and ``<name>/data-NNNNN.bin`` for each
committed checkpoint; ``.<name>.uckpt-tmp-<token>/`` for a save in progress on a store
with ``atomic_rename`` (its save lease: the lock ``.<name>.uckpt-tmp-<token>.lease``),
``.<name>.uckpt-old-<token>/`` for a checkpoint being replaced and
``.<name>.uckpt-del-<token>/`` for one being deleted; root-level records
(``.uckpt-rollback.json``) and the writer lock's objects beside them.
"""
from __future__ import annotations

import os
import re
import threading

from ...format import MANIFEST_NAME

TMP_MARK, OLD_MARK, DEL_MARK = ".uckpt-tmp-", ".uckpt-old-", ".uckpt-del-"
#: a hidden entry of the root: ``.<name><mark><token>``
HIDDEN = re.compile(r"^\.(.+)(\.uckpt-(?:tmp|old|del)-)([0-9a-f]+)$")
#: the suffix of a save lease's lock key (beside its temporary prefix)
LEASE_SUFFIX = ".lease"
#: an object of a collective save's temporary prefix: the ranks that see it share the
#: coordinator's copy of the store (one view); the others make their own
COORDINATOR_MARK = ".uckpt-coordinator"
#: what a data file of a checkpoint may be called (anything else there is not ours)
DATA_FILE = re.compile(r"^data-\d+\.bin$")

__all__ = ["MANIFEST_NAME", "failed", "forget", "hidden", "is_live", "live", "live_below",
           "take_failed"]

# URLs (paths) of the prefixes this process's live saves write below
_live: set[str] = set()
# URLs of this process's failed saves whose objects could not be removed then (the store
# was unreachable): removed by the next save to that root
_failed: set[str] = set()
_guard = threading.Lock()


def hidden(name: str, mark: str) -> str:
    """A new hidden name for checkpoint ``name`` (``mark``: TMP_MARK, OLD_MARK, DEL_MARK)."""
    return f".{name}{mark}{os.urandom(4).hex()}"


def live(where: str) -> None:
    """Record that a save of this process writes below ``where`` (a URL or path)."""
    with _guard:
        _live.add(where)


def forget(where: str) -> None:
    with _guard:
        _live.discard(where)


def is_live(where: str) -> bool:
    """Whether a save of this process writes below ``where``."""
    with _guard:
        return where in _live


def live_below(root: str) -> list[str]:
    """The live saves of this process directly below root URL ``root``."""
    with _guard:
        return [w for w in _live if w.rpartition("/")[0] == root]


def failed(where: str) -> None:
    """Record that a failed save of this process left objects below ``where``."""
    with _guard:
        _failed.add(where)


def take_failed(root: str) -> list[str]:
    """Forget and return this process's failed saves directly below root URL ``root``
    (none of them live)."""
    with _guard:
        mine = [w for w in _failed if w.rpartition("/")[0] == root and w not in _live]
        _failed.difference_update(mine)
    return mine
