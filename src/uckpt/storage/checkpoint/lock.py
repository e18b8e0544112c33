"""The writer lock of a root on a blob store (see docs/architecture.md, "A root shared by
many processes"), chosen by the store's capabilities:

* ``advisory_locks`` (:class:`AdvisoryWriterLock`): the lock ``.uckpt-writer.lock``,
  exclusive (or shared with ``concurrent_writers=True``), held until released or the
  process ends; the holder keeps its record (host, pid, job, mode, since) in the lock's
  own object (:meth:`~uckpt.storage.blob.base.BlobLock.note`). It cannot be lost, so
  ``check`` does nothing;
* else (:class:`~.lease_lock.LeaseWriterLock`): the object ``.uckpt-writer.lock`` (or
  ``.uckpt-writers/<job>`` for each concurrent writer), made with ``create_versioned``
  and held under a lease that its holder renews (see :mod:`.lease_lock`).
"""
from __future__ import annotations

import json
import logging
import os
import time
from typing import TYPE_CHECKING, Any, Dict, Optional

from ...errors import RootLockedError, UckptError
from ..base import WriterLock
from .lease_lock import CONCURRENT_DIR, LOCK_NAME, LeaseWriterLock, describe

if TYPE_CHECKING:
    from ..blob.base import BlobLock
    from .store import BlobCheckpointStore

log = logging.getLogger("uckpt.storage.checkpoint.lock")

RECORD_CAP = 4096
#: a holder's record is padded to this length: every record of the lock the same length
RECORD_BYTES = 512

__all__ = ["AdvisoryWriterLock", "CONCURRENT_DIR", "LOCK_NAME", "LeaseWriterLock", "writer_lock"]


def writer_lock(store: BlobCheckpointStore, job: str, shared: bool) -> WriterLock:
    if store.blob.advisory_locks:
        return AdvisoryWriterLock(store, job, shared)
    if not store.blob.conditional_create:
        log.warning("%s has neither advisory locks nor an atomic create-if-absent: its writer "
                    "lock is checked but not exclusive, so two jobs started at the same moment "
                    "could both write to it; give each job its own root", store.where)
    return LeaseWriterLock(store, job, shared)


def record(job: str, shared: bool, **more: Any) -> Dict[str, Any]:
    import socket  # here, on first use: it imports selectors

    return {"host": socket.gethostname(), "pid": os.getpid(), "job": job,
            "mode": "shared" if shared else "exclusive",
            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **more}


def _hint(shared: bool, holder: Dict[str, Any]) -> str:
    if holder.get("mode") == "shared" and not shared:
        return ("concurrent writers hold this root: stop them, or pass concurrent_writers=True "
                "to this writer too (every writer of a root must opt in)")
    return ("only one job may write to a root while an exclusive writer holds it: stop that "
            "writer (its lock goes with its process), use another root, or open this one "
            "read-only (role='reader') to restore from it")


class AdvisoryWriterLock(WriterLock):
    """The store's advisory lock on ``.uckpt-writer.lock`` (see the module docstring)."""

    one_per_job = False  # every rank locks the copy of the root it sees

    def __init__(self, store: BlobCheckpointStore, job: str, shared: bool) -> None:
        self.store, self.blob, self.job, self.shared = store, store.blob, job, shared
        self._lock: Optional[BlobLock] = None

    def try_acquire(self) -> Optional[Dict[str, Any]]:
        try:
            self._lock = self.blob.lock(self.store.key(LOCK_NAME), shared=self.shared)
        except RootLockedError:
            return self.holder() or {"pending": True}
        mine = record(self.job, self.shared)
        self._lock.note(json.dumps(mine).encode().ljust(RECORD_BYTES))
        log.info("writer of %s: %s", self.store.where, mine)
        return None

    def holder(self) -> Dict[str, Any]:
        try:
            h = json.loads(self.blob.read(self.store.key(LOCK_NAME), RECORD_CAP).strip()
                           or b"{}")
        except (UckptError, ValueError):
            return {}
        return h if isinstance(h, dict) else {}

    def refusal(self) -> RootLockedError:
        h = self.holder()
        return RootLockedError(f"checkpoint root {self.store.where!r} is held by {describe(h)}",
                               path=self.store.at(LOCK_NAME), holder=h,
                               hint=_hint(self.shared, h))

    def release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    @property
    def held(self) -> bool:
        return self._lock is not None
