"""Reading a node's share and piece in bounded blocks: byte ranges of the concatenated
share (zero-padded past its end, as docs/format.md 13.3's segments are), and checking
files against their records."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence, Tuple

from ..codecs.checksum import crc32c, format_checksum
from .records import FileRecord

#: ``read(name, offset, n)``: ``n`` bytes of file ``name`` at ``offset`` (fewer at its end);
#: raises ``FileNotFoundError`` when the file is not there
Reader = Callable[[str, int, int], bytes]

#: bytes read, XORed or sent at once: what bounds the memory of encoding and rebuilding
BLOCK = 4 << 20


def spans(length: int, block: int) -> Iterator[Tuple[int, int]]:
    """``(offset, size)`` of the blocks of ``block`` bytes that cover ``length`` bytes."""
    for off in range(0, length, block):
        yield off, min(block, length - off)


def file_blocks(name: str, read: Reader, block: int) -> Iterator[bytes]:
    """The bytes of file ``name``, in blocks of ``block`` (the last one shorter, maybe
    empty), however long the file is."""
    at = 0
    while True:
        got = read(name, at, block)
        yield got
        at += len(got)
        if len(got) < block:
            return


def directory_reader(directory: Path) -> Reader:
    """A :data:`Reader` of the regular files directly in ``directory`` (no link followed)."""

    def read(name: str, offset: int, n: int) -> bytes:
        fd = os.open(Path(directory) / name, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        try:
            return os.pread(fd, n, offset)
        finally:
            os.close(fd)

    return read


class ShareView:
    """The bytes of a share: ``files`` concatenated in order, read through ``read``."""

    def __init__(self, files: Sequence[FileRecord], read: Reader) -> None:
        self.files = list(files)
        self.read_file = read
        self.length = sum(f.size for f in self.files)

    def read(self, offset: int, n: int) -> bytes:
        """``n`` bytes at ``offset`` of the share, zeros past its end. Raises
        ``FileNotFoundError`` for a missing file and ``EOFError`` for a short one."""
        out = bytearray(n)
        at = 0
        for f in self.files:
            if at >= offset + n:
                break
            lo, hi = max(offset, at), min(offset + n, at + f.size)
            if lo < hi:
                got = self.read_file(f.name, lo - at, hi - lo)
                if len(got) != hi - lo:
                    raise EOFError(f"{f.name}: {len(got)} bytes at {lo - at}, not {hi - lo}")
                out[lo - offset:hi - offset] = got
            at += f.size
        return bytes(out)


def damage(record: FileRecord, read: Reader, block: int = BLOCK) -> Optional[str]:
    """What is wrong with file ``record.name`` as ``read`` gives it, or None when it matches
    its record (size and CRC-32C), read in blocks of ``block`` bytes."""
    value, at = 0, 0
    try:
        for got in file_blocks(record.name, read, block):
            value = crc32c(got, value)
            at += len(got)
            if at > record.size:
                break
    except FileNotFoundError:
        return "missing"
    except OSError as e:  # a directory, a link, unreadable: as good as missing
        return f"unreadable ({e.strerror or e})"
    if at != record.size:
        return f"{at} bytes, not {record.size}"
    if format_checksum(value) != record.checksum:
        return f"checksum {format_checksum(value)}, not {record.checksum}"
    return None


def record_of(name: str, blocks: Iterator[bytes], write: Callable[[bytes], object]
              ) -> FileRecord:
    """Write ``blocks`` through ``write``; the record of what was written as ``name``."""
    value = size = 0
    for b in blocks:
        write(b)
        value = crc32c(b, value)
        size += len(b)
    return FileRecord(name, size, format_checksum(value))
