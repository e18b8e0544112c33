"""Reading inputs piece by piece: positioned reads, windows on a file, zip members, size checks.

Nothing here reads a whole input into memory; every size an input declares is
checked against the bytes that are really there before anything is allocated.
"""
from __future__ import annotations

import errno
import io
import os
import stat
import struct
import zipfile
import zlib
from typing import Dict, Iterator, Optional

import numpy as np

from ..errors import (CheckpointNotFoundError, ChecksumMismatchError, CorruptCheckpointError,
                      TruncatedDataError, UnsupportedObjectError)
from ..storage.fsutil import pread_into
from .errors import UnsafeInputError, UnsafeNameError
from .limits import check_ratio, current

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


#: what to do with a directory named where a file's format was asked for
DIRECTORY_HINT = ("the directory formats are uckpt, dcp, hf, tf, deepspeed and orbax: leave out "
                  "--from (src_format=) to detect which, or name one of them")


def open_regular(path, where: Optional[str] = None, follow: bool = True) -> int:
    """A read-only descriptor of the regular file ``path``: never blocks on a FIFO or a
    device, refuses anything that is not a regular file, and with ``follow=False`` a
    symbolic link (a file inside a source directory must not lead out of it)."""
    where = where or os.fspath(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise CheckpointNotFoundError(f"{where} does not exist", path=where) from None
    except IsADirectoryError:
        raise UnsafeInputError(f"{where} is a directory, not a file", path=where,
                               hint=DIRECTORY_HINT) from None
    except OSError as e:
        if e.errno == errno.ELOOP and not follow:
            raise UnsafeInputError(f"{where} is a symbolic link; files inside a checkpoint "
                                   "directory are read only when they are regular files",
                                   path=where) from None
        raise
    mode = os.fstat(fd).st_mode
    if stat.S_ISDIR(mode):
        os.close(fd)
        raise UnsafeInputError(f"{where} is a directory, not a file", path=where,
                               hint=DIRECTORY_HINT)
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a device or socket"
        raise UnsafeInputError(f"{where} is {kind}, not a regular file; refused (reading it "
                               "could block or never end)", path=where)
    return fd


class RandomAccessFile:
    """An input file opened once, read with positioned reads (safe from several leaves).

    Only regular files are opened (see :func:`open_regular`); every read is checked to lie
    inside the file before anything is read.
    """

    def __init__(self, path, follow: bool = True) -> None:
        self.path = os.fspath(path)
        self.fd = open_regular(self.path, follow=follow)
        self.size = os.fstat(self.fd).st_size

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def read_into(self, arr: np.ndarray, offset: int) -> np.ndarray:
        view = arr.reshape(-1).view(np.uint8)
        if offset < 0 or offset > self.size:
            raise CorruptCheckpointError(f"{self.path}: a read at offset {offset} lies outside "
                                         f"the file ({self.size} bytes)", path=self.path,
                                         offset=offset)
        n = pread_into(self.fd, view.data, offset)
        if n != view.nbytes:
            raise TruncatedDataError(f"{self.path}: {view.nbytes} bytes expected at offset "
                                     f"{offset}, the file ends at {offset + n}",
                                     path=self.path, offset=offset + n)
        return arr

    def pread(self, n: int, offset: int) -> bytes:
        require_fits(n, self.size - offset, f"a read at offset {offset}", self.path)
        return self.read_into(np.empty(n, dtype=np.uint8), offset).tobytes()


class Window(io.RawIOBase):
    """A read-only, seekable file over bytes ``[base, base + length)`` of a RandomAccessFile
    (a torch.save archive inside a DCP data file, or a whole file). ``read(n)`` allocates
    no more than what is left, whatever ``n`` asks."""

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

    def read(self, n: int = -1) -> bytes:
        left = max(0, self.length - self.pos)
        return super().read(left if n is None or n < 0 or n > left else n)

    def readinto(self, buf) -> int:
        view = memoryview(buf).cast("B")
        n = max(0, min(len(view), self.length - self.pos))
        got = pread_into(self.raf.fd, view[:n], self.base + self.pos) if n else 0
        self.pos += got
        return got


class BoundedReader(io.BufferedReader):
    """A buffered reader of a :class:`Window` whose ``read(n)`` allocates no more than what
    is left (``io.BufferedReader.read(n)`` allocates ``n`` bytes first: a pickle declaring
    a string of 2**60 bytes must not get them)."""

    def read(self, n: Optional[int] = -1) -> bytes:
        raw = self.raw
        left = max(0, raw.length - self.tell()) if isinstance(raw, Window) else None
        if left is not None and (n is None or n < 0 or n > left):
            n = left
        return super().read(n)


_PIECE = 1 << 20  # bytes inflated (or read) at a time
_DEFLATED_HINT = "the archive is damaged or was crafted; nothing beyond its declared size " \
                 "was inflated"


class ZipArchive:
    """A zip archive (NPZ, torch.save) read member by member, never whole.

    The central directory is parsed by :mod:`zipfile`; member data is read here, not by
    zipfile: stored members straight from the file at their data offset, deflated ones
    inflated in pieces of 1 MiB straight into the caller's array, never past the size the
    member declares (a member that inflates to more, or less, than it declares, or whose
    CRC-32 differs, is refused when read to its end). A member may declare at most 1032
    times its compressed size (the most deflate can expand), or ``max_ratio`` times where
    the limits in force when the archive is opened set less; other compression methods
    and encrypted members are refused. :meth:`pieces` streams a whole member.
    """

    def __init__(self, raf: RandomAccessFile, base: int = 0, length: Optional[int] = None,
                 where: Optional[str] = None) -> None:
        self.raf, self.base = raf, base
        self.window = Window(raf, base, length)
        self.where = where or raf.path
        self.limits = current()
        try:
            zf = zipfile.ZipFile(self.window)
            infos = zf.infolist()
            zf.close()
        except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError, EOFError,
                struct.error, IndexError, KeyError, OverflowError, MemoryError,
                NotImplementedError) as e:
            raise CorruptCheckpointError(f"{self.where}: not a readable zip archive: "
                                         f"{type(e).__name__}: {e}", path=self.where) from None
        self.members: Dict[str, zipfile.ZipInfo] = {}
        for info in infos:
            if "\0" in info.orig_filename:
                raise UnsafeNameError(f"{self.where}: zip member {info.orig_filename!r} holds a "
                                      "NUL character (zip tools cut the name there)",
                                      path=self.where, name=info.orig_filename)
            if info.filename in self.members:
                raise CorruptCheckpointError(f"{self.where}: the zip archive holds "
                                             f"{info.filename!r} twice", path=self.where)
            self.members[info.filename] = info

    def close(self) -> None:
        pass  # the file belongs to the caller; nothing of zipfile is kept open

    def _fail(self, info: zipfile.ZipInfo, msg: str, cls=CorruptCheckpointError):
        raise cls(f"{self.where}: zip member {info.filename!r} {msg}", path=self.where,
                  hint=_DEFLATED_HINT if info.compress_type == zipfile.ZIP_DEFLATED else None)

    def _check(self, info: zipfile.ZipInfo) -> None:
        what = f"zip member {info.filename!r}"
        if info.flag_bits & 0x1:
            self._fail(info, "is encrypted; uckpt reads only unencrypted archives",
                       UnsupportedObjectError)
        if info.compress_type == zipfile.ZIP_STORED:
            require_fits(info.file_size, self.window.length - info.header_offset, what,
                         self.where)
            if info.compress_size != info.file_size:
                self._fail(info, "is stored but its sizes differ")
        elif info.compress_type == zipfile.ZIP_DEFLATED:
            require_fits(info.compress_size, self.window.length - info.header_offset, what,
                         self.where)
            self._check_ratio(info)
        else:
            self._fail(info, f"uses compression method {info.compress_type}; uckpt reads "
                             "stored and deflated members only (recompress the archive with "
                             "deflate)", UnsupportedObjectError)

    def _check_ratio(self, info: zipfile.ZipInfo) -> None:
        """Refuse a deflated member declaring more than 1032 bytes per compressed byte (more
        than deflate can make), or more than a lower ``max_ratio`` in force."""
        stored = max(info.compress_size, 1)
        if info.file_size > stored * MAX_DEFLATE_RATIO:
            raise CorruptCheckpointError(
                f"{self.where}: zip member {info.filename!r} declares {info.file_size} bytes "
                f"from {info.compress_size} compressed, {info.file_size / stored:.0f} per byte; "
                f"deflate cannot expand more than {MAX_DEFLATE_RATIO} per byte", path=self.where,
                hint="the archive is damaged or was crafted; nothing was inflated")
        check_ratio(info.file_size, info.compress_size, f"zip member {info.filename!r}",
                    self.where, self.limits)

    def data_offset(self, info: zipfile.ZipInfo) -> int:
        """Where a member's (stored or compressed) bytes start in the file."""
        if not 0 <= info.header_offset <= self.window.length - 30:
            self._fail(info, f"has its local header at {info.header_offset}, outside the "
                             "archive")
        head = self.raf.pread(30, self.base + info.header_offset)
        if head[:4] != b"PK\x03\x04":
            self._fail(info, "has a bad local header")
        n = int.from_bytes(head[26:28], "little") + int.from_bytes(head[28:30], "little")
        start = info.header_offset + 30 + n
        require_fits(info.compress_size, self.window.length - start,
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
        return self.read_into(info, 0, np.empty(info.file_size, dtype=np.uint8)).tobytes()

    def read_into(self, info: zipfile.ZipInfo, skip: int, arr: np.ndarray) -> np.ndarray:
        """Fill ``arr`` with the member's bytes from ``skip`` on."""
        self._check(info)
        nbytes = arr.nbytes
        require_fits(skip + nbytes, info.file_size, f"zip member {info.filename!r}",
                     self.where)
        start = self.data_offset(info)
        if info.compress_type == zipfile.ZIP_STORED:
            return self.raf.read_into(arr, start + skip)
        self._inflate(info, start, skip, arr.reshape(-1).view(np.uint8))
        return arr

    def pieces(self, info: zipfile.ZipInfo) -> Iterator[bytes]:
        """The member's bytes in order, in pieces of at most 1 MiB (stored or inflated), never
        more than it declares; read to its end, a deflated member's size and CRC-32 are
        checked as by :meth:`read_into`."""
        self._check(info)
        start = self.data_offset(info)
        if info.compress_type == zipfile.ZIP_STORED:
            for at in range(0, info.file_size, _PIECE):
                yield self.raf.pread(min(_PIECE, info.file_size - at), start + at)
            return
        yield from self._inflated(info, start, info.file_size)

    def _inflate(self, info: zipfile.ZipInfo, start: int, skip: int, out: np.ndarray) -> None:
        """Inflate the member into ``out`` (its bytes ``[skip, skip + len(out))``), never
        holding more than a piece beyond ``out``."""
        made = 0
        for piece in self._inflated(info, start, skip + out.nbytes):
            lo, hi = max(skip - made, 0), len(piece)
            if hi > lo:
                at = made + lo - skip
                out[at:at + hi - lo] = np.frombuffer(piece, np.uint8, hi - lo, lo)
            made += len(piece)

    def _inflated(self, info: zipfile.ZipInfo, start: int, want: int) -> Iterator[bytes]:
        """The member's first ``want`` bytes, inflated a piece at a time; read to its end
        (``want`` its declared size), the member must end exactly there with its CRC-32."""
        whole = want == info.file_size
        inflater = zlib.decompressobj(-15)
        pos, end = start, start + info.compress_size
        made, crc = 0, 0

        def feed() -> bytes:
            """More compressed bytes: what the last call left, else the next piece."""
            nonlocal pos
            if inflater.unconsumed_tail:
                return inflater.unconsumed_tail
            n = min(_PIECE, end - pos)
            data = self.raf.pread(n, pos) if n > 0 else b""
            pos += max(n, 0)
            return data

        try:
            while made < want:
                data = feed()
                piece = inflater.decompress(data, min(_PIECE, want - made))
                if not piece:
                    if inflater.eof or not data:
                        self._fail(info, f"ends after {made} bytes, but declares "
                                         f"{info.file_size}")
                    continue
                if whole:
                    crc = zlib.crc32(piece, crc)
                made += len(piece)
                yield piece
            while whole and not inflater.eof:  # nothing may follow the declared bytes
                data = feed()
                if inflater.decompress(data, 1):
                    self._fail(info, f"inflates to more than the {info.file_size} bytes it "
                                     "declares; refused", UnsafeInputError)
                if not data:
                    self._fail(info, "has an incomplete deflate stream")
        except zlib.error as e:
            self._fail(info, f"is not a valid deflate stream: {e}")
        if whole and crc != info.CRC:
            self._fail(info, f"fails its CRC-32 check (stored {info.CRC:08x}, data "
                             f"{crc:08x})", ChecksumMismatchError)
