"""Reading a :class:`~uckpt.storage.blob.posix.PosixStore`: an object held open
(:class:`PosixReader`), one read from the medium rather than the page cache
(:class:`MediumFileReader`, for re-verification: :mod:`uckpt.storage.readback`), the
scan of a directory (:func:`level`) and the walk of its tree (:func:`walk`, :func:`tree`).
Only regular files are read or listed; no symbolic link is followed."""
from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from .. import fsutil
from ...errors import CheckpointNotFoundError, NotACheckpointError
from .base import RESERVED, BlobReader, Level, Tree, check_offset, writable_view

if TYPE_CHECKING:
    from typing_extensions import Buffer


class PosixReader(BlobReader):
    """A regular file held open: ``pread`` and ``preadv`` straight into buffers."""

    def __init__(self, where: str, fd: int) -> None:
        self.where, self.fd = where, fd
        try:
            self.size = os.fstat(fd).st_size
        except OSError as e:
            os.close(fd)
            raise fsutil.unreadable(e, where, "blob") from None

    def read_into(self, offset: int, buf: Buffer) -> int:
        assert self.fd is not None, "read of a closed reader"
        return int(fsutil.pread_into(self.fd, writable_view(self.where, buf),
                                     check_offset(self.where, offset)))

    def read_vectored(self, offset: int, bufs: Iterable[Buffer]) -> int:
        assert self.fd is not None, "read of a closed reader"
        return int(fsutil.preadv_into(self.fd, list(bufs), offset))

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class MediumFileReader(BlobReader):
    """The file ``name`` of the directory open at ``dir_fd`` (closed with this reader
    where ``owns_dir``), read from the storage medium: ``O_DIRECT`` where the file system
    takes it; else (tmpfs, some network file systems) plain reads after the file is
    fsynced and its cached pages dropped (``posix_fadvise(POSIX_FADV_DONTNEED)``); else
    plain reads. ``how`` says which way. Offsets and buffers of O_DIRECT reads must be
    aligned (:data:`uckpt.storage.readback.ALIGN`)."""

    def __init__(self, dir_fd: int, name: str, where: str, owns_dir: bool = True) -> None:
        self.dir_fd, self.name, self.where, self.owns_dir = dir_fd, name, where, owns_dir
        self.fd = None
        direct = getattr(os, "O_DIRECT", 0)
        if direct:
            try:
                self.fd = os.open(name, os.O_RDONLY | _NOFOLLOW | direct, dir_fd=dir_fd)
                self.how = "O_DIRECT"
                return
            except OSError as e:
                if e.errno != errno.EINVAL:
                    self.close()
                    raise
        self._uncached()

    def _uncached(self) -> None:
        """Plain reads, after the file's cached pages are dropped where the platform can."""
        if self.fd is not None:
            os.close(self.fd)
        self.fd = os.open(self.name, os.O_RDONLY | _NOFOLLOW, dir_fd=self.dir_fd)
        self.how = "cached read"
        if hasattr(os, "posix_fadvise"):
            os.fsync(self.fd)  # only clean pages are dropped
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)
            self.how = "fadvise(DONTNEED) read"

    def read_into(self, offset: int, buf: Buffer) -> int:
        assert self.fd is not None, "read of a closed reader"
        try:
            return os.preadv(self.fd, [buf], offset)
        except OSError as e:  # O_DIRECT opened, but this file system's blocks are larger
            if e.errno != errno.EINVAL or self.how != "O_DIRECT":
                raise
            self._uncached()
            return os.preadv(self.fd, [buf], offset)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self.owns_dir and self.dir_fd >= 0:
            os.close(self.dir_fd)
            self.dir_fd = -1


def entries(fd: int) -> list[os.DirEntry[str]]:
    """The entries of the directory ``fd``, the store's temporary files left out."""
    with os.scandir(fd) as it:
        return [e for e in it if not e.name.startswith(RESERVED)]


def walk(fd: int, prefix: str) -> Iterator[tuple[str, int]]:
    """Every regular file below the directory ``fd`` (closed when done) as ``(key, size)``,
    keys starting with ``prefix``; symbolic links and other entries are left out. A stack,
    not recursion: a tree however deep cannot exhaust Python's stack (one descriptor per
    level is open, as recursion held)."""
    stack = [(fd, prefix, _level(fd))]
    try:
        while stack:
            fd, prefix, names = stack[-1]
            for name, size in names:
                if size is not None:
                    yield prefix + name, size
                    continue
                try:
                    sub = fsutil.open_dir(name, dir_fd=fd, follow_symlinks=False)
                except (CheckpointNotFoundError, NotACheckpointError):
                    continue  # removed or replaced meanwhile
                stack.append((sub, prefix + name + "/", _level(sub)))
                break
            else:
                os.close(stack.pop()[0])
    finally:
        for fd, _, _ in stack:
            os.close(fd)


def _level(fd: int) -> Iterator[tuple[str, int | None]]:
    """The regular files (name, size) and directories (name, None) in directory ``fd``."""
    for entry in entries(fd):
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue  # removed since the directory was read
        if stat.S_ISREG(st.st_mode):
            yield entry.name, st.st_size
        elif stat.S_ISDIR(st.st_mode):
            yield entry.name, None


def level(fd: int, prefix: str, holding: str | None) -> Level:
    """The directory ``fd`` (closed when done) from one scan: its regular files, its
    directories, what else stands there (none followed) and, where ``holding`` is a name,
    the directories ``sub`` where something stands at ``sub/<holding>``: one ``lstat``
    each, relative to ``fd`` (a directory replaced by a symbolic link between the scan and
    the ``lstat`` is followed by it, never by a read, which refuses it)."""
    keys, prefixes, others, held = [], [], {}, []
    try:
        for entry in entries(fd):
            if entry.is_file(follow_symlinks=False):
                keys.append(prefix + entry.name)
            elif entry.is_dir(follow_symlinks=False):
                prefixes.append(prefix + entry.name + "/")
                if holding is not None and _lexists(f"{entry.name}/{holding}", fd):
                    held.append(prefix + entry.name + "/")
            else:
                others[prefix + entry.name] = kind(entry, fd)
    finally:
        os.close(fd)
    return Level(sorted(keys), sorted(prefixes), others, sorted(held))


def tree(fd: int, prefix: str) -> Tree:
    """Every regular file below the directory ``fd`` (closed when done) with its size
    (:func:`walk` below its first level), its own directories and other entries from the
    same first scan, and its (device, inode)."""
    try:
        st = os.fstat(fd)
        keys: dict[str, int] = {}
        subs: list[str] = []
        others = {}
        for entry in entries(fd):
            if entry.is_dir(follow_symlinks=False):
                subs.append(entry.name)
            elif not entry.is_file(follow_symlinks=False):
                others[prefix + entry.name] = kind(entry, fd)
            else:
                try:
                    keys[prefix + entry.name] = entry.stat(follow_symlinks=False).st_size
                except FileNotFoundError:
                    continue  # removed since the directory was read
        for name in subs:
            try:
                sub = fsutil.open_dir(name, dir_fd=fd, follow_symlinks=False)
            except (CheckpointNotFoundError, NotACheckpointError):
                continue  # removed or replaced meanwhile
            keys.update(walk(sub, prefix + name + "/"))
    finally:
        os.close(fd)
    return Tree(keys, sorted(prefix + n + "/" for n in subs), others, (st.st_dev, st.st_ino))


def kind(entry: os.DirEntry[str], dir_fd: int) -> str:
    """What ``entry`` (neither a regular file nor a directory) is, in words."""
    if entry.is_symlink():
        return fsutil.link_kind(entry.name, dir_fd)
    try:
        return fsutil.kind_of(entry.stat(follow_symlinks=False).st_mode)
    except OSError:
        return "an entry that could not be examined"


def _lexists(path: str, dir_fd: int) -> bool:
    """Whether anything stands at ``path`` relative to ``dir_fd`` (its last component not
    followed)."""
    try:
        os.lstat(path, dir_fd=dir_fd)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return True
