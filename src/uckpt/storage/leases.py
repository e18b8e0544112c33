"""Who may touch what in a checkpoint root: save leases, the writer lock, debris removal.

A root (``CheckpointManager``'s directory of ``step_*`` checkpoints) is shared by
one *writer* job (one process, or every rank of one job) and any number of
*readers* (evaluation jobs, ``uckpt ls/inspect/verify``). See docs/architecture.md,
"A root shared by many processes".

* **Save lease.** Every save (and every copy to a tier) creates its hidden
  temporary directory through :func:`make_tmp_dir` and holds an exclusive
  ``flock`` on that directory until it is committed or removed. The kernel drops
  the lock when the process dies, so "locked" means "a live save is writing
  here" and "unlocked" means debris. Where the file system cannot lock
  directories, the age of the directory decides (``knobs.debris_expiry_s``).
* **Writer lock.** A manager becomes the root's writer at its first save (or at
  construction with ``role="writer"``) by taking ``flock`` on
  ``<root>/.uckpt-writer.lock``: exclusive, or shared with ``concurrent_writers=True``.
  The file holds the holder's host, pid and job id, so a refused writer can be told
  who holds the root. Several ranks of one job agree on one job id.
* **Debris removal** (:func:`remove_debris`) runs only in the writer, and removes
  only hidden directories of dead saves and deletions; it never touches a live
  save's directory, and never follows a symlink.

Call order: the writer calls :meth:`WriterLock.try_acquire` once per root, then
:func:`remove_debris`; each save calls :func:`make_tmp_dir` and, after the commit
or the failure, :meth:`TmpLease.release`. Readers call none of these.
"""
from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import secrets
import socket
import stat
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple

from . import fsutil
from .. import knobs
from ..errors import RootLockedError
from .save_errors import raise_save_failure
from .base import WriterLock as LockBase

log = logging.getLogger("uckpt.storage.leases")

TMP_MARK = ".uckpt-tmp-"  # a save in progress (or killed): never visible
OLD_MARK = ".uckpt-old-"  # a committed checkpoint being replaced by overwrite=True
DEL_MARK = ".uckpt-del-"  # a checkpoint being deleted by retention
LOCK_NAME = ".uckpt-writer.lock"
_RECORD_BYTES = 512  # the holder record is written in one pwrite of this size

# temporary directories of this process's live saves: flock cannot tell them apart
# from dead ones where the kernel emulates it with per-process POSIX locks (NFS)
_live: Set[str] = set()
_live_guard = threading.Lock()
_UNSUPPORTED = (errno.EBADF, errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


class TmpLease:
    """A save's hold on its temporary directory: released after commit or removal."""

    def __init__(self, path: Path, fd: Optional[int]) -> None:
        self.path = path
        self._fd = fd

    def release(self) -> None:
        with _live_guard:
            _live.discard(os.fspath(self.path))
        if self._fd is not None:
            os.close(self._fd)  # drops the flock
            self._fd = None

    def __enter__(self) -> "TmpLease":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def tmp_name(directory: Path) -> Path:
    return directory.parent / f".{directory.name}{TMP_MARK}{secrets.token_hex(4)}"


@contextmanager
def _birth_guard(root: Path, exclusive: bool) -> Iterator[None]:
    """``flock`` on the root directory itself: shared while a save creates and locks
    its temporary entry, exclusive while the writer judges what is debris. So an
    entry is never seen between its creation and its lock (it would pass for a dead
    save's). Where directories cannot be locked (NFS), nothing is held: age decides."""
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        except OSError as e:
            if e.errno not in _UNSUPPORTED:
                raise
        yield
    finally:
        os.close(fd)  # drops the flock


def make_tmp_dir(directory: Path) -> TmpLease:
    """Create the hidden temporary directory of a save of ``directory``, locked."""
    path = tmp_name(directory)
    return new_leased_dir(path)


def new_leased_dir(path: Path) -> TmpLease:
    """Create ``path`` (raises FileExistsError if it exists) and lock it, as one step
    for the writer's debris removal (see :func:`_birth_guard`)."""
    with _birth_guard(path.parent, exclusive=False):
        path.mkdir()
        return lease_dir(path)


def replace_file(root: Path, name: str, data: bytes) -> None:
    """Replace ``root/name`` (a root-level file such as the save-costs file) by ``data``
    atomically, through a locked hidden temporary file: one left by a killed process
    is unlocked, and the writer's :func:`remove_debris` removes it. Not fsynced."""
    tmp = root / f"{name}{TMP_MARK}{secrets.token_hex(4)}"
    with _birth_guard(root, exclusive=False):
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in _UNSUPPORTED:
                os.close(fd)
                raise
    try:
        fsutil.write_all(fd, data)
        os.replace(tmp, root / name)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    finally:
        os.close(fd)


def lease_dir(path: Path) -> TmpLease:
    """Lock ``path`` (a directory this save created) for the life of the save."""
    with _live_guard:
        _live.add(os.fspath(path))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return TmpLease(path, None)  # only the in-process registry protects it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        log.debug("cannot lock %s (%s): debris there will be judged by age", path, e)
    return TmpLease(path, fd)


def _is_live(path: str, st: os.stat_result) -> Tuple[bool, str]:
    """Whether a hidden temporary entry (a save's directory, or a root-level file being
    replaced) belongs to a live process, and why."""
    with _live_guard:
        if path in _live:
            return True, "a save of this process is writing it"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return True, "gone"  # removed or committed meanwhile: nothing to do
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True, "locked by a live process"
    except OSError as e:
        if e.errno not in _UNSUPPORTED:
            raise
        age = time.time() - st.st_mtime
        if age < knobs.debris_expiry_s:
            return True, f"cannot be locked here and is only {age:.0f} s old"
        return False, f"cannot be locked here and is {age:.0f} s old"
    finally:
        os.close(fd)
    return False, "no live process holds it"


def _is_debris_name(name: str) -> bool:
    return (name.startswith(".step_") and ".uckpt-" in name) or \
        (name.startswith(".uckpt-") and TMP_MARK in name)


def remove_debris(root: Path, manifest_name: str) -> List[str]:
    """Remove what dead saves and deletions left under ``root``; put back a
    half-replaced checkpoint. Writer only. Returns the names removed.

    An overwrite without atomic exchange renames the old checkpoint aside
    before moving the new one in; if the process died in between, the old one
    is renamed back. Symlinks are unlinked, never followed. Which temporary
    entries are dead is judged under the root's exclusive birth guard, so a save
    creating its directory at that moment is never taken for debris.
    """
    removed: List[str] = []
    dead: Dict[str, str] = {}  # path of a dead temporary entry -> why
    try:
        with _birth_guard(root, exclusive=True):
            with os.scandir(root) as it:
                entries = [e for e in it if _is_debris_name(e.name)]
            for e in entries:
                if TMP_MARK not in e.name:
                    continue
                try:
                    st = os.lstat(e.path)
                except FileNotFoundError:
                    continue
                if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
                    live, why = _is_live(e.path, st)
                    if live:
                        log.debug("kept %s: %s", e.path, why)
                    else:
                        dead[e.path] = why
    except FileNotFoundError:
        return removed
    for e in entries:
        try:
            st = os.lstat(e.path)
            is_dir = stat.S_ISDIR(st.st_mode)
            ours = is_dir or (stat.S_ISREG(st.st_mode) and e.name.startswith(".uckpt-"))
            if stat.S_ISLNK(st.st_mode) or not ours:
                os.unlink(e.path)
                log.info("removed %s: not a directory uckpt made (%s)", e.path, _kind(st))
                removed.append(e.name)
                continue
            name = e.name[1:].split(".uckpt-")[0]
            if TMP_MARK in e.name:
                if e.path not in dead:
                    continue
                if is_dir:
                    fsutil.remove_tree(e.path)
                    log.info("removed %s: an interrupted save (%s)", e.path, dead[e.path])
                else:
                    os.unlink(e.path)
                    log.info("removed %s: an interrupted replacement (%s)", e.path, dead[e.path])
            elif not is_dir:
                continue  # a root-level file of uckpt's that is not temporary
            elif OLD_MARK in e.name and not (root / name).exists() and \
                    os.path.exists(os.path.join(e.path, manifest_name)):
                os.rename(e.path, root / name)
                log.info("put back %s as %s: an overwrite was interrupted", e.path, name)
                continue
            elif OLD_MARK in e.name or DEL_MARK in e.name:
                fsutil.remove_tree(e.path)
                log.info("removed %s: an interrupted %s", e.path,
                         "deletion" if DEL_MARK in e.name else "overwrite")
            else:
                continue
            removed.append(e.name)
        except FileNotFoundError:
            pass  # another rank sharing this root did it first
    return removed


def _kind(st: os.stat_result) -> str:
    return {stat.S_IFLNK: "a symlink", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket",
            stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
            stat.S_IFREG: "a regular file"}.get(stat.S_IFMT(st.st_mode), "an odd entry")


class WriterLock(LockBase):
    """This process's hold on ``<root>/.uckpt-writer.lock`` (see the module docstring)."""

    one_per_job = False  # every rank locks the copy of the root it sees (node-local roots)

    def __init__(self, root: Path, job: str, shared: bool) -> None:
        self.root = root
        self.job = job
        self.shared = shared
        self._fd: Optional[int] = None

    @property
    def path(self) -> Path:
        return self.root / LOCK_NAME

    def try_acquire(self) -> Optional[Dict[str, Any]]:
        """Try to take the lock. Returns None when held (or when this file system
        cannot lock: then the root is not protected, and a warning says so), else
        the record of the holder that keeps us out (possibly a rank of our own job)."""
        # read-only where flock allows it (a file open for writing keeps a file system from
        # being remounted read-only); NFS maps flock to POSIX locks, which need write access
        fd, mode = None, fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX
        for flags in (os.O_RDONLY, os.O_RDWR):
            fd = os.open(self.path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                os.close(fd)
                return {"pending": True}
            except OSError as e:
                if e.errno == errno.EBADF and flags == os.O_RDONLY:
                    os.close(fd)
                    continue
                if e.errno not in _UNSUPPORTED:
                    os.close(fd)
                    raise
                log.warning("the file system of %s cannot lock files (%s): a second writer on "
                            "this root will not be detected", self.root, e)
                break
        assert fd is not None  # the loop opened it
        self._fd = fd
        record = {"host": socket.gethostname(), "pid": os.getpid(), "job": self.job,
                  "mode": "shared" if self.shared else "exclusive",
                  "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        self._write_record(fd, json.dumps(record).encode().ljust(_RECORD_BYTES))
        log.info("writer of %s: %s", self.root, record)
        return None

    def _write_record(self, fd: int, data: bytes) -> None:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDWR:
            os.pwrite(fd, data, 0)  # a POSIX lock: closing another descriptor would drop it
            return
        wfd = os.open(self.path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.pwrite(wfd, data, 0)
        finally:
            os.close(wfd)

    def holder(self) -> Dict[str, Any]:
        """The record written by the latest holder (read without locking)."""
        try:
            with open(self.path, "rb") as f:
                record = json.loads(f.read(_RECORD_BYTES).decode().strip() or "{}")
                return record if isinstance(record, dict) else {}
        except (OSError, ValueError):
            return {}

    def refusal(self) -> RootLockedError:
        h = self.holder()
        who = (f"process {h.get('pid', '?')} on host {h.get('host', '?')} "
               f"({h.get('mode', '?')} writer since {h.get('since', '?')})"
               ) if h else "another process"
        # the kernel drops the lock when its holder dies: whoever holds it is alive
        if self.shared or h.get("mode") != "shared":
            hint = ("only one job may write to a root while an exclusive writer holds it: "
                    "stop that writer (its lock goes with its process), use another root, or "
                    "open this one read-only (role='reader') to restore from it")
        else:
            hint = ("concurrent writers hold this root: stop them, or pass "
                    "concurrent_writers=True to this writer too (every writer of a root must "
                    "opt in)")
        return RootLockedError(f"checkpoint root {str(self.root)!r} is held by {who}",
                               path=str(self.path), holder=h, hint=hint)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None


def check_roots(stores: List[Any], comm: Any) -> None:
    """What a manager that may become the writer (``role="auto"``) learns at construction:
    on rank 0, log who holds each root whose lock can be looked at without taking it (an
    object store's). Reads only; never raises (a store that cannot be read is left to the
    first save)."""
    if comm.rank != 0:
        return
    for store in stores:  # peek() is None for a lock that cannot be looked at
        seen = store.writer_lock("", False).peek()
        if seen is not None:
            log.log(seen[0], "%s", seen[1])


def check_leases(locks: List[Any], comm: Any) -> None:
    """Collective: raise :class:`~uckpt.errors.WriterLeaseLostError` (with several ranks a
    :class:`~uckpt.errors.DistributedError` on every rank) if a lock of this writer job
    lost its lease. Nothing to do, and no collective, for locks without leases."""
    if not any(lock.one_per_job for lock in locks):
        return
    if comm.size == 1:
        for lock in locks:
            lock.check()
    else:
        comm.gather_outcomes(lambda: [lock.check() for lock in locks],
                             "checking the writer locks")


def new_job_id() -> str:
    return secrets.token_hex(8)


def claim_roots(stores: List[Any], comm: Any, shared: bool) -> List[Any]:
    """Collective (every rank of the writer job): take the writer lock of every root (a
    :class:`~uckpt.storage.base.Store`), creating the roots; raise
    :class:`RootLockedError` (with several ranks: a
    :class:`~uckpt.errors.DistributedError` on every rank) when another job holds one.
    A lock that one rank takes for the whole job (an object store's) is taken by rank 0."""
    job = comm.broadcast(new_job_id() if comm.rank == 0 else None)
    locks = [store.writer_lock(job, shared) for store in stores]

    def take() -> List[bool]:
        got = []
        for store, lock in zip(stores, locks):
            if lock.one_per_job and comm.rank != 0:
                got.append(True)
                continue
            try:
                store.prepare_root()
                got.append(lock.try_acquire() is None)
            except OSError as e:
                raise_save_failure(e, f"opening checkpoint root {str(store.where)!r} for "
                                      "writing", store.where)
        return got

    def check(got: List[bool]) -> None:
        for lock, ok in zip(locks, got):
            if not ok and lock.holder().get("job") != job:  # not a rank of this job
                raise lock.refusal()

    try:
        if comm.size == 1:
            check(take())
        else:
            got = comm.gather_outcomes(take, "claiming the checkpoint roots")[comm.rank]
            comm.gather_outcomes(lambda: check(got), "claiming the checkpoint roots")
    except BaseException:
        for lock in locks:
            lock.release()
        raise
    return locks
