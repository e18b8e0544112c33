"""What saves cost, measured by the CheckpointManager and kept beside its checkpoints.

For every save the manager measures (monotonic clock, from the call of ``save``):

* ``stall_s``: until ``save`` returned (the training loop was blocked this long);
* ``commit_s``: until the checkpoint was committed on the first tier;
* ``durable_s``: until it was committed on the last (durable) tier; the same as
  ``commit_s`` with one tier; absent for a save not copied (``durable_every``).

The writing manager (rank 0) keeps the newest :data:`KEEP` records in
``<root>/.uckpt-costs.json`` of a local first tier (docs/format.md, section 15),
replaced atomically (:mod:`.costs_file`: a locked temporary file renamed over it, one a
killed writer left removed by the next replacement). ``uckpt advise`` and
:class:`~uckpt.manager.interval.EveryOptimal` read it. The file is a JSON object::

    {"kind": "uckpt-save-costs", "version": 1,
     "saves": [{"step": 100, "stall_s": 0.031, "commit_s": 0.42, "durable_s": 0.42,
                "async": true, "time": 1764000000.0}, ...]}
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

from ..errors import CheckpointNotFoundError, ManifestError, UckptError
from ..storage import fsutil
from .costs_file import remove_dead, replace_file

log = logging.getLogger("uckpt.manager.costs")

COSTS_NAME = ".uckpt-costs.json"
KIND = "uckpt-save-costs"
VERSION = 1
#: records kept in the file, and the recent saves whose medians are the costs
KEEP = 64
RECENT = 16
_MAX_FILE_BYTES = 1 << 20


@dataclass(frozen=True)
class CostSummary:
    """Medians over the ``saves`` most recent records (seconds); None where none had it."""

    saves: int
    stall: float
    commit: Optional[float]
    durable: Optional[float]
    async_saves: int


def summarize(records: List[Dict[str, Any]], recent: int = RECENT) -> Optional[CostSummary]:
    """The medians of the newest ``recent`` records that have a stall; None if none has."""
    usable = [r for r in records if isinstance(r.get("stall_s"), (int, float))][-recent:]
    if not usable:
        return None

    import statistics  # here: it imports decimal and fractions

    def median(key: str) -> Optional[float]:
        values = [float(r[key]) for r in usable if isinstance(r.get(key), (int, float))]
        return statistics.median(values) if values else None

    return CostSummary(saves=len(usable), stall=median("stall_s") or 0.0,
                       commit=median("commit_s"), durable=median("durable_s"),
                       async_saves=sum(1 for r in usable if r.get("async")))


def read_costs(root: os.PathLike) -> List[Dict[str, Any]]:
    """The records of ``root``'s costs file; ``[]`` when there is none (a root written
    before measurements were kept). A file that is not a costs file raises
    :class:`~uckpt.errors.ManifestError` naming it."""
    path = Path(root) / COSTS_NAME
    hint = "delete it; the writer starts a new one"
    try:  # never through a symlink, never blocking (a FIFO), at most the cap + 1 bytes read
        fd = fsutil.open_regular(root, COSTS_NAME, what="save-costs file", wrong_type=ManifestError)
    except CheckpointNotFoundError:
        return []
    try:
        raw = fsutil.read_capped(fd, _MAX_FILE_BYTES, str(path), what="save-costs file",
                                 too_large=lambda msg, path: ManifestError(msg, path=path,
                                                                           hint=hint))
    finally:
        os.close(fd)
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise ManifestError(f"{path}: not valid JSON ({e})", path=str(path),
                            hint=hint) from None
    if not isinstance(doc, dict) or doc.get("kind") != KIND or doc.get("version") != VERSION \
            or not isinstance(doc.get("saves"), list):
        raise ManifestError(f"{path}: not a version-{VERSION} save-costs file (expected "
                            f'{{"kind": "{KIND}", "version": {VERSION}, "saves": [...]}})',
                            path=str(path), hint=hint)
    return [r for r in doc["saves"] if isinstance(r, dict)]


class CostRecorder:
    """Collects the manager's measurements of each save and writes them to ``root``.

    ``started`` at the call of ``save``; ``stalled``, ``committed`` and ``durable``
    as each becomes known (from any thread, in any order); a record is written
    once it is complete. ``root`` None (a first tier that is not a local directory, or a
    rank other than 0) keeps the records in memory only.
    """

    def __init__(self, root: Optional[os.PathLike]) -> None:
        self.root = Path(root) if root is not None else None
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._open: Dict[int, Dict[str, Any]] = {}  # step -> record being measured
        self.records: List[Dict[str, Any]] = []
        if self.root is not None:
            try:
                self.records = read_costs(self.root)[-KEEP:]
            except (UckptError, OSError) as e:
                log.warning("uckpt: ignoring the save costs recorded under %s: %s", self.root, e)

    def started(self, step: int, is_async: bool, durable: str) -> None:
        """A save of ``step`` begins. ``durable``: ``"commit"`` (one tier: durable once
        committed), ``"copy"`` (durable once copied: :meth:`durable` follows) or
        ``"never"`` (not copied to the durable tiers)."""
        with self._lock:
            self._open[step] = {"step": step, "async": is_async, "t0": time.monotonic(),
                                "mode": durable}
            while len(self._open) > 8:  # saves that failed never complete
                self._open.pop(next(iter(self._open)))

    def _note(self, step: int, key: str) -> None:
        with self._lock:
            rec = self._open.get(step)
            if rec is None:
                return
            rec[key] = time.monotonic() - rec["t0"]
            if key == "commit_s" and rec["mode"] == "commit":
                rec["durable_s"] = rec["commit_s"]
            if not ("stall_s" in rec and "commit_s" in rec
                    and ("durable_s" in rec or rec["mode"] == "never")):
                return
            del self._open[step]
            done = {k: v for k, v in rec.items() if k not in ("t0", "mode")}
            done["time"] = time.time()
            self.records = (self.records + [done])[-KEEP:]
        if self.root is not None:
            self._write()

    def remove_debris(self) -> None:
        """Remove what a writer killed while replacing the costs file left beside it."""
        if self.root is not None:
            try:
                remove_dead(self.root, COSTS_NAME)
            except OSError as e:  # measurements only: never fail for them
                log.warning("uckpt: could not clean up the save costs in %s: %s", self.root, e)

    def stalled(self, step: int) -> None:
        self._note(step, "stall_s")

    def committed(self, step: int) -> None:
        self._note(step, "commit_s")

    def durable(self, step: int) -> None:
        self._note(step, "durable_s")

    def summary(self) -> Optional[CostSummary]:
        with self._lock:
            return summarize(self.records)

    def _write(self) -> None:
        assert self.root is not None
        with self._write_lock:  # the newest records, whichever thread writes last
            with self._lock:
                doc = {"kind": KIND, "version": VERSION, "saves": list(self.records)}
            try:
                replace_file(self.root, COSTS_NAME,
                             (json.dumps(doc, separators=(",", ":")) + "\n").encode())
            except OSError as e:  # measurements only: never fail a save for them
                log.warning("uckpt: could not record save costs in %s: %s", self.root, e)
