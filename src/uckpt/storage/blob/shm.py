"""A blob store in the node's shared memory: a :class:`~.posix.PosixStore` in a directory
of a memory-backed file system (tmpfs, e.g. ``/dev/shm``) that refuses an object that
would not fit in the free space before writing any of it.

Its data outlive the process that wrote them but not the node (a reboot, or anything
that empties the file system, loses them): ``durable`` is False. Commit rule, checksums
and locks are the POSIX store's.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ...errors import LevelFullError
from .posix import PosixStore

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from .base import BlobReader, Pieces


class ShmStore(PosixStore):
    """Keys are files below ``root`` (a directory in shared memory); ``url`` names the
    root in messages (``shm://NAME``)."""

    durable = False

    def __init__(self, root: str | os.PathLike[str], url: str) -> None:
        super().__init__(root)
        self.url = url

    def free_bytes(self) -> int:
        """Bytes this user may still write on the file system of the root (of its
        nearest existing parent while the root is not made yet)."""
        path = os.path.abspath(self.root)
        while not os.path.isdir(path) and os.path.dirname(path) != path:
            path = os.path.dirname(path)
        st = os.statvfs(path)
        return st.f_bavail * st.f_frsize

    def check_room(self, key: str, nbytes: int) -> None:
        """LevelFullError (nothing written) if ``nbytes`` more do not fit."""
        free = self.free_bytes()
        if nbytes > free:
            raise LevelFullError(
                f"the memory level {self.url} cannot hold {key!r}: it needs {nbytes} bytes "
                f"and the shared memory of this node ({self.root}) has {free} bytes free",
                path=self.where(key), needed=nbytes, free=free,
                hint="give this tier a smaller keep, save less per node, or make the "
                     "shared memory larger (mount -o remount,size=... /dev/shm, or set "
                     "UCKPT_SHM_DIR to a larger tmpfs); earlier checkpoints are intact")

    def write_pieces(self, key: str, pieces: Pieces, size: int | None = None,
                     reserve: int = 0) -> None:
        self.check_room(key, size if size is not None else reserve)
        super().write_pieces(key, pieces, size, reserve)

    def write_image(self, key: str, image: Buffer, size: int) -> None:
        self.check_room(key, size)
        super().write_image(key, image, size)

    def copy_in(self, key: str, reader: BlobReader, size: int) -> int:
        self.check_room(key, size)
        return super().copy_in(key, reader, size)
