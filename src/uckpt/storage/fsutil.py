"""File-system primitives: atomic commit (fsync, durable rename, exchange) and reading a
checkpoint directory safely (:func:`open_dir`, :func:`open_regular`, :func:`stat_regular`,
:func:`read_capped`: regular files only, no symlink followed, never blocking, bounded reads)."""
from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import stat
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Sequence, Union

from ..errors import (CheckpointNotFoundError, CorruptCheckpointError, NotACheckpointError,
                      UckptError)

if TYPE_CHECKING:  # collections.abc.Buffer from Python 3.12 on
    from typing_extensions import Buffer

#: a path as callers give it
StrPath = Union[str, "os.PathLike[str]"]
#: an error class, or a callable ``(message, path=...)`` returning the error to raise
MakeError = Callable[..., BaseException]


def fsync_dir(path: StrPath) -> None:
    fd = os.open(os.fspath(path), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: Buffer) -> None:
    """Write all of ``data`` at ``fd``'s position (os.write may write less)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def pread_into(fd: int, buf: Buffer, offset: int) -> int:
    """Fill ``buf`` from ``fd`` at ``offset``; returns bytes read (short only at EOF)."""
    view = memoryview(buf)
    if view.ndim != 1 or view.format != "B":
        view = view.cast("B")
    n = os.preadv(fd, [view], offset)  # (the common case: all of it at once)
    if n == len(view) or n == 0:
        return n
    return n + preadv_into(fd, [view[n:]], offset + n)


#: the most buffers one ``preadv`` takes (POSIX guarantees at least 16; Linux has 1024)
IOV_MAX: int = min(1024, os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 16)


def preadv_into(fd: int, bufs: Sequence[Buffer], offset: int) -> int:
    """Fill the flat byte buffers ``bufs``, in order, from ``fd`` starting at ``offset``,
    with as few ``preadv`` calls as the kernel allows; returns bytes read (short only at
    EOF)."""
    views = [memoryview(b).cast("B") for b in bufs]
    total = 0
    i = _moved(views, 0, 0)
    while i < len(views):
        n = os.preadv(fd, views[i:i + IOV_MAX], offset + total)
        if n == 0:
            break
        total += n
        i = _moved(views, i, n)
    return total


def pwritev_all(fd: int, bufs: Sequence[Buffer], offset: int) -> None:
    """Write the flat byte buffers ``bufs``, in order, to ``fd`` at ``offset``, with as
    few ``pwritev`` calls as the kernel allows (it may write less than asked)."""
    views = [memoryview(b).cast("B") for b in bufs]
    i = _moved(views, 0, 0)
    while i < len(views):
        n = os.pwritev(fd, views[i:i + IOV_MAX], offset)
        if n == 0:
            raise OSError(errno.EIO, f"pwritev wrote nothing at offset {offset}")
        offset += n
        i = _moved(views, i, n)


def _moved(views: List[memoryview], i: int, n: int) -> int:
    """The index of the first of ``views`` not yet done once ``n`` more bytes were moved
    from ``views[i]`` on (a partly done view is trimmed in place; empty ones are skipped)."""
    while n and i < len(views):
        if n >= len(views[i]):
            n -= len(views[i])
            i += 1
        else:
            views[i], n = views[i][n:], 0
    while i < len(views) and not len(views[i]):
        i += 1
    return i


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
_libc: Optional[ctypes.CDLL] = None


def _c() -> ctypes.CDLL:
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


def exchange(a: StrPath, b: StrPath) -> bool:
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


def copy_range(fd_in: int, fd_out: int, size: int, block: int = 8 << 20) -> int:
    """Copy the first ``size`` bytes of ``fd_in`` to ``fd_out`` (in the kernel where it can);
    returns the bytes copied (fewer only when ``fd_in`` is shorter)."""
    done = 0
    try:
        while done < size:
            n = os.copy_file_range(fd_in, fd_out, min(block, size - done), done, done)
            if n == 0:
                return done
            done += n
        return done
    except (AttributeError, OSError) as e:
        if isinstance(e, OSError) and e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL,
                                                      errno.EOPNOTSUPP):
            raise
    while done < size:  # no copy_file_range here (or across these file systems)
        data = os.pread(fd_in, min(block, size - done), done)
        if not data:
            break
        view = memoryview(data)
        while view:
            view = view[os.pwrite(fd_out, view, done + len(data) - len(view)):]
        done += len(data)
    return done


def remove_tree(path: StrPath) -> None:
    import shutil  # here: it imports bz2 and lzma, which the save path never needs

    shutil.rmtree(os.fspath(path), ignore_errors=True)


def is_enospc(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


# -- reading a checkpoint directory safely ----------------------------------------------------
# Only regular files directly inside a checkpoint directory are read: each is opened relative
# to the directory's descriptor without following a symlink and without blocking (a FIFO would
# otherwise block forever), its type checked with fstat, and every read bounded by a declared
# or capped size. The directory itself may be reached through a symlink (the caller's choice).

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_O_NOCTTY = getattr(os, "O_NOCTTY", 0)
_FILE_FLAGS = os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_NOCTTY | _O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _O_NONBLOCK | _O_NOCTTY | _O_CLOEXEC
_SYMLINK_ERRNOS = (errno.ELOOP, errno.EMLINK)  # O_NOFOLLOW on a symlink: Linux, FreeBSD
_PERMISSION_ERRNOS = (errno.EACCES, errno.EPERM)


def kind_of(mode: int) -> str:
    """What a file-system entry is, for messages: ``"a FIFO (named pipe)"``, ..."""
    for test, text in ((stat.S_ISREG, "a file"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return text
    return f"an entry of unknown type (mode {mode:#o})"


def unreadable(e: OSError, path: str, what: str, detail: str = "", **where: Any) -> UckptError:
    """The uckpt error for an OSError met while opening or reading a checkpoint's ``what``
    at ``path`` (``detail`` is added to the message, ``where`` (leaf, offset) to the error):
    missing -> CheckpointNotFoundError; anything else (permission denied, an I/O error, ...)
    -> CorruptCheckpointError carrying the ``errno``. Both make ``CheckpointManager.restore``
    fall back to another checkpoint."""
    if e.errno == errno.ENOENT:
        return CheckpointNotFoundError(f"{what} {path!r} does not exist{detail}", path=path,
                                       **where)
    reason = e.strerror or str(e)
    if e.errno in _PERMISSION_ERRNOS:
        hint = "give the reading user read access to the checkpoint's files (and search " \
               "access to its directory), or restore an earlier checkpoint"
    else:
        hint = "the storage failed to deliver the file; check the device or file system, or " \
               "restore an earlier checkpoint"
    return CorruptCheckpointError(f"cannot read {what} {path!r}{detail}: {reason} "
                                  f"(errno {e.errno})", path=path, errno=e.errno, hint=hint,
                                  **where)


def not_regular(path: str, what: str, kind: str,
                error: MakeError = CorruptCheckpointError) -> BaseException:
    return error(f"{what} {path!r} is {kind}, not a regular file", path=path, kind=kind,
                 hint="uckpt reads only regular files inside a checkpoint directory, never "
                      "through a symbolic link; put the real file there, or restore an "
                      "earlier checkpoint")


def open_dir(path: StrPath, *, what: str = "checkpoint", dir_fd: Optional[int] = None,
             follow_symlinks: bool = True) -> int:
    """Open directory ``path`` (relative to ``dir_fd`` if given) and return its descriptor
    (close it with ``os.close``). A symlink at ``path`` is followed only with
    ``follow_symlinks`` (the default: a path the user gave is the user's choice; an entry
    found inside a root is not followed). Raises CheckpointNotFoundError if ``path`` does
    not exist and NotACheckpointError if it is not a directory (a symlink not followed
    included); never blocks, whatever ``path`` is. ``what`` names it in messages."""
    text = os.fsdecode(path)
    flags = _DIR_FLAGS | (0 if follow_symlinks else _O_NOFOLLOW)
    try:
        return os.open(path, flags, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise CheckpointNotFoundError(f"{what} {text!r} does not exist",
                                          path=text) from None
        if e.errno not in (errno.ENOTDIR,) + _SYMLINK_ERRNOS:
            raise unreadable(e, text, what) from None
    try:
        kind = kind_of(os.stat(path, dir_fd=dir_fd, follow_symlinks=follow_symlinks).st_mode)
    except OSError:  # a component of the path is not a directory
        kind = "not reachable"
    if kind == "a symbolic link":
        kind = link_kind(path, dir_fd)
    raise NotACheckpointError(f"{text!r} is {kind}, not a {what} directory", path=text)


def open_regular(where: Union[int, StrPath], name: str, *, what: str = "file",
                 path: Optional[str] = None, missing: MakeError = CheckpointNotFoundError,
                 wrong_type: MakeError = CorruptCheckpointError) -> int:
    """Open ``name``, a plain file name inside the directory ``where`` (an open directory
    descriptor, or a path that is opened for the call), for reading; return the descriptor.

    No symlink is followed at ``name``, the open never blocks (a FIFO), and the entry must
    be a regular file (fstat): anything else raises ``wrong_type`` (a symlink, even to a
    file in the same directory, included). A missing file raises ``missing``; other OS
    errors the error of :func:`unreadable`. ``missing`` and ``wrong_type`` are error
    classes, or callables ``(message, path=...)`` returning the exception to raise. ``path``
    (for messages) defaults to ``where/name``; ``what`` names the file in messages
    ("manifest", "data file").
    The descriptor is blocking again when returned; the caller closes it.
    """
    if isinstance(where, int):
        return _open_in(where, name, what, path or name, missing, wrong_type)
    path = path or os.path.join(os.fsdecode(where), name)
    dir_fd = open_dir(where)
    try:
        return _open_in(dir_fd, name, what, path, missing, wrong_type)
    finally:
        os.close(dir_fd)


def _open_in(dir_fd: int, name: str, what: str, path: str, missing: MakeError,
             wrong_type: MakeError) -> int:
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise missing(f"{what} {path!r} does not exist", path=path) from None
        if e.errno in _SYMLINK_ERRNOS:
            raise not_regular(path, what, link_kind(name, dir_fd), wrong_type) from None
        raise unreadable(e, path, what) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise not_regular(path, what, kind_of(mode), wrong_type)
        if _O_NONBLOCK:
            fcntl.fcntl(fd, fcntl.F_SETFL, _FILE_FLAGS & ~_O_NONBLOCK)
    except BaseException as e:
        os.close(fd)
        if isinstance(e, OSError) and not isinstance(e, UckptError):
            raise unreadable(e, path, what) from None
        raise
    return fd


def link_kind(path: StrPath, dir_fd: Optional[int] = None) -> str:
    """``"a symbolic link (to 'target')"``, for messages about the symlink at ``path``."""
    try:
        return f"a symbolic link (to {os.fsdecode(os.readlink(path, dir_fd=dir_fd))!r})"
    except OSError:
        return "a symbolic link"


def stat_regular(dir_fd: int, name: str, *, what: str = "file", path: Optional[str] = None,
                 missing: MakeError = CheckpointNotFoundError,
                 wrong_type: MakeError = CorruptCheckpointError) -> os.stat_result:
    """``lstat`` of ``name`` inside directory ``dir_fd`` without opening it; raises like
    :func:`open_regular` unless it is a regular file."""
    path = path or name
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise missing(f"{what} {path!r} does not exist", path=path) from None
        raise unreadable(e, path, what) from None
    if not stat.S_ISREG(st.st_mode):
        kind = link_kind(name, dir_fd) if stat.S_ISLNK(st.st_mode) else kind_of(st.st_mode)
        raise not_regular(path, what, kind, wrong_type)
    return st


def read_capped(fd: int, cap: int, path: str, *, what: str = "file",
                too_large: MakeError = CorruptCheckpointError) -> bytes:
    """The whole content of the file open at ``fd`` (read from offset 0), at most ``cap``
    bytes: a file whose ``fstat`` size is over ``cap`` raises ``too_large`` before a byte is
    read; at most ``cap + 1`` bytes are ever read, whatever ``st_size`` says (a file that
    grows, or lies about its size), and more than ``cap`` raises ``too_large``. I/O errors
    raise the error of :func:`unreadable`."""
    parts: List[bytes] = []
    total = 0
    try:
        size = os.fstat(fd).st_size
        held = f"{size} bytes, more than {cap}" if size > cap else f"more than {cap}"
        total = size if size > cap else 0  # too large by its size: refused unread
        want = min(size, cap) + 1  # one read, plus one that sees the end
        while total <= cap:
            part = os.pread(fd, min(want, cap + 1 - total), total)
            if not part:
                break
            parts.append(part)
            total += len(part)
            want = max(want, 1 << 20)
    except OSError as e:
        raise unreadable(e, path, what) from None
    if total > cap:
        raise too_large(f"{what} {path!r} holds {held} bytes, the most uckpt reads for a "
                        f"{what}", path=path,
                        hint="it is not a file uckpt wrote; restore an earlier checkpoint")
    return b"".join(parts)  # one part (the usual case) is returned as is, not copied
