"""Several storage tiers listed together: ``uckpt ls ROOT ROOT...``.

A tier is a root directory with the usual layout (a fast node-local one such as
``/dev/shm/job``, a durable shared one such as ``/lustre/job``); the same step may
be held by several tiers, each copy with its own status. :func:`scan_tiers` scans
each root with :func:`~uckpt.cli.scan.scan` and merges what it finds into one
:class:`Row` per step (per name, for checkpoints without a step). It reads only
manifests and changes nothing, like ``scan``.

A root that does not exist is a *missing* tier, listed as empty (a node-local
tier lost with its node is a normal situation); when every root is missing,
:class:`~uckpt.errors.CheckpointNotFoundError` is raised.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ..errors import CheckpointNotFoundError
from ..storage import canonical, open_store, storage_options_for
from .scan import COMMITTED, DAMAGED, INCOMPLETE, STALE, Found, scan

STATUS_ORDER = (COMMITTED, DAMAGED, STALE, INCOMPLETE)


def default_labels(n: int) -> List[str]:
    return [f"tier{i}" for i in range(n)]


@dataclass(frozen=True)
class Tier:
    label: str
    root: str  # as given on the command line
    missing: bool = False
    counts: Tuple[Tuple[str, int], ...] = ()  # (status, number of entries), in STATUS_ORDER

    @property
    def path(self):
        """The root's absolute path (its URL for an object store)."""
        return canonical(self.root)

    def summary(self) -> str:
        """``"missing"``, ``"empty"`` or ``"2 committed, 1 incomplete"``."""
        if self.missing:
            return "missing"
        return ", ".join(f"{n} {status}" for status, n in self.counts) or "empty"


@dataclass
class Row:
    """One step across the tiers: every entry found for it, in tier order."""

    step: Optional[int]
    entries: List[Found] = field(default_factory=list)  # each with .tier set

    @property
    def committed_on(self) -> List[str]:
        """Labels of the tiers holding a committed copy, in tier order."""
        return _unique(f.tier for f in self.entries if f.status == COMMITTED)

    @property
    def best(self) -> Found:
        """The entry that stands for the row: the first committed copy, else the first entry."""
        return next((f for f in self.entries if f.status == COMMITTED), self.entries[0])

    def status(self, present: Sequence[str]) -> str:
        """``"committed"`` when every tier in ``present`` holds one copy and all agree;
        otherwise each status with its tiers: ``"committed on fast; damaged on durable"``."""
        by_status: Dict[str, List[str]] = {}
        for f in self.entries:
            by_status.setdefault(f.status, [])
            if f.tier not in by_status[f.status]:
                by_status[f.status].append(f.tier)
        tiers = [f.tier for f in self.entries]
        if len(by_status) == 1 and sorted(tiers) == sorted(present):
            return self.entries[0].status
        return "; ".join(f"{s} on {','.join(by_status[s])}"
                         for s in STATUS_ORDER if s in by_status)


def scan_tiers(roots: Sequence[str], labels: Sequence[str], storage_options=None
               ) -> Tuple[List[Tier], List[Row]]:
    """Scan every root (labelled by ``labels``; ``storage_options`` for ``s3://`` roots)
    and merge the entries by step."""
    assert len(roots) == len(labels)
    tiers: List[Tier] = []
    rows: Dict[tuple, Row] = {}
    for label, root in zip(labels, roots):
        options = storage_options_for(root, storage_options)
        try:
            found = scan(root, options)
        except FileNotFoundError:  # CheckpointNotFoundError, or the root vanished mid-scan
            if open_store(root, options).exists():
                raise
            tiers.append(Tier(label, str(root), missing=True))
            continue
        counts = {s: sum(f.status == s for f in found) for s in STATUS_ORDER}
        tiers.append(Tier(label, str(root),
                          counts=tuple((s, n) for s, n in counts.items() if n)))
        for f in found:
            f.tier = label
            key = (f.step is None, f.step or 0, "" if f.step is not None else f.name)
            rows.setdefault(key, Row(f.step)).entries.append(f)
    if all(t.missing for t in tiers):
        listed = ", ".join(f"{t.label} ({t.root})" for t in tiers)
        raise CheckpointNotFoundError(f"none of the tier roots exists: {listed}",
                                      path=str(roots[0]))
    return tiers, [rows[k] for k in sorted(rows)]


def _unique(items) -> List[str]:
    out: List[str] = []
    for x in items:
        if x not in out:
            out.append(x)
    return out
