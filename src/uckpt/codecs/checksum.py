"""Chunk checksums: CRC-32C (Castagnoli), hardware-accelerated, GIL released.

A checksum is written as ``"crc32c:"`` followed by 8 lowercase hex digits of the
CRC-32C of the chunk's stored bytes (the same value as RFC 3720 / iSCSI).

Two implementations compute the same value: the ``crc32c`` package (a dependency: the
CRC32 instruction on three interleaved streams) and, where installed (extra ``fast``),
``crc32c-rs`` (carry-less multiplication on AVX-512 or NEON, faster where the CPU has
them; docs/benchmarks.md). :data:`BACKEND` names the one in use: ``crc32c-rs``
only once it gave the reference package's values (:func:`_agrees`) at import, else
``crc32c`` (with a warning where crc32c-rs gave other values); the ``crc32c`` package is
imported only then.
``UCKPT_CRC32C=crc32c`` picks the reference package.
"""
from __future__ import annotations

import logging
import os
import re
import struct
import zlib

log = logging.getLogger("uckpt")

ALGORITHM = "crc32c"

#: the ``zlib.crc32`` of the little-endian CRC-32C values of :func:`_agrees`'s buffers, as
#: the ``crc32c`` package computes them (so that checking ``crc32c-rs`` does not import
#: that package: it imports ``importlib.metadata``, slow to import, into ``import uckpt``)
_REFERENCE = 0xC65C62A3


def _agrees(fn) -> bool:
    """Whether ``fn`` computes the reference package's CRC-32C: the standard check value,
    a chain of calls, and buffers of every length up to 300 bytes and a few larger ones,
    at two offsets (where SIMD code handles its ragged ends)."""
    data = (bytes(range(7, 251)) * 288)[:70_001]
    try:
        if fn(b"123456789") != 0xE3069283 or fn(b"56789", fn(b"1234")) != 0xE3069283:
            return False
        view = memoryview(data)
        values = [fn(view[at:at + n]) for at in (0, 3)
                  for n in list(range(300)) + [4095, 4096, 65_537]]
        return zlib.crc32(struct.pack(f"<{len(values)}I", *values)) == _REFERENCE
    except Exception:  # noqa: BLE001 - a backend that cannot even run is not used
        return False


def _pick():
    if os.environ.get("UCKPT_CRC32C", "") != "crc32c":
        try:
            from crc32c_rs import crc32c as fast
        except ImportError:
            fast = None
        if fast is not None:
            if _agrees(fast):
                return "crc32c-rs", fast
            log.warning("crc32c-rs gives CRC-32C values that differ from the crc32c "
                        "package's; using the crc32c package")
    import crc32c as reference

    return "crc32c", reference.crc32c


#: the implementation in use: ``"crc32c-rs"`` or ``"crc32c"``
BACKEND, _impl = _pick()


def crc32c(data, value: int = 0) -> int:
    """The CRC-32C of a buffer, continuing from ``value`` (the CRC of what came before)."""
    return _impl(data, value)


def format_checksum(value: int) -> str:
    return f"{ALGORITHM}:{value:08x}"


FORM = re.compile(ALGORITHM + r":[0-9a-f]{8}")


def parse_checksum(text: str) -> int:
    if not FORM.fullmatch(text):
        raise ValueError(f"checksum {text!r} is not of the form 'crc32c:' + 8 lowercase hex digits")
    return int(text[len(ALGORITHM) + 1:], 16)


def of(data) -> str:
    return format_checksum(crc32c(data))
