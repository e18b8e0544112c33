"""Local POSIX storage: a root directory of checkpoint directories.

Today's fast paths, wrapped rather than rewritten: data files are written by
:mod:`uckpt.storage.blob.posix_io` (vectored writes with writeback started per batch, or one
O_DIRECT write of a staging arena), into a hidden temporary directory held by a
save lease (:mod:`uckpt.storage.leases`); the manifest is written last and the directory
renamed into place (``renameat2(RENAME_EXCHANGE)`` to overwrite). Reads open the
checkpoint directory once and each file relative to it (regular files only, no
symlink followed, never blocking: :func:`uckpt.storage.fsutil.open_regular`), and ``pread``
straight into the caller's buffers. The commit rule is docs/format.md section 2.
"""
from __future__ import annotations

import errno
import logging
import os
import secrets
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Hashable, Iterable, List, Optional, Sequence, Tuple, Union

from . import fsutil
from .. import knobs
from .readback import FileReader
from ..errors import (CheckpointExistsError, CheckpointNotFoundError, ManifestError,
                      NotACheckpointError, SaveError)
from ..format import MANIFEST_NAME
from .leases import (DEL_MARK, OLD_MARK, TmpLease, WriterLock, make_tmp_dir, new_leased_dir,
                     remove_debris)
from . import archive_local, base, listing_local
from .blob import posix_io
from .archive import hidden_steps
from .base import STEP_NAME, CheckpointSink, CheckpointSource, Entry, Store

if TYPE_CHECKING:  # collections.abc.Buffer from Python 3.12 on
    import numpy as np
    from numpy.typing import NDArray
    from typing_extensions import Buffer

    from ..format.model import Manifest

#: a directory's path
PathLike = Union[str, "os.PathLike[str]"]

log = logging.getLogger("uckpt.storage.local")

#: a file in a collective save's temporary directory: the ranks that see it share the
#: coordinator's directory (one view); the others (node-local storage) make their own
COORDINATOR_MARK = ".uckpt-coordinator"


# -- reading ----------------------------------------------------------------------------------
def manifest_bytes_at(dir_fd: int, directory: PathLike) -> bytes:
    """The manifest's bytes of the checkpoint directory open at ``dir_fd`` (``directory``:
    its path, for messages). A manifest that is not a regular file (a FIFO, a device, a
    directory, a symlink) raises NotACheckpointError; one over ``MAX_MANIFEST_BYTES``
    ManifestError: unread when its ``fstat`` size says so, else after reading at most one
    byte more."""
    mpath = os.path.join(os.fsdecode(directory), MANIFEST_NAME)

    def missing(_message: str, path: str) -> NotACheckpointError:
        return NotACheckpointError(
            f"{os.fsdecode(directory)!r} is not a committed uckpt checkpoint: it has no "
            f"{MANIFEST_NAME}", path=os.fsdecode(directory),
            hint="a save that was interrupted leaves no manifest; use an earlier checkpoint "
                 "(CheckpointManager.restore() picks the newest committed one)")

    fd = fsutil.open_regular(dir_fd, MANIFEST_NAME, what="manifest", path=mpath,
                             missing=missing, wrong_type=NotACheckpointError)
    try:
        return fsutil.read_capped(fd, base.MAX_MANIFEST_BYTES, mpath, what="manifest",
                                  too_large=ManifestError)
    finally:
        os.close(fd)


def missing_data_file(_message: str, path: str) -> CheckpointNotFoundError:
    return CheckpointNotFoundError(f"data file {path!r} listed in the manifest is missing",
                                   path=path)


class LocalSource(CheckpointSource):
    """A checkpoint directory, opened once (following a symlink there: the caller chose
    the path); its files are opened relative to it, never through a symlink, and must be
    regular files."""

    def __init__(self, directory: PathLike, dir_fd: Optional[int] = None) -> None:
        """``dir_fd``: the directory, already open (a sibling opened without following a
        symlink); the source owns it."""
        self.directory = Path(directory)
        self.where = str(self.directory)
        self.block_bytes = knobs.read_block_bytes
        self.read_threads = knobs.io_threads
        self.verify_threads = 1  # one chunk after another: sequential reads of each file
        self.coalesce = True
        self._fds: Dict[str, int] = {}
        self.dir_fd = fsutil.open_dir(self.directory) if dir_fd is None else dir_fd

    @property
    def location(self) -> Path:
        return self.directory

    def sibling(self, name: str) -> "LocalSource":
        """The checkpoint directory ``name`` beside this one (a base of an incremental
        checkpoint): opened relative to the parent directory, never through a symlink."""
        parent = fsutil.open_dir(self.directory.parent, what="parent")
        try:
            fd = fsutil.open_dir(name, what="base checkpoint", dir_fd=parent,
                                 follow_symlinks=False)
        finally:
            os.close(parent)
        where = str(self.directory.parent / name)
        try:
            fsutil.stat_regular(fd, MANIFEST_NAME, what="manifest",
                                path=os.path.join(where, MANIFEST_NAME),
                                missing=lambda *_a, **_k: base.uncommitted_base(
                                    where, f"it has no {MANIFEST_NAME}"),
                                wrong_type=lambda message, **_k: base.uncommitted_base(
                                    where, message))
        except BaseException:
            os.close(fd)
            raise
        return LocalSource(where, dir_fd=fd)

    def manifest_bytes(self) -> bytes:
        return manifest_bytes_at(self.dir_fd, self.directory)

    def file_where(self, name: str) -> str:
        return str(self.directory / name)

    def open_file(self, name: str, what: str = "data file") -> int:
        fd = self.fd(name, what)
        try:
            return os.fstat(fd).st_size
        except OSError as e:
            raise fsutil.unreadable(e, self.file_where(name), what) from None

    def fd(self, name: str, what: str = "data file") -> int:
        """The open descriptor of data file ``name`` (opened on first use; ``what`` names
        it in errors)."""
        if name not in self._fds:
            self._fds[name] = fsutil.open_regular(self.dir_fd, name, what=what,
                                                  path=self.file_where(name),
                                                  missing=missing_data_file)
        return self._fds[name]

    def medium_reader(self, name: str) -> FileReader:
        """O_DIRECT reads, or reads after the cached pages are dropped (see
        :mod:`uckpt.storage.readback`)."""
        self.fd(name)  # a regular file, opened without following a symlink
        return FileReader(self.dir_fd, name)

    def read_into(self, name: str, buf: Buffer, offset: int) -> int:
        return fsutil.pread_into(self._fds[name], buf, offset)

    def read_vectored(self, name: str, bufs: Sequence[Buffer], offset: int) -> int:
        return fsutil.preadv_into(self._fds[name], bufs, offset)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        if self.dir_fd >= 0:
            os.close(self.dir_fd)
            self.dir_fd = -1


# -- writing ----------------------------------------------------------------------------------
def check_target(directory: Path, overwrite: bool) -> None:
    """Refuse to replace what must not be replaced: a committed checkpoint (unless
    ``overwrite``), a file, or a non-empty directory that is not a checkpoint."""
    if not directory.exists():
        return
    if not directory.is_dir():
        raise CheckpointExistsError(f"{str(directory)!r} exists and is a file; refusing to "
                                    "replace it with a checkpoint", path=str(directory))
    if (directory / MANIFEST_NAME).exists():
        if not overwrite:
            raise CheckpointExistsError(
                f"{str(directory)!r} already holds a committed checkpoint", path=str(directory),
                hint="pass overwrite=True to replace it, or save to another directory")
        return
    if not fsutil.dir_is_empty(directory):
        raise CheckpointExistsError(
            f"{str(directory)!r} exists, is not empty and is not a uckpt checkpoint; "
            "refusing to write into it", path=str(directory),
            hint="choose an empty or new directory")


def make_parent_and_tmp(directory: Path) -> TmpLease:
    """Create ``directory``'s parent if needed and a locked temporary directory beside it."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    return make_tmp_dir(directory)


def publish(tmp: Path, directory: Path, overwrite: bool) -> None:
    """Make ``tmp`` visible as ``directory``: rename (onto nothing or an empty directory),
    or swap with the committed checkpoint there when overwriting; fsync the parent."""
    if directory.exists() and (directory / MANIFEST_NAME).exists():
        if not overwrite:  # appeared since check_target: never clobber
            raise committed_meanwhile(str(directory))
        if not fsutil.exchange(tmp, directory):
            old = directory.parent / f".{directory.name}{OLD_MARK}{secrets.token_hex(4)}"
            os.rename(directory, old)
            try:
                os.rename(tmp, directory)
            except BaseException:
                os.rename(old, directory)  # the committed checkpoint stays where it was
                raise
            tmp = old
        fsutil.fsync_dir(directory.parent)
        fsutil.remove_tree(tmp)  # now holds the replaced checkpoint
        return
    try:
        os.rename(tmp, directory)  # replaces an empty directory atomically
    except OSError as e:
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST):  # another saver committed it first
            raise committed_meanwhile(str(directory)) from None
        if e.errno == errno.ENOENT and not tmp.exists():
            raise SaveError(
                f"could not commit {str(directory)!r}: its temporary directory {tmp.name!r} "
                "was removed by another process during the save", path=str(directory),
                hint="only the root's writer removes interrupted saves, and never a live one; "
                     "something outside uckpt deleted it") from None
        raise SaveError(f"could not commit {str(directory)!r}: {e}", path=str(directory)) from e
    fsutil.fsync_dir(directory.parent)


def committed_meanwhile(where: str) -> CheckpointExistsError:
    return CheckpointExistsError(f"{where!r} was committed by another save during this one",
                                 path=where,
                                 hint="two savers wrote the same step; the first one's "
                                      "checkpoint is kept, this one is discarded")


def _drop_cache(fd: int) -> None:
    """Ask the kernel to forget cached pages, so a read-back comes from storage."""
    if hasattr(os, "posix_fadvise"):
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass


class LocalSink(CheckpointSink):
    """A save's hidden temporary directory beside ``directory`` (see :class:`Store.sink`)."""

    def __init__(self, directory: Path, tmp: Path, lease: Optional[TmpLease],
                 coordinator: bool, shared: bool) -> None:
        self.directory = directory
        self.where = str(directory)
        self.tmp = tmp
        self.token = tmp.name
        self.lease = lease
        self.created_tmp = lease is not None
        self.coordinator = coordinator
        self.shared = shared
        self.files: List[Path] = []

    def replica(self) -> str:
        if self.coordinator and not self.shared:
            return "coordinator"
        sees_coordinator = (self.tmp / COORDINATOR_MARK).exists()
        if not sees_coordinator:  # node-local storage: this node's copy of the directory
            self.directory.parent.mkdir(parents=True, exist_ok=True)
            try:
                self.lease = new_leased_dir(self.tmp)
                self.created_tmp = True
            except FileExistsError:
                pass
        st = os.stat(self.tmp)
        return ("coordinator" if sees_coordinator
                else f"{socket.gethostname()}:{st.st_dev}:{st.st_ino}")

    def _new(self, name: str) -> Path:
        path = self.tmp / name
        self.files.append(path)
        return path

    def write_pieces(self, name: str, size: int, pieces: List[Tuple[int, Buffer]]) -> None:
        posix_io.write_buffered(self._new(name), size, pieces)

    copies_stream_pieces = True  # posix_io.write_stream copies each piece into its buffer

    def write_stream(self, name: str, pieces: Iterable[Tuple[int, Buffer]],
                     reserve: Optional[int] = None) -> None:
        if reserve is not None:  # from where they are, into reserved space, as a plain save
            posix_io.write_buffered(self._new(name), None, pieces, reserve=reserve)
        else:  # each piece copied as it comes, written with O_DIRECT
            posix_io.write_stream(self._new(name), pieces)

    def write_image(self, name: str, image: NDArray[np.uint8], size: int) -> None:
        image_: Buffer = image  # type: ignore[assignment]  # (arrays: Buffer from 3.12)
        posix_io.write_image(self._new(name), image_, size)

    def copy_file(self, source: CheckpointSource, name: str, size: int) -> None:
        """Copy ``size`` bytes (in the kernel where it can), fsync, and drop the copy from
        the page cache (so a read-back comes from storage)."""
        actual = source.open_file(name)
        if actual != size:
            raise base.wrong_size(source.file_where(name), actual, size)
        dst = self._new(name)
        with open(dst, "xb") as fout:
            if isinstance(source, LocalSource):
                copied = fsutil.copy_range(source.fd(name), fout.fileno(), size)
            else:
                copied = copy_through(source, name, size, fout.fileno())
            if copied < size:  # cut short while it was copied
                raise base.wrong_size(source.file_where(name), copied, size)
            os.fsync(fout.fileno())
            _drop_cache(fout.fileno())

    def written(self, manifest: Manifest) -> CheckpointSource:
        return LocalSource(self.tmp)

    def commit(self, manifest_bytes: bytes, overwrite: bool = False) -> None:
        if self.shared:
            (self.tmp / COORDINATOR_MARK).unlink(missing_ok=True)
        fsutil.write_file_durably(self.tmp / MANIFEST_NAME, manifest_bytes)
        fsutil.fsync_dir(self.tmp)
        publish(self.tmp, self.directory, overwrite)
        self.created_tmp = False
        self.release()

    def release(self) -> None:
        if self.lease is not None:
            self.lease.release()
            self.lease = None

    def abort(self) -> None:
        """Remove what this rank made: the temporary directory it created (whatever the
        commit left in it: a manifest cut short by a full disk, or whole but never renamed
        into place; it is hidden, so never a committed checkpoint), else its own files.
        Best effort: what cannot be removed now is debris the root's writer removes
        once no live save holds it."""
        try:
            if self.created_tmp and self.tmp.exists():
                fsutil.remove_tree(self.tmp)
            else:
                for f in self.files:
                    f.unlink(missing_ok=True)
        except OSError as e:
            log.warning("could not remove %s after a failed save (%s); the root's writer "
                        "removes it at its next start", self.tmp, e)
        finally:
            self.release()


def copy_through(source: CheckpointSource, name: str, size: int, fd: int,
                 block: int = 8 << 20) -> int:
    """Copy the first ``size`` bytes of ``source``'s data file ``name`` to ``fd`` through a
    bounded buffer; returns the bytes copied (fewer only where the file ends)."""
    source.open_file(name)
    buf = memoryview(bytearray(min(block, max(size, 1))))
    done = 0
    while done < size:
        want = min(len(buf), size - done)
        n = source.read_into(name, buf[:want], done)
        view, pos = buf[:n], done
        while view:
            written = os.pwrite(fd, view, pos)
            view, pos = view[written:], pos + written
        done += n
        if n < want:
            break
    return done


# -- the root ---------------------------------------------------------------------------------
def committed_steps(root: Path) -> List[int]:
    """Steps of the committed checkpoints directly under ``root``, oldest first (a
    ``step_N`` directory holding a manifest; a symlink is never a checkpoint of a root)."""
    out = []
    try:
        with os.scandir(root) as it:
            for e in it:
                m = STEP_NAME.match(e.name)
                if not m:
                    continue
                if e.is_symlink():  # never a checkpoint of this root (docs/architecture.md)
                    log.debug("ignored %s: a symlink, not a checkpoint directory", e.path)
                elif e.is_dir(follow_symlinks=False) and \
                        os.path.lexists(os.path.join(e.path, MANIFEST_NAME)):
                    out.append(int(m.group(1)))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(out)


class LocalStore(Store):
    """A root directory (it need not exist until a writer saves)."""

    def __init__(self, root: PathLike) -> None:
        self.root = Path(root).absolute()
        self.where = str(self.root)

    def acts_here(self, rank: int) -> bool:
        return True  # every rank, for the copy of the directory it sees

    def exists(self) -> bool:
        return self.root.is_dir()

    def identity(self) -> Hashable:
        """(device, inode) of the directory, else its resolved path."""
        try:
            st = self.root.stat()
            return (st.st_dev, st.st_ino)
        except OSError:
            return str(self.root.resolve())

    def itself(self) -> Optional[Entry]:
        return listing_local.itself(self.root)

    def entries(self) -> List[Entry]:
        return listing_local.entries(self.root)

    def still_there(self, entry: Entry) -> bool:
        return listing_local.still_there(entry)

    def location(self, name: str) -> Path:
        return self.root / name

    def steps(self) -> List[int]:
        steps = committed_steps(self.root)
        hidden = hidden_steps(self) if steps else ()
        return [s for s in steps if s not in hidden] if hidden else steps

    def has(self, name: str) -> bool:
        return (self.root / name / MANIFEST_NAME).exists()

    def files_present(self, name: str, files: Sequence[str]) -> bool:
        return all(os.path.lexists(self.root / name / f) for f in files)

    def source(self, name: str, manifest: Optional[Manifest] = None) -> LocalSource:
        return LocalSource(self.root / name)

    def check_target(self, name: str, overwrite: bool) -> None:
        check_target(self.root / name, overwrite)

    def sink(self, name: str, overwrite: bool = False, shared: bool = False) -> LocalSink:
        directory = self.root / name
        check_target(directory, overwrite)
        lease = make_parent_and_tmp(directory)
        try:
            if shared:
                (lease.path / COORDINATOR_MARK).touch()  # seen by the ranks sharing it
        except BaseException:
            fsutil.remove_tree(lease.path)
            lease.release()
            raise
        return LocalSink(directory, lease.path, lease, True, shared)

    def join_sink(self, name: str, token: str) -> LocalSink:
        directory = self.root / name
        return LocalSink(directory, directory.parent / token, None, False, True)

    def delete(self, name: str) -> bool:
        """Hide first (rename), then delete: a crash never leaves a half-deleted checkpoint."""
        path = self.root / name
        hidden = path.parent / f".{path.name}{DEL_MARK}{secrets.token_hex(4)}"
        try:
            os.rename(path, hidden)
        except FileNotFoundError:
            return False  # another rank sharing this tier deleted it first
        fsutil.remove_tree(hidden)
        return True

    def remove_debris(self) -> List[str]:
        return remove_debris(self.root, MANIFEST_NAME)

    def writer_lock(self, job: str, shared: bool) -> WriterLock:
        return WriterLock(self.root, job, shared)

    def prepare_root(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)

    def record(self, name: str) -> Optional[bytes]:
        return archive_local.read_record(self.root, name)

    def put_record(self, name: str, data: bytes) -> None:
        archive_local.put_record(self.root, name, data)

    def drop_record(self, name: str) -> None:
        archive_local.drop_record(self.root, name)

    def archive(self, name: str, into: str, keep: bool = False) -> bool:
        return archive_local.archive(self.root, name, into, keep)

    def archives(self) -> List[str]:
        return archive_local.archives(self.root)

    def within(self, into: str) -> "LocalStore":
        return LocalStore(self.root / into)
