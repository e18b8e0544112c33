"""The writer lock of a root on a blob store without advisory locks: a lock object with
a lease, on the versions of :class:`~uckpt.storage.blob.base.BlobStore`
(``create_versioned``, ``read_versioned``, ``replace_if``, ``delete_if``).

``<root>/.uckpt-writer.lock`` (exclusive), or ``<root>/.uckpt-writers/<job>`` for each
writer with ``concurrent_writers=True``, holds a JSON record: the holder's ``host``,
``pid``, ``job``, ``mode``, ``since`` (its clock, informative), ``lease_s`` and a ``nonce``
that changes with every write. See docs/format.md section 2 and docs/architecture.md.

* **Taking it.** ``create_versioned`` (S3: a PUT with ``If-None-Match: *``) creates it.
  If it exists, its holder is watched for at most the rest of its lease: a holder that
  rewrites it (a new version) is alive and keeps the root; one whose lease runs out is
  dead, and the new writer takes the lock over with ``replace_if`` on the version it read
  (S3: ``If-Match`` on the ETag), so two writers racing for a dead holder's lock cannot
  both win where the store is :attr:`~uckpt.storage.blob.base.BlobStore.versioned`. The
  takeover is logged at WARNING with the old holder's host, pid and job and how long its
  lease had expired.
* **Clocks.** Expiry is judged on the store's clock alone where it has one: the lock
  object's last write against the time of the answer that read it (S3: ``Last-Modified``
  and ``Date``, both whole seconds, so a second of margin is added). A store without a
  clock is watched on this process's monotonic clock for a whole lease after the first
  read. The holder measures
  its own lease on its monotonic clock from the moment it *sent* a renewal, which is never
  later than the store's ``Last-Modified``: it stops trusting the lease before anyone else
  may take it over. Only a difference in the *rate* of the two clocks (tiny) is left.
* **Renewing it.** The holder rewrites the object every third of its lease from a
  background thread, after reading it back to check that it still holds its own record,
  with ``replace_if`` on the version of its last write. A renewal refused (someone took the lock
  over or deleted it), or none succeeding before the lease runs out (the store was
  unreachable), loses the lease: :meth:`LeaseWriterLock.check` then raises
  :class:`~uckpt.errors.WriterLeaseLostError`, and the root's checkpoint layer calls it
  before every commit and deletion, so a writer that lost its lease never writes beside a
  new holder.
* **Stores without conditional writes.** Where a store is not ``versioned`` (or, S3,
  answers ``If-Match`` with ``NotImplemented``), the read-back before each renewal and
  after a takeover is the only check: two writers taking over the same dead lease at the
  same moment may then both believe they won until one of them reads the other's record
  at its next renewal (within a third of a lease), and a commit of the loser in that
  window is not prevented.
  SeaweedFS, MinIO and AWS S3 honour both conditions.
* **Records without a lease** (written by uckpt before leases) never expire: the refusal
  names the object to delete if their holder is dead.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Dict, List, NamedTuple, Optional, Set, Tuple

from ... import knobs
from ...errors import CheckpointNotFoundError, RootLockedError, UckptError, WriterLeaseLostError
from ..base import WriterLock

if TYPE_CHECKING:
    from .store import BlobCheckpointStore

log = logging.getLogger("uckpt.storage.checkpoint.lease_lock")

LOCK_NAME = ".uckpt-writer.lock"
CONCURRENT_DIR = ".uckpt-writers"  # one object per concurrent writer (concurrent_writers=True)
RECORD_CAP = 4096  # bytes read of a lock object at most
# (root, holder's job, no lease, level) that peek() has reported at INFO or above
_told: Set[Tuple[str, str, bool, int]] = set()
_told_guard = threading.Lock()
#: seconds added to a lease before it counts as expired: Last-Modified and Date are whole
#: seconds, so the time between them is known to within one second
GRANULARITY_S = 1.0


def utc(t: float) -> str:
    """``t`` (seconds since the epoch) as ``HH:MM:SS UTC``."""
    return time.strftime("%H:%M:%S UTC", time.gmtime(t))


class Seen(NamedTuple):
    """One read of a lock object."""
    record: Dict[str, object]
    etag: str
    modified: float    # store's clock (else this process's): its last write, or first read
    server_now: float  # store's clock (else this process's): this read

    @property
    def lease(self) -> Optional[float]:
        v = self.record.get("lease_s")
        if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1e9:
            return float(v)
        return None

    @property
    def expires(self) -> float:
        """When the lease runs out unless renewed (store's clock); only for a record with
        a lease."""
        return self.modified + (self.lease or 0.0) + GRANULARITY_S

    @property
    def expired_for(self) -> float:
        """Seconds since the lease ran out (negative: still valid); only for a record with
        a lease."""
        return self.server_now - self.expires


def describe(record: Dict[str, object]) -> str:
    if not record or "pid" not in record:
        return "another writer"
    return (f"process {record.get('pid', '?')} on host {record.get('host', '?')} "
            f"({record.get('mode', '?')} writer since {record.get('since', '?')}, job "
            f"{record.get('job', '?')})")


class LeaseWriterLock(WriterLock):
    """``<root>/.uckpt-writer.lock``, or with ``shared`` (concurrent writers)
    ``<root>/.uckpt-writers/<job>``, held under a lease of ``knobs.lock_lease_s`` (see the
    module docstring). A shared lock is refused while a live exclusive one exists, and an
    exclusive one while any live shared one exists.

    Call order: :meth:`try_acquire`, then :meth:`check` before each commit or deletion
    (the store does it), :meth:`release` at the end; :meth:`peek` is for readers."""

    one_per_job = True

    def __init__(self, store: BlobCheckpointStore, job: str, shared: bool,
                 lease_s: Optional[float] = None) -> None:
        self.store, self.blob = store, store.blob
        self.job, self.shared = job, shared
        self.root = store.where
        self.lease_s = float(lease_s if lease_s is not None else knobs.lock_lease_s)
        self.exclusive_key = store.key(LOCK_NAME)
        self.key = store.key(CONCURRENT_DIR, job) if shared else self.exclusive_key
        self.path = self.url(self.key)
        self._first_seen: Dict[Tuple[str, str], float] = {}  # (key, tag) -> wall clock
        self._held = False
        self._etag = ""
        self._nonce = ""
        self._since = ""
        self._valid_until = 0.0  # monotonic
        self._lost: Optional[str] = None
        self._refused: Optional[Tuple[str, str, Optional[Seen]]] = None  # verdict, key, seen
        self._stop = threading.Event()
        self._io = threading.Lock()  # renewals against release
        self._thread: Optional[threading.Thread] = None

    def url(self, key: str) -> str:
        return self.store.at(key[len(self.store.prefix):])

    # -- reading and writing lock objects ----------------------------------------------------
    def _record(self) -> bytes:
        import socket  # here, on first use: it imports selectors

        self._nonce = os.urandom(8).hex()  # a new ETag for every write
        return json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "job": self.job,
                           "mode": "shared" if self.shared else "exclusive",
                           "since": self._since, "lease_s": self.lease_s,
                           "nonce": self._nonce}).encode()

    def _look(self, key: str) -> Optional[Seen]:
        try:
            v = self.blob.read_versioned(key, RECORD_CAP)
        except CheckpointNotFoundError:
            return None
        try:
            record = json.loads(v.data.decode() or "{}")
        except ValueError:
            record = {}
        now = v.now if v.now is not None else time.time()
        # no store clock: a version counts from when this process first saw it
        modified = v.modified if v.modified is not None else \
            self._first_seen.setdefault((key, v.tag), now)
        return Seen(record if isinstance(record, dict) else {}, v.tag, modified, now)

    def _put_if_match(self, key: str, etag: str) -> Optional[str]:
        """Write our record over the version ``etag`` of ``key``; its new ETag, or None if
        that version is gone (another writer's write or deletion came first)."""
        tag = self.blob.replace_if(key, self._record(), etag)
        if tag is not None:
            return tag
        seen = self._look(key)  # a retry of a write whose answer was lost?
        return seen.etag if seen and seen.record.get("nonce") == self._nonce else None

    def _watch(self, key: str) -> Tuple[str, Optional[Seen]]:
        """Whether the holder of ``key`` is ``"live"`` (it rewrote the lock), ``"expired"``,
        ``"legacy"`` (a record without a lease) or ``"gone"``: watched for at most the rest
        of its lease."""
        first = seen = self._look(key)
        deadline = None
        while True:
            if seen is None or first is None:
                return "gone", first
            if seen.etag != first.etag:
                return "live", seen
            if seen.lease is None:
                return "legacy", seen
            if seen.expired_for >= 0:
                return "expired", seen
            if deadline is None:
                deadline = time.monotonic() - seen.expired_for + 2 * GRANULARITY_S
                log.info("%s holds the writer lock %s; waiting up to %.0f s for it to renew "
                         "its lease (alive) or for the lease to run out (dead)",
                         describe(seen.record), self.url(key), -seen.expired_for)
            elif time.monotonic() > deadline:  # the store's clock stands still?
                return "live", seen
            time.sleep(min(max(0.2, seen.lease / 12), 2.0, -seen.expired_for + 0.05))
            seen = self._look(key)

    # -- taking, renewing, giving up --------------------------------------------------------
    def try_acquire(self) -> Optional[Dict[str, object]]:
        self._refused, self._lost = None, None
        self._since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        etag, sent = None, 0.0  # the lease counts from when the write that took it was sent
        for _ in range(3):  # a lock removed while we watched it: try again
            sent = time.monotonic()
            etag = self.blob.create_versioned(self.key, self._record())
            if etag is not None:
                break
            verdict, seen = self._watch(self.key)  # it exists: is its holder alive?
            if verdict == "expired" and seen is not None:
                sent = time.monotonic()
                etag = self._put_if_match(self.key, seen.etag)
                if etag is not None:
                    self._took_over(self.key, seen, "took over")
                    break
                verdict, seen = "live", self._look(self.key)
            if verdict != "gone":
                return self._refuse(verdict, self.key, seen)
        if etag is None:
            return self._refuse("live", self.key, self._look(self.key))
        self._start(etag, sent)
        # the other kind of writer: each side checks after making its own claim (and
        # renews it meanwhile), so at least one of two racing writers sees the other
        for key in self._blockers():
            verdict, seen = self._watch(key)
            if verdict == "expired" and seen is not None:
                if self.blob.delete_if(key, seen.etag):
                    self._took_over(key, seen, "removed")
                    continue
                verdict, seen = "live", self._look(key)
            if verdict != "gone":
                self.release()
                return self._refuse(verdict, key, seen)
        log.info("writer of %s: %s (lease %g s, renewed every %g s)", self.root,
                 describe(json.loads(self._record())), self.lease_s, self.lease_s / 3)
        return None

    def _blockers(self) -> List[str]:
        if self.shared:
            return [self.exclusive_key] if self.blob.exists(self.exclusive_key) else []
        return sorted(k for k, _ in self.blob.list(self.store.key(CONCURRENT_DIR))
                      if k != self.key)

    def _took_over(self, key: str, seen: Seen, done: str) -> None:
        r = seen.record
        log.warning("%s the writer lock %s of process %s on host %s (job %s, %s writer): its "
                    "lease of %g s was last renewed at %s and had expired %.1f s ago (on the "
                    "store's clock); that writer is taken for dead", done,
                    self.url(key), r.get("pid", "?"), r.get("host", "?"),
                    r.get("job", "?"), r.get("mode", "?"), seen.lease, utc(seen.modified),
                    seen.expired_for)

    def _refuse(self, verdict: str, key: str, seen: Optional[Seen]) -> Dict[str, object]:
        self._refused = (verdict, key, seen)
        return (seen.record if seen else None) or {"pending": True}

    def _start(self, etag: str, sent: float) -> None:
        self._held, self._etag = True, etag
        self._valid_until = sent + self._trusted()
        self._stop.clear()
        self.store.lease = self
        self._thread = threading.Thread(target=self._renew_loop, name="uckpt-lock-lease",
                                        daemon=True)
        self._thread.start()

    def _trusted(self) -> float:
        """How long after sending a successful write the holder trusts its lease."""
        return self.lease_s - min(self.lease_s / 6, 5.0)

    def _renew_loop(self) -> None:
        interval = wait = self.lease_s / 3
        while not self._stop.wait(wait):
            sent = time.monotonic()
            try:
                with self._io:
                    if self._stop.is_set():
                        return
                    self._renew()
                self._valid_until = sent + self._trusted()
                wait = interval
            except WriterLeaseLostError as e:
                self._lose(str(e))
                return
            except UckptError as e:
                if time.monotonic() >= self._valid_until:
                    self._lose(f"no renewal succeeded for {self.lease_s:g} s (last error: {e})")
                    return
                log.warning("could not renew the writer lock %s (%s); retrying", self.path, e)
                wait = max(0.1, interval / 4)

    def _renew(self) -> None:
        seen = self._look(self.key)
        if seen is None or seen.etag != self._etag:
            raise WriterLeaseLostError(
                "it was deleted" if seen is None else f"it now holds {describe(seen.record)}")
        etag = self._put_if_match(self.key, self._etag)
        if etag is None:
            now = self._look(self.key)
            raise WriterLeaseLostError(f"another writer replaced it"
                                       f"{': ' + describe(now.record) if now else ''}")
        self._etag = etag

    def _lose(self, why: str) -> None:
        self._lost = f"{why} (at {utc(time.time())})"
        log.error("the writer lock %s of %s was lost: %s; this writer commits and deletes "
                  "nothing more there", self.path, self.root, self._lost)

    def check(self) -> None:
        """Raise :class:`~uckpt.errors.WriterLeaseLostError` if this writer's lease is
        lost or no longer trusted (not renewed in time)."""
        if not self._held:
            return
        if self._lost is None and time.monotonic() > self._valid_until:
            self._lose(f"its lease of {self.lease_s:g} s was not renewed in time")
        if self._lost is not None:
            raise WriterLeaseLostError(
                f"this process lost the writer lock {self.path} of checkpoint root "
                f"{self.root!r}: {self._lost}; it commits and deletes nothing more there",
                path=self.path, holder={},
                hint="checkpoints committed before are kept. Another job may write to this "
                     "root now: stop this one, or restart it (it restores the newest "
                     "checkpoint and takes the lock once no live writer holds it); if the "
                     "object store was unreachable, check the endpoint and the network")

    def holder(self) -> Dict[str, object]:
        if self._refused is not None and self._refused[2] is not None:
            return self._refused[2].record
        seen = self._look(self.key)
        return seen.record if seen else {}

    def refusal(self) -> RootLockedError:
        verdict, key, seen = self._refused or ("live", self.key, self._look(self.key))
        h = seen.record if seen else {}
        url = self.url(key)
        rm = f" (e.g. `aws s3 rm {url}`)" if url.startswith("s3://") else ""
        if verdict == "legacy":
            hint = (f"that lock has no lease (a uckpt without lock leases wrote it) and never "
                    f"expires: if its holder is dead, delete {url}{rm} "
                    "and save again; otherwise stop it, or use another root")
        else:
            when = (f"its lease runs until {utc(seen.expires)} and is renewed while it "
                    f"lives: if it is dead, wait until {utc(seen.expires)} and save again (a "
                    f"new writer takes an expired lease over), or delete {url}{rm}"
                    ) if seen and seen.lease else \
                f"if it is dead, delete {url}{rm} and save again"
            if h.get("mode") == "shared" and not self.shared:
                fix = ("concurrent writers hold this root: stop them, or pass "
                       "concurrent_writers=True to this writer too (every writer of a root "
                       "must opt in)")
            else:
                fix = "only one job may write to a root: stop that job, or use another root"
            hint = f"{fix}; {when}"
        return RootLockedError(f"checkpoint root {self.root!r} is held by {describe(h)}",
                               path=url, holder=h, hint=hint)

    def peek(self) -> Optional[Tuple[int, str]]:
        """A logging level and a sentence on who holds the root exclusively now, from one
        read (no waiting, no writes); None if nobody does (or the store cannot be read).
        A holder already reported by this process is reported again at DEBUG only (an
        evaluation job may open a manager every minute)."""
        try:
            seen = self._look(self.exclusive_key)
        except UckptError as e:
            log.debug("could not read the writer lock of %s: %s", self.root, e)
            return None
        if seen is None:
            return None
        level, text = self._verdict(seen)
        told = (self.root, str(seen.record.get("job")), seen.lease is None, level)
        with _told_guard:
            if told in _told:
                return logging.DEBUG, text
            _told.add(told)
        return level, text

    def _verdict(self, seen: Seen) -> Tuple[int, str]:
        who, url = describe(seen.record), self.url(self.exclusive_key)
        if seen.lease is None:
            return logging.WARNING, (
                f"{self.root} is held by {who} under a lock without a lease, which never "
                f"expires: a save here is refused until {url} is deleted (if its holder is "
                "dead)")
        if seen.expired_for >= 0:
            return logging.INFO, (
                f"the writer lock {url} of {who} expired {seen.expired_for:.0f} s ago: the "
                "first save here takes it over")
        return logging.WARNING, (
            f"{self.root} is written by {who}: its lease was renewed at {utc(seen.modified)} "
            f"and runs until {utc(seen.expires)}; a save here is refused while that writer "
            "renews it (pass role='reader' to only read)")

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None
        if not self._held:
            return
        self._held = False
        if getattr(self.store, "lease", None) is self:
            self.store.lease = None
        if self._lost is not None:
            return  # not ours any more
        try:
            with self._io:
                self.blob.delete_if(self.key, self._etag)  # never another writer's
        except Exception as e:  # noqa: BLE001 - best effort; say how to clean up
            log.warning("could not remove the writer lock %s (%s); it expires %g s after "
                        "its last renewal, or delete it by hand", self.path, e, self.lease_s)

    @property
    def held(self) -> bool:
        return self._held
