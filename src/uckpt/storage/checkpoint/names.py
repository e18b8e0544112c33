"""Key layout of a checkpoint root on a blob store, and this process's live saves.

Under the root's prefix: ``<name>/manifest.json`` and ``<name>/data-NNNNN.bin`` for each
committed checkpoint; ``.<name>.uckpt-tmp-<token>/`` for a save in progress on a store
with ``atomic_rename`` (its save lease: the lock ``.<name>.uckpt-tmp-<token>.lease``),
``.<name>.uckpt-old-<token>/`` for a checkpoint being replaced and
``.<name>.uckpt-del-<token>/`` for one being deleted; root-level records
(``.uckpt-rollback.json``) and the writer lock's objects beside them.
"""
from __future__ import annotations

import re
import secrets
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

__all__ = ["MANIFEST_NAME", "hidden", "live", "forget", "is_live"]

_live: set[tuple[int, str]] = set()  # (id of the blob store, prefix) of live saves
_guard = threading.Lock()


def hidden(name: str, mark: str) -> str:
    """A new hidden name for checkpoint ``name`` (``mark``: TMP_MARK, OLD_MARK, DEL_MARK)."""
    return f".{name}{mark}{secrets.token_hex(4)}"


def live(blob: object, prefix: str) -> None:
    """Record that a save of this process writes below ``prefix`` of ``blob``."""
    with _guard:
        _live.add((id(blob), prefix))


def forget(blob: object, prefix: str) -> None:
    with _guard:
        _live.discard((id(blob), prefix))


def is_live(blob: object, prefix: str) -> bool:
    """Whether a save of this process writes below ``prefix`` of ``blob``."""
    with _guard:
        return (id(blob), prefix) in _live
