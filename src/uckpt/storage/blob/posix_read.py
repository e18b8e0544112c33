"""Reading a :class:`~uckpt.storage.blob.posix.PosixStore`: an object held open
(:class:`PosixReader`) and the walk of its directory tree (:func:`walk`). Only regular
files are read or listed; no symbolic link is followed."""
from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from .. import fsutil
from ...errors import CheckpointNotFoundError, NotACheckpointError
from .base import RESERVED, BlobReader, check_offset, writable_view

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


def entries(fd: int) -> list[os.DirEntry[str]]:
    """The entries of the directory ``fd``, the store's temporary files left out."""
    with os.scandir(fd) as it:
        return [e for e in it if not e.name.startswith(RESERVED)]


def walk(fd: int, prefix: str) -> Iterator[tuple[str, int]]:
    """Every regular file below the directory ``fd`` (closed when done) as ``(key, size)``,
    keys starting with ``prefix``; symbolic links and other entries are left out."""
    try:
        for entry in entries(fd):
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed since the directory was read
            if stat.S_ISREG(st.st_mode):
                yield prefix + entry.name, st.st_size
            elif stat.S_ISDIR(st.st_mode):
                try:
                    sub = fsutil.open_dir(entry.name, dir_fd=fd, follow_symlinks=False)
                except (CheckpointNotFoundError, NotACheckpointError):
                    continue  # removed or replaced meanwhile
                yield from walk(sub, prefix + entry.name + "/")
    finally:
        os.close(fd)
