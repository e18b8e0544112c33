"""What a rank learns of a checkpoint that its save committed: ``on_commit``'s argument.

Retention (:class:`~uckpt.manager.checkpoint_manager.CheckpointManager`) needs a
committed checkpoint's step, total bytes, metadata (metrics), creation time and bases,
not its chunks. A rank other than the committer of a save with a split manifest
(:mod:`uckpt.saving.own_parts`) never holds the whole manifest: the committer
broadcasts these few facts (:meth:`Committed.record`, a constant size whatever the
ranks) and every other rank combines them with what it already knows (step, metadata).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

from ..format import Manifest


@dataclass(frozen=True)
class Committed:
    """A committed checkpoint's facts that retention uses.

    ``manifest``: the whole manifest where this rank has it (one rank, or a save that
    refers to a base: every rank gets every chunk's record); None on a rank of a
    split save (several ranks, no base), which never builds it."""

    step: Optional[int]
    nbytes: int  #: the data files' total size
    created: str  #: the manifest's ``created`` (UTC, ISO 8601)
    metadata: Dict[str, Any] = field(default_factory=dict)
    bases: Tuple[str, ...] = ()  #: the checkpoints its chunks refer to
    manifest: Optional[Manifest] = None

    @classmethod
    def of(cls, m: Manifest) -> "Committed":
        """The facts of manifest ``m`` (which it keeps)."""
        return cls(m.step, sum(f.size for f in m.files.values()), m.created, m.metadata,
                   tuple(m.bases), m)

    def record(self) -> Dict[str, Any]:
        """What the committer broadcasts (JSON-able, a constant size)."""
        return {"nbytes": self.nbytes, "created": self.created}

    @classmethod
    def from_record(cls, record: Dict[str, Any], step: Optional[int],
                    metadata: Dict[str, Any]) -> "Committed":
        """The facts of a split save's checkpoint on a rank other than its committer:
        the committer's ``record`` (:meth:`record`), this save's step and metadata."""
        return cls(step, int(record["nbytes"]), str(record["created"]), metadata)
