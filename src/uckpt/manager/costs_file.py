"""Replacing the save-costs file of a local root (:mod:`uckpt.manager.costs`) so that a
writer killed mid-replacement leaves nothing for good.

The new contents go to a hidden ``<name>.uckpt-tmp-XXXXXXXX`` file beside it, held under
an exclusive ``flock`` while written, then renamed over it; before that, the temporary
files whose lock is free (their writer died) are removed. A shared ``flock`` on the root
directory is held while a temporary file is created and locked, an exclusive one while
the dead ones are judged, so one created but not yet locked is never taken for dead.
Where the file system cannot lock, nothing is removed (those files are small).
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
from pathlib import Path
from typing import Iterator

from ..storage import fsutil
from ..storage.checkpoint.names import TMP_MARK

log = logging.getLogger("uckpt.manager.costs")

_UNSUPPORTED = (errno.EBADF, errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)
_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def replace_file(root: Path, name: str, data: bytes) -> None:
    """Replace ``root/name`` by ``data`` atomically (not fsynced: losing it loses only
    measurements), removing the temporary files of dead replacements first."""
    remove_dead(root, name)
    tmp = root / f"{name}{TMP_MARK}{os.urandom(4).hex()}"
    with _root_lock(root, fcntl.LOCK_SH):
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
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    finally:
        os.close(fd)


def remove_dead(root: Path, name: str) -> None:
    """Unlink ``name``'s temporary files in ``root`` whose lock is free (their writer died);
    never follows a symlink, never blocks on a temporary file."""
    with _root_lock(root, fcntl.LOCK_EX):
        _remove_dead(root, name)


def _remove_dead(root: Path, name: str) -> None:
    with os.scandir(root) as it:
        found = [e.name for e in it if e.name.startswith(name + TMP_MARK)]
    for tmp in found:
        try:
            fd = os.open(root / tmp, _OPEN)
        except OSError:
            continue  # gone, or not a file to open (left to whoever made it)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # held by a live writer, or no locks here
        finally:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(root / tmp)
            log.info("removed %s: an interrupted replacement of %s", root / tmp, name)


@contextlib.contextmanager
def _root_lock(root: Path, how: int) -> Iterator[None]:
    """``flock`` on the directory ``root`` (nothing where it cannot be locked)."""
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, how)
        except OSError as e:
            if e.errno not in _UNSUPPORTED:
                raise
        yield
    finally:
        os.close(fd)
