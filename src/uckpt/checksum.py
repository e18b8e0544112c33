"""Chunk checksums: CRC-32C (Castagnoli), hardware-accelerated, GIL released.

A checksum is written as ``"crc32c:"`` followed by 8 lowercase hex digits of the
CRC-32C of the chunk's stored bytes (the same value as RFC 3720 / iSCSI).
"""
from __future__ import annotations

import re

import crc32c as _crc32c

ALGORITHM = "crc32c"


def crc32c(data, value: int = 0) -> int:
    return _crc32c.crc32c(data, value)


def format_checksum(value: int) -> str:
    return f"{ALGORITHM}:{value:08x}"


FORM = re.compile(ALGORITHM + r":[0-9a-f]{8}")


def parse_checksum(text: str) -> int:
    if not FORM.fullmatch(text):
        raise ValueError(f"checksum {text!r} is not of the form 'crc32c:' + 8 lowercase hex digits")
    return int(text[len(ALGORITHM) + 1:], 16)


def of(data) -> str:
    return format_checksum(crc32c(data))
