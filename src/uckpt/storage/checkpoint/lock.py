"""The writer lock of a root on a blob store (see docs/architecture.md, "A root shared by
many processes"), chosen by the store's capabilities:

* ``advisory_locks`` (:class:`AdvisoryWriterLock`): the lock ``.uckpt-writer.lock``,
  exclusive (or shared with ``concurrent_writers=True``), held until released or the
  process ends; the holder's record is the object ``.uckpt-writer.json``. It cannot be
  lost, so ``check`` does nothing;
* else (:class:`LeaseWriterLock`): the object ``.uckpt-writer.lock`` (or
  ``.uckpt-writers/<job>`` for each concurrent writer) made with ``create_if_absent``,
  holding the holder's record and a nonce that changes with every renewal. Its holder
  rewrites it every third of its lease (``knobs.lock_lease_s``); another writer watches
  it, on its own monotonic clock, for at most a lease and a half: a record that changed
  is a live holder (refused), one that did not is a dead one, whose object is removed
  and created anew (the record read back decides which of two racing writers won). A
  holder that cannot renew in time loses the lease: :meth:`LeaseWriterLock.check`
  (called before every commit and deletion) raises WriterLeaseLostError. Where
  ``create_if_absent`` is not atomic (no ``conditional_create``) two writers starting at
  the same moment are told apart only at the first renewal.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple

from ... import knobs
from ...errors import CheckpointNotFoundError, RootLockedError, UckptError, WriterLeaseLostError
from ..base import WriterLock

if TYPE_CHECKING:
    from ..blob.base import BlobLock
    from .store import BlobCheckpointStore

log = logging.getLogger("uckpt.storage.checkpoint.lock")

LOCK_NAME = ".uckpt-writer.lock"
RECORD_NAME = ".uckpt-writer.json"
CONCURRENT_DIR = ".uckpt-writers"
RECORD_CAP = 4096


def writer_lock(store: BlobCheckpointStore, job: str, shared: bool) -> WriterLock:
    if store.blob.advisory_locks:
        return AdvisoryWriterLock(store, job, shared)
    return LeaseWriterLock(store, job, shared)


def record(job: str, shared: bool, **more: Any) -> Dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid(), "job": job,
            "mode": "shared" if shared else "exclusive",
            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **more}


def describe(h: Dict[str, Any]) -> str:
    if not h or "pid" not in h:
        return "another writer"
    return (f"process {h.get('pid', '?')} on host {h.get('host', '?')} "
            f"({h.get('mode', '?')} writer since {h.get('since', '?')}, job {h.get('job', '?')})")


def _hint(shared: bool, holder: Dict[str, Any], tail: str) -> str:
    if holder.get("mode") == "shared" and not shared:
        fix = ("concurrent writers hold this root: stop them, or pass concurrent_writers=True "
               "to this writer too (every writer of a root must opt in)")
    else:
        fix = ("only one job may write to a root: stop that job, use another root, or open "
               "this one read-only (role='reader') to restore from it")
    return f"{fix}{tail}"


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
        self.blob.write(self.store.key(RECORD_NAME), json.dumps(mine).encode())
        log.info("writer of %s: %s", self.store.where, mine)
        return None

    def holder(self) -> Dict[str, Any]:
        try:
            h = json.loads(self.blob.read(self.store.key(RECORD_NAME), RECORD_CAP))
        except (UckptError, ValueError):
            return {}
        return h if isinstance(h, dict) else {}

    def refusal(self) -> RootLockedError:
        h = self.holder()
        return RootLockedError(f"checkpoint root {self.store.where!r} is held by {describe(h)}",
                               path=self.store.location(LOCK_NAME), holder=h,
                               hint=_hint(self.shared, h, " (its lock goes with its process)"))

    def release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    @property
    def held(self) -> bool:
        return self._lock is not None


class LeaseWriterLock(WriterLock):
    """A lock object held under a lease (see the module docstring)."""

    one_per_job = True  # every rank sees the same objects: one rank takes it for the job

    def __init__(self, store: BlobCheckpointStore, job: str, shared: bool,
                 lease_s: Optional[float] = None) -> None:
        self.store, self.blob, self.job, self.shared = store, store.blob, job, shared
        self.lease_s = float(lease_s if lease_s is not None else knobs.lock_lease_s)
        self.exclusive_key = store.key(LOCK_NAME)
        self.key = store.key(CONCURRENT_DIR, job) if shared else self.exclusive_key
        self._mine: Dict[str, Any] = {}
        self._held = False
        self._valid_until = 0.0  # monotonic
        self._lost: Optional[str] = None
        self._refused: Dict[str, Any] = {}
        self._stop = threading.Event()
        self._io = threading.Lock()
        self._thread: Optional[threading.Thread] = None

    def _data(self) -> bytes:
        self._mine["nonce"] = os.urandom(8).hex()
        return json.dumps(self._mine).encode()

    def _look(self, key: str) -> Optional[Dict[str, Any]]:
        try:
            data = self.blob.read(key, RECORD_CAP)
        except CheckpointNotFoundError:
            return None
        try:
            h = json.loads(data.decode() or "{}")
        except ValueError:
            h = {}
        return h if isinstance(h, dict) else {}

    def _watch(self, key: str) -> Tuple[str, Optional[Dict[str, Any]]]:
        """``"gone"``, ``"live"`` (its record changed), ``"legacy"`` (no lease: never
        expires) or ``"expired"`` (unchanged for a lease and a half)."""
        first = self._look(key)
        if first is None:
            return "gone", None
        lease = first.get("lease_s")
        if not isinstance(lease, (int, float)) or isinstance(lease, bool) or lease <= 0:
            return "legacy", first
        deadline = time.monotonic() + 1.5 * float(lease)
        log.info("%s holds the writer lock %s; watching it for up to %.0f s to tell a live "
                 "holder (it renews) from a dead one", describe(first),
                 self.store.location(key[len(self.store.prefix):]), 1.5 * lease)
        while time.monotonic() < deadline:
            time.sleep(min(max(0.05, float(lease) / 12), 2.0))
            seen = self._look(key)
            if seen is None:
                return "gone", None
            if seen != first:
                return "live", seen
        return "expired", first

    def try_acquire(self) -> Optional[Dict[str, Any]]:
        self._refused, self._lost = {}, None
        self._mine = record(self.job, self.shared, lease_s=self.lease_s)
        for _ in range(3):
            sent = time.monotonic()
            if self.blob.create_if_absent(self.key, self._data()):
                if self._look(self.key) == self._mine:  # read back: the race's winner
                    break
                return self._refuse(self._look(self.key) or {})
            verdict, seen = self._watch(self.key)
            if verdict == "expired":
                self._took_over(seen or {})
                self.blob.delete(self.key)
                continue
            if verdict != "gone":
                return self._refuse(seen or {})
        else:
            return self._refuse(self._look(self.key) or {})
        self._start(sent)
        for key in self._blockers():
            verdict, seen = self._watch(key)
            if verdict == "expired":
                self._took_over(seen or {})
                self.blob.delete(key)
            elif verdict != "gone":
                self.release()
                return self._refuse(seen or {})
        log.info("writer of %s: %s (lease %g s, renewed every %g s)", self.store.where,
                 describe(self._mine), self.lease_s, self.lease_s / 3)
        return None

    def _blockers(self) -> list[str]:
        if self.shared:
            return [self.exclusive_key] if self.blob.exists(self.exclusive_key) else []
        return [k for k, _ in self.blob.list(self.store.key(CONCURRENT_DIR)) if k != self.key]

    def _took_over(self, seen: Dict[str, Any]) -> None:
        log.warning("took over the writer lock of %s: %s did not renew its lease of %s s; "
                    "that writer is taken for dead", self.store.where, describe(seen),
                    seen.get("lease_s", "?"))

    def _refuse(self, seen: Dict[str, Any]) -> Dict[str, Any]:
        self._refused = seen
        return seen or {"pending": True}

    def _start(self, sent: float) -> None:
        self._held = True
        self._valid_until = sent + self._trusted()
        self._stop.clear()
        self.store.lease = self
        self._thread = threading.Thread(target=self._renew_loop, name="uckpt-lock-lease",
                                        daemon=True)
        self._thread.start()

    def _trusted(self) -> float:
        return self.lease_s - min(self.lease_s / 6, 5.0)

    def _renew_loop(self) -> None:
        interval = wait = self.lease_s / 3
        while not self._stop.wait(wait):
            sent = time.monotonic()
            try:
                with self._io:
                    if self._stop.is_set():
                        return
                    seen = self._look(self.key)
                    if seen != self._mine:
                        raise WriterLeaseLostError(
                            "it was deleted" if seen is None else
                            f"it now holds {describe(seen)}")
                    self.blob.write(self.key, self._data())
                self._valid_until = sent + self._trusted()
                wait = interval
            except WriterLeaseLostError as e:
                self._lose(str(e))
                return
            except UckptError as e:
                if time.monotonic() >= self._valid_until:
                    self._lose(f"no renewal succeeded for {self.lease_s:g} s (last error: {e})")
                    return
                log.warning("could not renew the writer lock of %s (%s); retrying",
                            self.store.where, e)
                wait = max(0.1, interval / 4)

    def _lose(self, why: str) -> None:
        self._lost = f"{why} (at {time.strftime('%H:%M:%S UTC', time.gmtime())})"
        log.error("the writer lock of %s was lost: %s; this writer commits and deletes "
                  "nothing more there", self.store.where, self._lost)

    def check(self) -> None:
        if not self._held:
            return
        if self._lost is None and time.monotonic() > self._valid_until:
            self._lose(f"its lease of {self.lease_s:g} s was not renewed in time")
        if self._lost is not None:
            raise WriterLeaseLostError(
                f"this process lost the writer lock of checkpoint root "
                f"{self.store.where!r}: {self._lost}; it commits and deletes nothing more "
                "there", path=self.store.location(LOCK_NAME), holder={},
                hint="checkpoints committed before are kept. Another job may write to this "
                     "root now: stop this one, or restart it (it restores the newest "
                     "checkpoint and takes the lock once no live writer holds it)")

    def holder(self) -> Dict[str, Any]:
        return self._refused or self._look(self.key) or {}

    def refusal(self) -> RootLockedError:
        h = self.holder()
        where = self.store.location(self.key[len(self.store.prefix):])
        if h and "lease_s" not in h:
            tail = (f"; that lock has no lease and never expires: if its holder is dead, "
                    f"delete {where} and save again")
        else:
            tail = (f"; a dead holder's lease runs out {h.get('lease_s', '?')} s after its "
                    f"last renewal (save again then), or delete {where}")
        return RootLockedError(f"checkpoint root {self.store.where!r} is held by {describe(h)}",
                               path=where, holder=h, hint=_hint(self.shared, h, tail))

    def peek(self) -> Optional[Tuple[int, str]]:
        try:
            seen = self._look(self.exclusive_key)
        except UckptError as e:
            log.debug("could not read the writer lock of %s: %s", self.store.where, e)
            return None
        if seen is None:
            return None
        return logging.WARNING, (f"{self.store.where} is written by {describe(seen)} (under "
                                 f"a lease of {seen.get('lease_s', '?')} s): a save here is "
                                 "refused while that writer renews it (pass role='reader' "
                                 "to only read)")

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None
        if not self._held:
            return
        self._held = False
        if self.store.lease is self:
            self.store.lease = None
        if self._lost is not None:
            return  # not ours any more
        try:
            with self._io:
                if self._look(self.key) == self._mine:  # never another writer's
                    self.blob.delete(self.key)
        except UckptError as e:
            log.warning("could not remove the writer lock of %s (%s); it expires %g s after "
                        "its last renewal", self.store.where, e, self.lease_s)

    @property
    def held(self) -> bool:
        return self._held
