"""File-system primitives for atomic commit: fsync, durable rename, exchange."""
from __future__ import annotations

import ctypes
import errno
import os
import shutil
from pathlib import Path


def fsync_dir(path) -> None:
    fd = os.open(os.fspath(path), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_durably(path, data: bytes) -> None:
    """Write ``data`` to ``path`` (new file) and fsync it."""
    fd = os.open(os.fspath(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    finally:
        os.close(fd)


def pread_into(fd: int, buf, offset: int) -> int:
    """Fill ``buf`` from ``fd`` at ``offset``; returns bytes read (short only at EOF)."""
    view = memoryview(buf).cast("B")
    total = 0
    while total < len(view):
        n = os.preadv(fd, [view[total:]], offset + total)
        if n == 0:
            break
        total += n
    return total


def preallocate(fd: int, size: int) -> None:
    """Reserve ``size`` bytes so a full disk fails now, before any data is written."""
    if size <= 0 or not hasattr(os, "posix_fallocate"):
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            return  # file system cannot preallocate; writes will report ENOSPC instead
        raise


_SYNC_FILE_RANGE_WRITE = 2
_libc = None


def _c():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Start writing a range of dirty pages to storage without waiting (Linux).

    Issued after each batch of a save, so storage writes overlap the copying of
    later batches and the final fsync has little left to do. A no-op elsewhere.
    """
    try:
        fn = _c().sync_file_range
    except (OSError, AttributeError):
        return
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)  # best effort: errors surface at fsync


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def exchange(a, b) -> bool:
    """Atomically swap two paths (Linux renameat2 RENAME_EXCHANGE). False if unsupported."""
    try:
        fn = _c().renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), os.fspath(a))


def remove_tree(path) -> None:
    shutil.rmtree(os.fspath(path), ignore_errors=True)


def is_enospc(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def dir_is_empty(path: Path) -> bool:
    with os.scandir(path) as it:
        return next(it, None) is None
