"""Binary columns of a manifest: integers stored as byte planes, deflated, in Base64.

A column of ``n`` little-endian values ``width`` bytes wide is stored as byte planes:
byte 0 of every value, then byte 1 of every value, ... (similar bytes side by side
deflate well). :func:`planes` writes one, :func:`unplanes` reads one back;
:func:`b64decode` and :class:`Inflater` decode the text with every size checked before
anything larger than the text is allocated.
"""
from __future__ import annotations

import base64
import binascii
import zlib
from typing import Any, Callable, NoReturn

import numpy as np

Fail = Callable[[str, str], NoReturn]


def planes(values: np.ndarray, width: int) -> bytes:
    """The values' little-endian bytes as ``width`` byte planes (all bytes 0, then 1, ...)."""
    raw = values.astype(f"<u{width}").view(np.uint8).reshape(len(values), width)
    return np.ascontiguousarray(raw.T).tobytes()


def unplanes(data: bytes, pos: int, n: int, width: int) -> np.ndarray:
    """The ``n`` values of ``width`` bytes stored as byte planes at ``data[pos:]``, as
    uint64 (width 8), uint32 (4) or uint8 (1)."""
    if n == 0:
        return np.zeros(0, np.uint64 if width == 8 else np.uint32 if width == 4 else np.uint8)
    grid = np.frombuffer(data, np.uint8, width * n, pos).reshape(width, n)
    values: np.ndarray = np.ascontiguousarray(grid.T).view(f"<u{width}").reshape(n)
    return values.astype(np.uint64 if width == 8 else np.uint32 if width == 4 else np.uint8)


def b64_length(nbytes: int) -> int:
    """Characters of the padded Base64 text of ``nbytes`` bytes."""
    return 4 * -(-nbytes // 3)


def b64encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def b64decode(fail: Fail, text: str, at: str) -> bytes:
    """The bytes of Base64 ``text`` (RFC 4648, padded; ``fail(at, message)`` if not)."""
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError) as e:
        fail(at, f"not Base64 text (RFC 4648 alphabet with '=' padding): {e}")


class Inflater:
    """One zlib stream, inflated a known number of bytes at a time (never more)."""

    def __init__(self, fail: Fail, stream: bytes, at: str) -> None:
        self.fail, self.at = fail, at
        self.z: Any = zlib.decompressobj()
        self.rest = stream

    def take(self, n: int) -> bytes:
        """The next ``n`` bytes of the inflated stream (fails if it ends before)."""
        out = b""
        try:
            while len(out) < n:
                piece = self.z.decompress(self.rest, n - len(out))
                self.rest = self.z.unconsumed_tail
                out += piece
                if not piece and (self.z.eof or not self.rest):
                    break
        except zlib.error as e:
            self.fail(self.at, f"not a zlib stream: {e}")
        if len(out) != n:
            self.fail(self.at, f"inflates to only {len(out)} bytes where {n} were expected"
                               + ("" if self.z.eof else " (the stream is cut short)"))
        return out

    def end(self, total: int) -> None:
        """Check that the stream ends here, after ``total`` bytes, with nothing after it."""
        try:
            extra = self.z.decompress(self.rest, 1)
        except zlib.error as e:
            self.fail(self.at, f"not a zlib stream: {e}")
        if extra:
            self.fail(self.at, f"inflates to more than the {total} bytes expected")
        if not self.z.eof:
            self.fail(self.at, f"the zlib stream does not end after its {total} bytes "
                               "(cut short)")
        if self.z.unused_data:
            self.fail(self.at, f"{len(self.z.unused_data)} bytes follow the end of the zlib "
                               "stream")
