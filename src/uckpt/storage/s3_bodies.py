"""Request bodies for uploads: a byte range of a caller's buffer or of a local file, as a
seekable file-like object. botocore reads a body in small blocks while sending it and
seeks it back to 0 before a retry, so an upload never copies a whole part (let alone the
whole object) into new memory."""
from __future__ import annotations

import contextlib
import os
import stat
from typing import TYPE_CHECKING, Iterator, Union

from ..codecs.checksum import crc32c
from ..errors import CheckpointNotFoundError, TruncatedDataError, UnsupportedObjectError

if TYPE_CHECKING:  # collections.abc.Buffer from Python 3.12 on
    from typing_extensions import Buffer

#: what :func:`open_source` uploads: a buffer, or a file's path or descriptor
Source = Union["Buffer", str, "os.PathLike[str]", int]
_CRC_BLOCK = 8 << 20  # bytes of a file read at once to checksum a part


class RangeBody:
    """Bytes ``[offset, offset + length)`` of a buffer or a file descriptor, read on
    demand. Positions (``seek``/``tell``) are relative to ``offset``."""

    def __init__(self, source: Union[memoryview, int], offset: int, length: int):
        self._view = source if isinstance(source, memoryview) else None
        self._fd = source if isinstance(source, int) else None
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
            assert self._fd is not None  # not a buffer: a descriptor
            data = os.pread(self._fd, n, start)
            if not data:
                raise TruncatedDataError(f"the file being uploaded ended at byte {start}, "
                                         f"before the {self._offset + self._length} bytes "
                                         "asked for (it shrank during the upload)")
        self._pos += len(data)
        return data

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
        """CRC-32C of the whole range: of a buffer in place, of a
        file read once more through one reused block (fresh memory per block would cost
        a page fault per page)."""
        if self._view is not None:
            return crc32c(self._view[self._offset:self._offset + self._length])
        assert self._fd is not None  # not a buffer: a descriptor
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
                ) -> Iterator[Union[memoryview, int]]:
    """The bytes to upload to ``url`` as a flat memoryview (of a buffer: bytes, bytearray,
    memoryview, a C-contiguous NumPy array), a file descriptor (a path, opened and
    closed here, or an open descriptor, left open), after checking
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
