"""What a listing finds under a root: a checkpoint with its status, in one order.

Shared by the local scan (:mod:`.scan`) and the object-store listing (:mod:`.remote`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

from ..format import Manifest

COMMITTED, DAMAGED, INCOMPLETE, STALE = "committed", "damaged", "incomplete", "stale"


@dataclass
class Found:
    """One directory found under a root (or, ``url`` set, a checkpoint prefix in an object
    store, ``path`` None); ``tier`` is the root's label when several are listed."""

    path: Optional[Path]
    status: str
    step: Optional[int] = None
    size: int = 0  # bytes of all files in the directory
    manifest: Optional[Manifest] = None
    reason: str = ""  # why it is damaged / incomplete / stale
    tier: Optional[str] = None  # set by tiers.scan_tiers
    url: Optional[str] = None  # in an object store

    @property
    def name(self) -> str:
        if self.url:
            return self.url.rsplit("/", 1)[-1]
        assert self.path is not None  # set where url is not
        return self.path.name

    @property
    def where(self) -> str:
        """The absolute path, or the URL."""
        if self.url:
            return self.url
        assert self.path is not None  # set where url is not
        return str(self.path.absolute())


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
