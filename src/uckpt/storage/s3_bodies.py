"""Request bodies for uploads: a byte range of a caller's buffer, of a local file or of a
:class:`Readable` (bytes assembled on demand, e.g. from the arrays of a save), as a
seekable file-like object. botocore reads a body in small blocks while sending it and
seeks it back to 0 before a retry, so an upload never copies a whole part (let alone the
whole object) into new memory."""
from __future__ import annotations

import bisect
import contextlib
import os
import stat
from typing import TYPE_CHECKING, Iterator, Sequence, Tuple, Union

from ..checksum import crc32c
from ..errors import CheckpointNotFoundError, TruncatedDataError, UnsupportedObjectError

if TYPE_CHECKING:  # collections.abc.Buffer from Python 3.12 on
    from typing_extensions import Buffer

#: what :func:`open_source` uploads: a buffer, a file's path or descriptor, a Readable
Source = Union["Buffer", str, "os.PathLike[str]", int, "Readable"]
_CRC_BLOCK = 8 << 20  # bytes of a file read at once to checksum a part


class Readable:
    """Something to upload that is neither one buffer nor a file: ``size`` bytes, read with
    ``pread(n, offset)`` (like :func:`os.pread`: fewer bytes only at the end)."""

    size: int = 0

    def pread(self, n: int, offset: int) -> Union[bytes, bytearray]:
        raise NotImplementedError

    def crc32c(self, offset: int, length: int) -> int:
        """CRC-32C of bytes ``[offset, offset + length)`` (read in blocks; override to
        compute it in place)."""
        value, end = 0, offset + length
        while offset < end:
            data = self.pread(min(_CRC_BLOCK, end - offset), offset)
            if not data:
                raise TruncatedDataError(f"the source being uploaded ended at byte {offset}, "
                                         f"before the {end} bytes asked for")
            value = crc32c(data, value)
            offset += len(data)
        return value


class Gather(Readable):
    """``size`` bytes made of ``(offset, buffer)`` pieces sorted by offset, the gaps
    between them zeros: a data file of a save, assembled on demand from the arrays
    (no copy of the whole file is ever made)."""

    def __init__(self, pieces: Sequence[Tuple[int, Buffer]], size: int):
        self.size = size
        self._offsets = [offset for offset, _ in pieces]
        self._views = [memoryview(data).cast("B") for _, data in pieces]

    def pread(self, n: int, offset: int) -> bytearray:
        end = min(offset + n, self.size)
        if end <= offset:
            return bytearray()
        out = bytearray(end - offset)
        i = max(0, bisect.bisect_right(self._offsets, offset) - 1)
        while i < len(self._offsets) and self._offsets[i] < end:
            start, view = self._offsets[i], self._views[i]
            lo, hi = max(start, offset), min(start + len(view), end)
            if lo < hi:
                out[lo - offset:hi - offset] = view[lo - start:hi - start]
            i += 1
        return out

    def crc32c(self, offset: int, length: int) -> int:
        """In place: each piece's bytes, zeros for the gaps between them."""
        value, pos, end = 0, offset, min(offset + length, self.size)
        i = max(0, bisect.bisect_right(self._offsets, pos) - 1)
        while pos < end:
            start = self._offsets[i] if i < len(self._offsets) else end
            view = self._views[i] if i < len(self._offsets) else memoryview(b"")
            if start > pos:  # a gap before this piece (or after the last)
                gap = min(start, end) - pos
                value = _crc_zeros(value, gap)
                pos += gap
                continue
            lo, hi = pos - start, min(start + len(view), end) - start
            if lo < hi:
                value = crc32c(view[lo:hi], value)
                pos = start + hi
            i += 1
        return value


_ZEROS = 1 << 16


def _crc_zeros(value: int, n: int) -> int:
    zeros = bytes(_ZEROS)
    while n:
        k = min(n, _ZEROS)
        value = crc32c(zeros[:k], value)
        n -= k
    return value


class RangeBody:
    """Bytes ``[offset, offset + length)`` of a buffer or a file descriptor, read on
    demand. Positions (``seek``/``tell``) are relative to ``offset``."""

    def __init__(self, source: Union[memoryview, int, Readable], offset: int, length: int):
        self._view = source if isinstance(source, memoryview) else None
        self._fd = source if isinstance(source, int) else None
        self._reader = source if isinstance(source, Readable) else None
        self._offset, self._length, self._pos = offset, length, 0

    def __len__(self) -> int:
        return self._length

    def read(self, n: int = -1) -> Union[bytes, bytearray]:
        if n is None or n < 0:
            n = self._length - self._pos
        n = min(n, self._length - self._pos)
        if n <= 0:
            return b""
        start = self._offset + self._pos
        data: Union[bytes, bytearray]
        if self._view is not None:
            data = bytes(self._view[start:start + n])
        else:
            data = self._pread(n, start)
            if not data:
                raise TruncatedDataError(f"the file being uploaded ended at byte {start}, "
                                         f"before the {self._offset + self._length} bytes "
                                         "asked for (it shrank during the upload)")
        self._pos += len(data)
        return data

    def _pread(self, n: int, offset: int) -> Union[bytes, bytearray]:
        if self._reader is not None:
            return self._reader.pread(n, offset)
        assert self._fd is not None  # neither a buffer nor a Readable: a descriptor
        return os.pread(self._fd, n, offset)

    def seek(self, pos: int, whence: int = 0) -> int:
        base = (0, self._pos, self._length)[whence]
        self._pos = max(0, min(self._length, base + pos))
        return self._pos

    def tell(self) -> int:
        return self._pos

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def crc32c(self) -> int:
        """CRC-32C of the whole range: of a buffer or a :class:`Readable` in place, of a
        file read once more through one reused block (fresh memory per block would cost
        a page fault per page)."""
        if self._view is not None:
            return crc32c(self._view[self._offset:self._offset + self._length])
        if self._reader is not None:
            return self._reader.crc32c(self._offset, self._length)
        assert self._fd is not None  # neither a buffer nor a Readable: a descriptor
        value, pos, end = 0, self._offset, self._offset + self._length
        block = memoryview(bytearray(min(_CRC_BLOCK, max(self._length, 1))))
        while pos < end:
            n = os.preadv(self._fd, [block[:min(len(block), end - pos)]], pos)
            if not n:
                raise TruncatedDataError(f"the file being uploaded ended at byte {pos}, "
                                         f"before the {end} bytes asked for")
            value = crc32c(block[:n], value)
            pos += n
        return value


@contextlib.contextmanager
def open_source(source: Source, size: int, url: str
                ) -> Iterator[Union[memoryview, int, Readable]]:
    """The bytes to upload to ``url`` as a flat memoryview (of a buffer: bytes, bytearray,
    memoryview, a C-contiguous NumPy array), a file descriptor (a path, opened and
    closed here, or an open descriptor, left open) or a :class:`Readable`, after checking
    that it holds at least ``size`` bytes."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise UnsupportedObjectError(f"upload to {url}: size must be an integer >= 0, "
                                     f"not {size!r}", path=url)
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            raise CheckpointNotFoundError(f"cannot upload {path!r} to {url}: it does not "
                                          "exist", path=path) from None
        try:
            yield _checked_fd(fd, size, url, path)
        finally:
            os.close(fd)
        return
    if isinstance(source, int) and not isinstance(source, bool):
        yield _checked_fd(source, size, url, f"file descriptor {source}")
        return
    if isinstance(source, Readable):
        if source.size < size:
            raise UnsupportedObjectError(f"upload to {url}: the source holds {source.size} "
                                         f"bytes, fewer than the {size} asked for", path=url)
        yield source
        return
    try:
        if isinstance(source, bool):  # no buffer (what memoryview() says of it too)
            raise TypeError(source)
        view = memoryview(source)
    except TypeError:
        raise UnsupportedObjectError(
            f"upload to {url}: cannot upload a {type(source).__name__}; give a buffer "
            "(bytes, memoryview, NumPy array), a file path or a file descriptor",
            path=url) from None
    if not view.c_contiguous:
        raise UnsupportedObjectError(f"upload to {url}: the buffer is not C-contiguous",
                                     path=url, hint="upload a contiguous copy")
    view = view.cast("B") if view.ndim != 1 or view.format != "B" else view
    if view.nbytes < size:
        raise UnsupportedObjectError(f"upload to {url}: the buffer holds {view.nbytes} "
                                     f"bytes, fewer than the {size} asked for", path=url)
    yield view


def _checked_fd(fd: int, size: int, url: str, name: str) -> int:
    st = os.fstat(fd)
    if stat.S_ISREG(st.st_mode) and st.st_size < size:
        raise TruncatedDataError(f"{name} holds {st.st_size} bytes, fewer than the {size} "
                                 f"to upload to {url}", path=name)
    if not stat.S_ISREG(st.st_mode):
        raise UnsupportedObjectError(f"{name} is not a regular file; only regular files "
                                     f"are uploaded to {url}", path=name)
    return fd
