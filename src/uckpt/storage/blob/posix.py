"""A blob store in a local directory tree: one file per key.

Reads walk the key's directories from the root's descriptor without following a
symbolic link, open only regular files and never block (:mod:`uckpt.storage.fsutil`), so no key
leads outside the root. Writes go to a hidden temporary file beside the key, with
O_DIRECT where the file system takes it (else buffered, their writeback started as they
go; an object that fits one writer's buffer, such as a manifest, in one buffered write
that leaves it in the page cache), are fsynced and renamed into place, and the
directory is fsynced: an object appears whole and survives a crash once its writer
commits. Below a prefix this store object staged (:meth:`~PosixStore.stage`), the
directory fsyncs after each new object, new directory or removal are left out:
``rename_prefix`` (``renameat2(RENAME_NOREPLACE)``) and ``exchange_prefix`` fsync the
directories they move before moving them, and their parents after. Locks are ``flock``.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import mmap
import os
import stat
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, NoReturn, TypeVar

from .. import fsutil
from ... import knobs
from ...errors import (CheckpointExistsError, CheckpointNotFoundError, CorruptCheckpointError,
                       NotACheckpointError, NotRegularFileError, RootLockedError)
from . import posix_io
from .base import (RESERVED, BlobLock, BlobReader, BlobStore, BlobWriter, Level, Listing, Tree,
                   check_below_root, check_key, check_offset, check_prefix, check_rename, closed,
                   flat, writable_view)
from .posix_io import DirectFile
from .posix_read import MediumFileReader, PosixReader, level, tree, walk
from .posix_remove import remove_tree

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from .base import Pieces

log = logging.getLogger("uckpt.storage.blob.posix")

T = TypeVar("T")
_RENAME_NOREPLACE, _RENAME_EXCHANGE = 1, 2
_NOT_SUPPORTED = (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP)
#: a directory ``delete_prefix`` moved aside to remove it (never read again)
_ASIDE = f"{RESERVED}del-"


class PosixStore(BlobStore):
    """Keys are files below the directory ``root`` (reached through a symlink if ``root``
    is one: the caller's choice). A missing ``root`` is made by the first write or lock,
    never by a read: to a reader it is a store with no keys. ``buffer_bytes``: a writer's
    page-aligned staging buffer, written out whenever it fills."""

    atomic_rename: ClassVar[bool] = True
    conditional_create = True
    advisory_locks: ClassVar[bool] = True
    direct_io: ClassVar[bool] = True
    vectored_reads: ClassVar[bool] = True
    local_files: ClassVar[bool] = True
    atomic_exchange: ClassVar[bool] = True

    def __init__(self, root: str | os.PathLike[str], *,
                 buffer_bytes: int | None = None) -> None:
        self.root = Path(root)
        page = mmap.PAGESIZE
        self.buffer_bytes = max(page, (buffer_bytes or knobs.stream_buffer_bytes) // page * page)
        self._staged: set[str] = set()  # see stage()

    def where(self, key: str) -> str:
        return os.path.join(self.root, key)

    def stage(self, prefix: str) -> None:
        self._staged.add(check_prefix(prefix).rstrip("/") + "/")

    def unstage(self, prefix: str) -> None:
        self._staged.discard(check_prefix(prefix).rstrip("/") + "/")

    def _sync_dir(self, fd: int, key: str) -> None:
        """fsync the directory ``fd``, whose entry ``key`` (a key, or a prefix ending
        in ``/``) changed, unless ``key`` lies below a staged prefix."""
        if not any(key.startswith(p) for p in self._staged):
            os.fsync(fd)

    def root_exists(self) -> bool:
        return self.root.is_dir()

    def copy_of(self, prefix: str) -> str:
        """This host and the (device, inode) of the directory that holds ``prefix`` (made
        or not yet): shared by all who see that directory."""
        parts = [p for p in check_prefix(prefix).split("/") if p][:-1]
        fd = self._dir(parts, prefix)
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        import socket  # here, on first use: it imports selectors

        return f"{socket.gethostname()}:{st.st_dev}:{st.st_ino}"

    # --- walking the tree ----------------------------------------------------------------
    def _dir(self, parts: list[str], key: str, create: bool = False) -> int:
        """The descriptor of the directory ``root/parts...`` (made where ``create``);
        CheckpointNotFoundError where it is missing, CorruptCheckpointError where a
        component is a symlink or anything else but a directory."""
        try:
            fd = fsutil.open_dir(self.root, what="store root")
        except CheckpointNotFoundError:
            if not create:
                raise
            self.root.mkdir(parents=True, exist_ok=True)  # a writer's first write
            fd = fsutil.open_dir(self.root, what="store root")
        try:
            for i, part in enumerate(parts):
                if create:
                    try:
                        os.mkdir(part, 0o755, dir_fd=fd)
                        # the new entry survives a crash
                        self._sync_dir(fd, "/".join(parts[:i + 1]) + "/")
                    except FileExistsError:
                        pass
                try:
                    sub = fsutil.open_dir(part, dir_fd=fd, follow_symlinks=False)
                except (CheckpointNotFoundError, NotACheckpointError) as e:
                    self._not_a_dir(e, fd, "/".join(parts[:i + 1]), key)
                os.close(fd)
                fd = sub
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _not_a_dir(self, e: Exception, fd: int, sub: str, key: str) -> NoReturn:
        where = self.where(key)
        try:
            mode = os.stat(sub.rsplit("/", 1)[-1], dir_fd=fd, follow_symlinks=False).st_mode
        except OSError:
            mode = stat.S_IFREG  # gone: the key does not exist
        if isinstance(e, CheckpointNotFoundError) or stat.S_ISREG(mode):
            raise CheckpointNotFoundError(f"no blob {key!r} in {self.root}", path=where) \
                from None
        raise CorruptCheckpointError(f"{self.where(sub)!r} is {fsutil.kind_of(mode)}, not a "
                                     f"directory: blob {key!r} is not read through it",
                                     path=where, hint="a blob store never follows a symbolic "
                                                      "link; replace it by a directory") \
            from None

    def _parent(self, key: str, create: bool = False) -> tuple[int, str]:
        *parts, name = check_key(key).split("/")
        return self._dir(parts, key, create), name

    # --- reading --------------------------------------------------------------------------
    def read_into(self, key: str, offset: int, buf: Buffer) -> int:
        view = writable_view(key, buf)
        offset = check_offset(key, offset)
        dir_fd, name = self._parent(key)
        try:
            fd = self._regular(fsutil.open_regular, dir_fd, name, key)
        finally:
            os.close(dir_fd)
        try:
            return fsutil.pread_into(fd, view, offset)
        except OSError as e:
            raise fsutil.unreadable(e, self.where(key), "blob") from None
        finally:
            os.close(fd)

    def open_reader(self, key: str) -> BlobReader:
        dir_fd, name = self._parent(key)
        try:
            fd = self._regular(fsutil.open_regular, dir_fd, name, key)
        finally:
            os.close(dir_fd)
        return PosixReader(self.where(key), fd)

    def open_medium_reader(self, key: str) -> BlobReader:
        """O_DIRECT, else reads after the cached pages are dropped (:class:`MediumFileReader`)."""
        dir_fd, name = self._parent(key)
        try:
            self._regular(fsutil.stat_regular, dir_fd, name, key)
            return MediumFileReader(dir_fd, name, self.where(key))
        except BaseException:
            os.close(dir_fd)
            raise

    def exists(self, key: str) -> bool:
        """An ``lstat`` of each directory on the key's path and of the key; where any of
        them is neither as expected nor missing (a symlink, a FIFO, a directory at the
        key) the walk from the root's descriptor judges it and names it (:meth:`size`)."""
        try:
            mode = self._mode(key)
        except _NotADir:
            return super().exists(key)
        return mode is not None and (stat.S_ISREG(mode) or super().exists(key))

    def occupied(self, key: str) -> bool:
        """An ``lstat`` of each directory on the key's path and of the key; a symbolic
        link on the path is judged by the walk from the root's descriptor (:meth:`size`)."""
        try:
            return self._mode(key) is not None
        except _NotADir:
            return super().occupied(key)

    def _mode(self, key: str) -> int | None:
        """The mode of ``key`` (not followed), None where it is missing; ``_NotADir``
        where a directory on its path is something else."""
        path = os.fspath(self.root)
        *parts, name = check_key(key).split("/")
        try:
            for part in parts:
                path = os.path.join(path, part)
                if not stat.S_ISDIR(os.lstat(path).st_mode):
                    raise _NotADir(path)
            return os.lstat(os.path.join(path, name)).st_mode
        except (FileNotFoundError, NotADirectoryError):
            return None

    def size(self, key: str) -> int:
        dir_fd, name = self._parent(key)
        try:
            return int(self._regular(fsutil.stat_regular, dir_fd, name, key).st_size)
        finally:
            os.close(dir_fd)

    def _regular(self, how: Callable[..., T], dir_fd: int, name: str, key: str) -> T:
        """``how`` (fsutil's open_regular or stat_regular) of ``name``; a directory there
        is a prefix, not an object: no blob."""
        def missing(_message: str, path: str) -> CheckpointNotFoundError:
            return CheckpointNotFoundError(f"no blob {key!r} in {self.root}", path=path)

        try:
            return how(dir_fd, name, what="blob", path=self.where(key), missing=missing,
                       wrong_type=NotRegularFileError)
        except NotRegularFileError:
            try:
                is_dir = stat.S_ISDIR(os.stat(name, dir_fd=dir_fd,
                                              follow_symlinks=False).st_mode)
            except OSError:
                is_dir = False
            if is_dir:
                raise missing("", self.where(key)) from None
            raise

    def _prefix_dir(self, prefix: str) -> int | None:
        parts = [p for p in prefix.split("/") if p]
        try:
            return self._dir(parts, prefix)
        except CheckpointNotFoundError:
            return None

    def list(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        prefix = check_prefix(prefix)
        fd = self._prefix_dir(prefix)
        return iter(()) if fd is None else walk(fd, prefix)

    def list_dir(self, prefix: str = "") -> Listing:
        level = self.list_level(prefix)
        return Listing(level.keys, level.prefixes)

    def others(self, prefix: str = "") -> dict[str, str]:
        """Symbolic links, FIFOs, devices, sockets: each named as it is, none followed."""
        return self.list_level(prefix).others

    def list_level(self, prefix: str = "", holding: str | None = None) -> Level:
        """One scan of the directory and, where ``holding`` is a name, one ``lstat`` for
        each directory found (:func:`~.posix_read.level`)."""
        prefix = check_prefix(prefix)
        fd = self._prefix_dir(prefix)
        return Level([], [], {}, []) if fd is None else level(fd, prefix, holding)

    def list_tree(self, prefix: str = "") -> Tree:
        """One walk of the directory (:func:`~.posix_read.tree`)."""
        prefix = check_prefix(prefix)
        fd = self._prefix_dir(prefix)
        return Tree({}, [], {}, None) if fd is None else tree(fd, prefix)

    # --- writing ----------------------------------------------------------------------------
    def open_writer(self, key: str) -> BlobWriter:
        return _Writer(self, key)

    def write_pieces(self, key: str, pieces: Pieces, size: int | None = None,
                     reserve: int = 0) -> None:
        """Preallocated vectored writes with writeback per batch (``size`` or
        ``reserve`` given), else each piece copied into O_DIRECT writes
        (:mod:`.posix_io`); fsynced, renamed into place."""
        if size is None and not reserve:
            self._place(key, lambda path: posix_io.write_stream(path, pieces))
        else:
            self._place(key, lambda path: posix_io.write_buffered(path, size, pieces, reserve))

    def write_image(self, key: str, image: Buffer, size: int) -> None:
        self._place(key, lambda path: posix_io.write_image(path, image, size))

    def copy_in(self, key: str, reader: BlobReader, size: int) -> int:
        """In the kernel (``copy_file_range``) from a reader with a descriptor; the copy
        fsynced and dropped from the page cache, so that a read-back comes from storage."""
        fd_in = reader.fd
        if fd_in is None:
            return super().copy_in(key, reader, size)
        copied = 0

        def make(path: Path) -> None:
            nonlocal copied
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                copied = fsutil.copy_range(fd_in, fd, size)
                if copied < size:
                    raise _CutShort
                os.fsync(fd)
                if hasattr(os, "posix_fadvise"):
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        try:
            self._place(key, make)
        except _CutShort:
            pass
        return copied

    def _place(self, key: str, make: Callable[[Path], None]) -> None:
        """``make(path)`` a new file at a hidden path beside ``key``, then move it into
        place and fsync the directory (the hidden file removed if anything fails)."""
        dir_fd, name = self._parent(key, create=True)
        tmp = _hidden("w")
        try:
            make(Path(self.root, *key.split("/")[:-1], tmp))
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            self._sync_dir(dir_fd, key)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dir_fd)
            except FileNotFoundError:
                pass
            raise
        finally:
            os.close(dir_fd)

    def create_if_absent(self, key: str, data: Buffer) -> bool:
        with _Writer(self, key) as out:
            out.write(data)
            return out.publish(replace=False)

    def delete(self, key: str, *, durable: bool = True) -> None:
        try:
            dir_fd, name = self._parent(key)
        except CheckpointNotFoundError:
            return
        try:
            if stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                return  # a prefix, not an object
            os.unlink(name, dir_fd=dir_fd)
            if durable:
                self._sync_dir(dir_fd, key)
        except FileNotFoundError:
            pass
        finally:
            os.close(dir_fd)

    def delete_prefix(self, prefix: str) -> None:
        try:
            dir_fd, name = self._parent(check_below_root(prefix, self.root)[:-1])
        except CheckpointNotFoundError:
            return
        try:
            aside = _ASIDE + uuid.uuid4().hex
            try:  # out of sight at once, then removed
                os.rename(name, aside, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except FileNotFoundError:
                return
            remove_tree(aside, dir_fd)  # also a file: unlinked
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def abort_incomplete(self, prefix: str, older_than_s: float,
                         keep: Iterable[str] = ()) -> int:
        """Remove what killed operations of this store left in ``prefix``'s own directory
        (``keep`` is for stores whose unfinished writes lie below a prefix; here none
        do): directories a deletion moved aside (dead: nothing reads them, so whatever
        their age; another deletion removing one at once is no error) and temporary
        files of writes started at least ``older_than_s`` ago."""
        fd = self._prefix_dir(check_prefix(prefix))
        if fd is None:
            return 0
        try:
            with os.scandir(fd) as it:
                found = [e for e in it if e.name.startswith(RESERVED)]
            now, removed = time.time(), 0
            for e in found:
                try:
                    if not e.name.startswith(_ASIDE) and \
                            now - e.stat(follow_symlinks=False).st_mtime < older_than_s:
                        continue
                except FileNotFoundError:
                    continue
                remove_tree(e.name, fd)
                log.info("removed %s: left by a killed %s", self.where(prefix + e.name),
                         "deletion" if e.name.startswith(_ASIDE) else "write")
                removed += 1
            if removed:
                os.fsync(fd)
            return removed
        finally:
            os.close(fd)

    def rename_prefix(self, src: str, dst: str) -> None:
        src_key, dst_key = (p[:-1] for p in check_rename(src, dst))
        try:
            src_fd, src_name = self._parent(src_key)
        except CheckpointNotFoundError:
            src_fd, src_name = -1, ""
        try:
            if src_fd < 0:
                raise FileNotFoundError(errno.ENOENT, "no parent")
            st = os.stat(src_name, dir_fd=src_fd, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                raise FileNotFoundError(errno.ENOENT, "not a directory")
            dst_fd, dst_name = self._parent(dst_key, create=True)
            try:
                _sync_entries(src_fd, src_name)
                _rename_noreplace(src_fd, src_name, dst_fd, dst_name)
                os.fsync(dst_fd)
                if not os.path.samestat(os.fstat(src_fd), os.fstat(dst_fd)):
                    os.fsync(src_fd)  # (one directory: its fsync covers both names)
            finally:
                os.close(dst_fd)
        except CheckpointNotFoundError:
            raise  # the destination cannot be made
        except FileNotFoundError:
            raise CheckpointNotFoundError(f"nothing below {src!r} in {self.root} to rename",
                                          path=self.where(src_key)) from None
        except OSError as e:
            if e.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
                raise
            raise CheckpointExistsError(f"cannot rename {src!r} to {dst!r} in {self.root}: "
                                        f"{dst!r} exists", path=self.where(dst_key),
                                        hint="delete it first, or rename to another "
                                             "prefix") from None
        finally:
            if src_fd >= 0:
                os.close(src_fd)

    def exchange_prefix(self, a: str, b: str) -> bool:
        """``renameat2(RENAME_EXCHANGE)`` of the two directories; False where the file
        system does not take it (nothing changed)."""
        a_key, b_key = (p[:-1] for p in check_rename(a, b))
        a_fd, a_name = self._parent(a_key)
        try:
            b_fd, b_name = self._parent(b_key)
            try:
                for fd, name, key in ((a_fd, a_name, a), (b_fd, b_name, b)):
                    try:
                        mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
                    except FileNotFoundError:
                        mode = 0
                    if not stat.S_ISDIR(mode):
                        raise CheckpointNotFoundError(f"nothing below {key!r} in {self.root} "
                                                      "to exchange", path=self.where(key))
                    _sync_entries(fd, name)
                if not _renameat2(a_fd, a_name, b_fd, b_name, _RENAME_EXCHANGE):
                    return False
                os.fsync(a_fd)
                if b_fd != a_fd:
                    os.fsync(b_fd)
                return True
            finally:
                os.close(b_fd)
        finally:
            os.close(a_fd)

    def lock(self, key: str, *, shared: bool = False) -> BlobLock:
        """``flock`` on the file ``key`` (made if missing), taken only while that file is
        still linked at ``key``: a holder may unlink it (a writer removing a dead save's
        lease does so while holding it), and a lock on an unlinked file guards nothing,
        so a file removed between this open and this lock is opened anew."""
        dir_fd, name = self._parent(key, create=True)
        try:
            while True:
                # read-only: a held lock keeps no file open for writing (a file system
                # remounted read-only under a live writer would be "busy")
                fd = os.open(name, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
                             | os.O_NONBLOCK, 0o644, dir_fd=dir_fd)
                try:
                    fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
                                | fcntl.LOCK_NB)
                except BlockingIOError:
                    held = _linked(fd, dir_fd, name)
                    os.close(fd)
                    if not held:
                        continue  # its holder removed it: a new file takes its name
                    raise RootLockedError(f"the lock {self.where(key)!r} is held by another "
                                          "process or another lock of this one",
                                          path=self.where(key),
                                          hint="wait for its holder to release it") from None
                if _linked(fd, dir_fd, name):
                    return _Lock(fd, os.dup(dir_fd), name)
                os.close(fd)  # removed between the open and the lock: open it anew
        finally:
            os.close(dir_fd)


class _NotADir(Exception):
    """A directory on a key's path is something else (:meth:`PosixStore._mode`)."""


def _linked(fd: int, dir_fd: int, name: str) -> bool:
    """Whether ``name`` in ``dir_fd`` is still the file open at ``fd``."""
    try:
        there = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino)


def _sync_entries(dir_fd: int, name: str) -> None:
    """fsync the directory ``name`` in ``dir_fd`` (its entries durable before it moves:
    the objects written below a staged prefix had no directory fsync of their own)."""
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                 dir_fd=dir_fd)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _hidden(what: str) -> str:
    return f"{RESERVED}{what}-{uuid.uuid4().hex}"


def _renameat2(src_fd: int, src: str, dst_fd: int, dst: str, flags: int) -> bool:
    """``renameat2``; False where the kernel or file system does not take ``flags``."""
    fn = fsutil._c().renameat2  # libc, loaded once
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(src_fd, os.fsencode(src), dst_fd, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err not in _NOT_SUPPORTED:
        raise OSError(err, os.strerror(err), src)
    return False


def _rename_noreplace(src_fd: int, src: str, dst_fd: int, dst: str) -> None:
    if _renameat2(src_fd, src, dst_fd, dst, _RENAME_NOREPLACE):
        return
    # no RENAME_NOREPLACE here: rename() replaces only an empty directory (no blob lost)
    log.debug("renameat2(RENAME_NOREPLACE) is not supported here; rename() instead")
    os.rename(src, dst, src_dir_fd=src_fd, dst_dir_fd=dst_fd)


class _Writer(BlobWriter):
    """Stages bytes in a page-aligned buffer. An object that fits it is written at
    :meth:`publish` in one buffered write, so that it stays in the page cache for the
    reader that usually comes next (a manifest, read back by the load or verify after
    a save); a larger one goes to a hidden file with O_DIRECT whenever the buffer fills."""

    def __init__(self, store: PosixStore, key: str) -> None:
        self.store, self.key = store, key
        self._dir_fd, self._name = store._parent(key, create=True)
        self._tmp = _hidden("w")
        self._path = Path(store.root, *key.split("/")[:-1], self._tmp)
        self._out: DirectFile | None = None  # opened when the buffer first fills
        self._open = True
        try:
            self._buf = mmap.mmap(-1, store.buffer_bytes)  # anonymous: page-aligned
        except BaseException:
            os.close(self._dir_fd)
            raise
        self._base = self._fill = 0

    def write(self, data: Buffer) -> None:
        view = flat(data)
        if not self._open:
            raise closed(self.key)
        while view:
            n = min(len(view), len(self._buf) - self._fill)
            self._buf[self._fill:self._fill + n] = view[:n]
            self._fill, view = self._fill + n, view[n:]
            if self._fill == len(self._buf):
                self._flush()

    def _flush(self) -> None:
        if self._out is None:
            self._out = DirectFile(self._path)
        whole = -(-self._fill // mmap.PAGESIZE) * mmap.PAGESIZE
        self._buf[self._fill:whole] = bytes(whole - self._fill)  # cut off by finish()
        self._out.pwrite(memoryview(self._buf)[:whole], self._base)
        self._base, self._fill = self._base + self._fill, 0

    def _finish(self) -> None:
        """The hidden file, whole and fsynced."""
        if self._out is None:  # it fits the buffer: one buffered write
            fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                         0o644)
            try:
                fsutil.write_all(fd, memoryview(self._buf)[:self._fill])
                os.fsync(fd)
            finally:
                os.close(fd)
            return
        if self._fill:
            self._flush()
        self._out.finish(self._base)
        self._out.close()
        self._out = None

    def publish(self, replace: bool = True) -> bool:
        """Finish the file and move it into place (only where no object is, unless
        ``replace``); returns whether it was."""
        if not self._open:
            return False
        try:
            self._finish()
            if replace:
                os.replace(self._tmp, self._name, src_dir_fd=self._dir_fd,
                           dst_dir_fd=self._dir_fd)
            else:
                try:
                    os.link(self._tmp, self._name, src_dir_fd=self._dir_fd,
                            dst_dir_fd=self._dir_fd, follow_symlinks=False)
                except FileExistsError:
                    return False
            self.store._sync_dir(self._dir_fd, self.key)
            return True
        finally:
            self.abort()

    def commit(self) -> None:
        self.publish()

    def abort(self) -> None:
        if self._dir_fd < 0:
            return
        self._open = False
        if self._out is not None:
            self._out.close()
            self._out = None
        try:
            os.unlink(self._tmp, dir_fd=self._dir_fd)
        except FileNotFoundError:
            pass  # renamed into place, or never made
        os.close(self._dir_fd)
        self._dir_fd = -1
        try:
            self._buf.close()
        except BufferError:  # a failed write's traceback still holds a view of it: the
            pass  # buffer is freed with that traceback


class _CutShort(Exception):
    """The source of a copy ended early (nothing is put in place)."""


class _Lock(BlobLock):
    """The ``flock`` held on the read-only descriptor ``fd`` of file ``name`` in the
    directory ``dir_fd`` (both owned)."""

    def __init__(self, fd: int, dir_fd: int, name: str) -> None:
        self._fd, self._dir_fd, self._name = fd, dir_fd, name

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # drops the flock
            os.close(self._dir_fd)
            self._fd = self._dir_fd = -1

    def note(self, data: bytes) -> None:
        """One ``pwrite`` into the locked file itself (a new file renamed over it would
        not be the locked one), then cut to its length; opened for writing only for it."""
        if self._fd < 0:
            return
        out = os.open(self._name, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                      dir_fd=self._dir_fd)
        try:
            if os.path.sameopenfile(out, self._fd):
                os.pwrite(out, data, 0)
                os.ftruncate(out, len(data))
        finally:
            os.close(out)
