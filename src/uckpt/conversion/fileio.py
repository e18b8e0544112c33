"""Reading inputs piece by piece: positioned reads, windows on a file, zip members, size checks.

Nothing here reads a whole input into memory; every size an input declares is
checked against the bytes that are really there before anything is allocated.
"""
from __future__ import annotations

import io
import os
import zipfile
from typing import Dict, Optional

import numpy as np

from ..errors import CorruptCheckpointError, TruncatedDataError
from ..fsutil import pread_into

#: the most a deflate stream can expand (about 1032:1); a compressed entry declaring more
#: than this many times its stored size is refused
MAX_DEFLATE_RATIO = 1032


def require_fits(declared: int, available: int, what: str, path: str) -> None:
    """Refuse (before any allocation) an entry that declares more bytes than the file holds."""
    if declared > available:
        raise CorruptCheckpointError(
            f"{path}: {what} declares {declared} bytes, but the file holds only {available} "
            "for it", path=path,
            hint="the file is truncated or was crafted; nothing was allocated")


class RandomAccessFile:
    """An input file opened once, read with positioned reads (safe from several leaves)."""

    def __init__(self, path) -> None:
        self.path = os.fspath(path)
        self.fd = os.open(self.path, os.O_RDONLY)
        self.size = os.fstat(self.fd).st_size

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def read_into(self, arr: np.ndarray, offset: int) -> np.ndarray:
        view = arr.reshape(-1).view(np.uint8)
        n = pread_into(self.fd, view, offset)
        if n != view.nbytes:
            raise TruncatedDataError(f"{self.path}: {view.nbytes} bytes expected at offset "
                                     f"{offset}, the file ends at {offset + n}",
                                     path=self.path, offset=offset + n)
        return arr

    def pread(self, n: int, offset: int) -> bytes:
        return self.read_into(np.empty(n, dtype=np.uint8), offset).tobytes()


class Window(io.RawIOBase):
    """A read-only, seekable file over bytes ``[base, base + length)`` of a RandomAccessFile
    (a torch.save archive inside a DCP data file, or a whole file)."""

    def __init__(self, raf: RandomAccessFile, base: int = 0, length: Optional[int] = None):
        super().__init__()
        self.raf, self.base = raf, base
        self.length = raf.size - base if length is None else length
        self.pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        start = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.length}[whence]
        self.pos = max(0, start + offset)
        return self.pos

    def readinto(self, buf) -> int:
        view = memoryview(buf).cast("B")
        n = max(0, min(len(view), self.length - self.pos))
        got = pread_into(self.raf.fd, view[:n], self.base + self.pos) if n else 0
        self.pos += got
        return got


class ZipArchive:
    """A zip archive (NPZ, torch.save) read member by member, never whole.

    Stored members are read straight from the file at their data offset;
    compressed ones are streamed, after their declared size is checked against
    what their compressed bytes can possibly hold.
    """

    def __init__(self, raf: RandomAccessFile, base: int = 0, length: Optional[int] = None,
                 where: Optional[str] = None) -> None:
        self.raf, self.base = raf, base
        self.window = Window(raf, base, length)
        self.where = where or raf.path
        try:
            self.zf = zipfile.ZipFile(self.window)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError) as e:
            raise CorruptCheckpointError(f"{self.where}: not a readable zip archive: {e}",
                                         path=self.where) from None
        self.members: Dict[str, zipfile.ZipInfo] = {}
        for info in self.zf.infolist():
            if info.filename in self.members:
                raise CorruptCheckpointError(f"{self.where}: the zip archive holds "
                                             f"{info.filename!r} twice", path=self.where)
            self.members[info.filename] = info

    def close(self) -> None:
        self.zf.close()

    def _check(self, info: zipfile.ZipInfo) -> None:
        what = f"zip member {info.filename!r}"
        if info.compress_type == zipfile.ZIP_STORED:
            require_fits(info.file_size, self.window.length - info.header_offset, what,
                         self.where)
            if info.compress_size != info.file_size:
                raise CorruptCheckpointError(f"{self.where}: {what} is stored but its sizes "
                                             "differ", path=self.where)
        else:
            require_fits(info.compress_size, self.window.length - info.header_offset, what,
                         self.where)
            require_fits(info.file_size, max(info.compress_size, 1) * MAX_DEFLATE_RATIO,
                         what + " (compressed)", self.where)

    def data_offset(self, info: zipfile.ZipInfo) -> int:
        """Where a stored member's bytes start in the file (from its local header)."""
        head = self.raf.pread(30, self.base + info.header_offset)
        if head[:4] != b"PK\x03\x04":
            raise CorruptCheckpointError(f"{self.where}: bad local header for zip member "
                                         f"{info.filename!r}", path=self.where)
        n = int.from_bytes(head[26:28], "little") + int.from_bytes(head[28:30], "little")
        start = info.header_offset + 30 + n
        require_fits(info.file_size, self.window.length - start,
                     f"zip member {info.filename!r}", self.where)
        return self.base + start

    def read(self, name: str, limit: int) -> bytes:
        """A small member (a pickle, a version record), whole."""
        info = self.members[name]
        self._check(info)
        if info.file_size > limit:
            raise CorruptCheckpointError(f"{self.where}: zip member {name!r} is "
                                         f"{info.file_size} bytes, more than {limit}",
                                         path=self.where)
        return self.zf.read(info)

    def read_into(self, info: zipfile.ZipInfo, skip: int, arr: np.ndarray) -> np.ndarray:
        """Fill ``arr`` with the member's bytes from ``skip`` on."""
        self._check(info)
        nbytes = arr.nbytes
        require_fits(skip + nbytes, info.file_size, f"zip member {info.filename!r}",
                     self.where)
        if info.compress_type == zipfile.ZIP_STORED:
            return self.raf.read_into(arr, self.data_offset(info) + skip)
        view = arr.reshape(-1).view(np.uint8)
        with self.zf.open(info) as f:
            while skip:
                skip -= len(f.read(min(skip, 1 << 20)))
            done = 0
            while done < nbytes:
                n = f.readinto(memoryview(view)[done:])
                if not n:
                    raise TruncatedDataError(f"{self.where}: zip member {info.filename!r} "
                                             "ends early", path=self.where)
                done += n
        return arr
