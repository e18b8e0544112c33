"""What a listing finds under a root: a checkpoint with its status, in one order."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from ..format import Manifest
from ..storage import Entry, Store
from ..storage.base import CHECKPOINT, LINK

COMMITTED, DAMAGED, INCOMPLETE, STALE = "committed", "damaged", "incomplete", "stale"


@dataclass
class Found:
    """One checkpoint (or what a save or deletion left) found under a root, at ``where`` (its
    absolute path, or its URL); ``tier`` is the root's label when several are listed."""

    where: str
    status: str
    step: Optional[int] = None
    size: int = 0  # bytes of all its files
    manifest: Optional[Manifest] = None
    reason: str = ""  # why it is damaged / incomplete / stale
    tier: Optional[str] = None  # set by tiers.scan_tiers
    entry: Optional[Entry] = None  # what the store listed
    #: the store that listed it as a child of its root (None: the root itself)
    store: Optional[Store] = None

    def gone(self) -> bool:
        """Whether it was deleted or replaced since it was listed (a checkpoint only)."""
        return self.store is not None and self.entry is not None and \
            self.entry.kind == CHECKPOINT and not self.store.still_there(self.entry)

    @property
    def name(self) -> str:
        return self.entry.name if self.entry is not None else \
            self.where.rstrip("/").replace("\\", "/").rsplit("/", 1)[-1]

    @property
    def followed(self) -> bool:
        """False for a symlink named like a checkpoint: listed, never read through."""
        return self.entry is None or self.entry.kind != LINK


def size_reason(name: str, actual: int, expected: int) -> str:
    """Why a data file of ``actual`` bytes, whose manifest records ``expected``, makes its
    checkpoint damaged ("" if the sizes are equal, as they must be)."""
    if actual < expected:
        return f"data file {name} is truncated: {actual} of {expected} bytes"
    if actual > expected:
        return f"data file {name} is longer than its manifest records: {actual} of {expected} bytes"
    return ""


def order_found(found: List[Found]) -> List[Found]:
    """By step (unnumbered last), then status, then name."""
    order = {COMMITTED: 0, DAMAGED: 1, STALE: 2, INCOMPLETE: 3}
    return sorted(found, key=lambda f: (f.step is None, f.step or 0, order[f.status], f.name))
