"""A local root's archives and records (:mod:`uckpt.storage.archive`): a checkpoint is
moved into an archive by one ``rename`` (atomic: it is in one place or the other), and a
base it refers to is linked there file by file (a hard link, else a copy renamed into
place), the manifest last."""
from __future__ import annotations

import contextlib
import logging
import os
import secrets
import stat
from pathlib import Path
from typing import List, Optional

from . import fsutil
from ..errors import UckptError
from ..format import MANIFEST_NAME
from .leases import TMP_MARK, replace_file
from .archive import ARCHIVE_NAME, MAX_RECORD_BYTES

log = logging.getLogger("uckpt.storage.archive")


def read_record(root: Path, name: str) -> Optional[bytes]:
    path = root / name
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:  # a symlink, or unreadable: not a record uckpt wrote
        log.warning("ignored %s: %s", path, e)
        return b""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return b""
        return fsutil.read_capped(fd, MAX_RECORD_BYTES, str(path), what="record")
    except UckptError as e:
        log.warning("ignored %s: %s", path, e)
        return b""
    finally:
        os.close(fd)


def put_record(root: Path, name: str, data: bytes) -> None:
    replace_file(root, name, data)
    fd = os.open(root / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    fsutil.fsync_dir(root)


def drop_record(root: Path, name: str) -> None:
    try:
        os.unlink(root / name)
    except FileNotFoundError:
        return  # another rank sharing the root removed it
    fsutil.fsync_dir(root)


def archive(root: Path, name: str, into: str, keep: bool) -> bool:
    here, shelf = root / name, root / into
    there = shelf / name
    shelf.mkdir(exist_ok=True)
    if keep:
        if (there / MANIFEST_NAME).exists():
            return True
        if not (here / MANIFEST_NAME).exists():
            return False
        there.mkdir(exist_ok=True)
        with os.scandir(there) as it:  # a copy a kill interrupted (no hard links here)
            for e in it:
                if TMP_MARK in e.name and e.is_file(follow_symlinks=False):
                    os.unlink(e.path)
        with os.scandir(here) as it:
            files = sorted(e.name for e in it
                           if e.is_file(follow_symlinks=False) and e.name != MANIFEST_NAME)
        for f in files + [MANIFEST_NAME]:  # the manifest last: it commits the copy
            _link(here / f, there / f)
        fsutil.fsync_dir(there)
        fsutil.fsync_dir(shelf)
        return True
    try:
        os.rename(here, there)
    except FileNotFoundError:  # moved before a kill, or by another rank sharing the root
        return (there / MANIFEST_NAME).exists()
    fsutil.fsync_dir(root)
    fsutil.fsync_dir(shelf)
    return True


def _link(src: Path, dst: Path) -> None:
    """``dst`` holds ``src``'s bytes: a hard link, else (a file system without them) a
    copy written under a temporary name and renamed into place."""
    try:
        os.link(src, dst, follow_symlinks=False)
        return
    except FileExistsError:
        return
    except OSError as e:
        log.debug("no hard link %s -> %s (%s): copying", src, dst, e)
    tmp = dst.with_name(f".{dst.name}{TMP_MARK}{secrets.token_hex(4)}")
    fd_in = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fd_out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            fsutil.copy_range(fd_in, fd_out, os.fstat(fd_in).st_size)
            os.fsync(fd_out)
        finally:
            os.close(fd_out)
        os.replace(tmp, dst)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    finally:
        os.close(fd_in)


def archives(root: Path) -> List[str]:
    try:
        with os.scandir(root) as it:
            names = [e.name for e in it
                     if ARCHIVE_NAME.match(e.name) and e.is_dir(follow_symlinks=False)]
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(names)
