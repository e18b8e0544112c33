"""Decode a compressed chunk as a stream, in memory bounded by a constant.

``uckpt verify`` must recompute the content hash of a compressed chunk (the XXH3-128
of its raw bytes, element order), and ``uckpt diff`` compare its elements, without
holding the decoded chunk, whatever size the manifest declares (DESIGN invariant 9): a
32 KiB chunk may legitimately decode to 1 GiB (docs/format.md section 5).
:class:`Decoded` pulls the stored bytes from the data file a block at a time
(:class:`StoredReader`: CRC-32C'd and its block headers walked as they pass), decodes
them with Zstandard's streaming decoder into one block, and gives the raw bytes block by
block, refusing output beyond the declared size: :mod:`uckpt.loading.reader` hashes them
(verify) or gives them on (:meth:`~uckpt.loading.reader.CheckpointReader.stream`, for diff).

Byte-grouped content (the pipeline ``["bytegroup", "zstd"]``) is its planes one after
another, but the hash is of the elements: the frame is decoded by one streaming decoder
per plane, each skipping to its plane and all advancing together, so a block of elements
is assembled from one block of each plane. That costs ``itemsize`` passes over the
stored bytes and up to ``(itemsize + 1) / 2`` times the decoding work;
:mod:`uckpt.loading.reader` uses it only for chunks over ``knobs.verify_decode_bytes`` (verify)
or over a block (streamed reads).

Memory: one block of stored bytes and one of output per decoder, plus each decoder's
window (what the frame declares, at most ``codecs.MAX_WINDOW``; Zstandard allocates no
more than the content size).
"""
from __future__ import annotations

from typing import Callable, Iterator, List, Optional

import numpy as np

from . import pipeline as codecs
from .checksum import crc32c
from ..errors import CorruptCheckpointError

#: decoded bytes handled at a time, per plane
BLOCK = 1 << 17


class FrameWalk:
    """Follows the block headers of a Zstandard frame as its bytes pass (rule 2 of
    docs/format.md section 5): ``end`` is where the frame ends once its last block
    header was seen; more than ``most`` blocks raise ``damaged``."""

    def __init__(self, header: int, checksum: bool, most: int, damaged) -> None:
        self.at, self.checksum, self.most, self.damaged = header, checksum, most, damaged
        self.seen, self.blocks, self.tail = 0, 0, b""
        self.end: Optional[int] = None

    def feed(self, data) -> None:
        start = self.seen
        self.seen += len(data)
        while self.end is None and self.at + 3 <= self.seen:
            at = self.at - start
            if at >= 0:
                h = data[at:at + 3]
            else:  # the header began in the previous block (at most 2 bytes of it)
                h = (self.tail + bytes(data[:3]))[len(self.tail) + at:][:3]
            word = h[0] | h[1] << 8 | h[2] << 16
            self.blocks += 1
            if self.blocks > self.most:
                raise self.damaged(f"its frame has more than {self.most} blocks, the most "
                                   "its content may take")
            kind, length = (word >> 1) & 3, word >> 3
            self.at += 3 + (1 if kind == 1 else length)  # an RLE block stores one byte
            if word & 1:
                self.end = self.at + (4 if self.checksum else 0)
        self.tail = (self.tail + bytes(data[-2:]))[-2:]


class StoredReader:
    """The ``length`` stored bytes of one chunk as a file-like object (for Zstandard's
    ``stream_reader``): ``read_into(buf, done)`` fills ``buf`` with the bytes at ``done``
    (raising on a short file); each block is CRC-32C'd (``crc``) and fed to ``walk``."""

    def __init__(self, read_into: Callable, length: int, block: int,
                 walk: Optional[FrameWalk] = None) -> None:
        self.read_into, self.length, self.block, self.walk = read_into, length, block, walk
        self.done = self.crc = 0

    def read(self, n: int = -1) -> bytes:
        n = self.length - self.done if n < 0 else min(n, self.length - self.done, self.block)
        if n <= 0:
            return b""
        buf = bytearray(n)
        self.read_into(memoryview(buf), self.done)
        self.crc = crc32c(buf, self.crc)
        if self.walk is not None:
            self.walk.feed(buf)
        self.done += n
        return bytes(buf)

    def drain(self) -> None:
        """Read (and check) the rest of the chunk."""
        while self.read(self.block):
            pass


def _fill(reader, view, damaged, done: int, want: int) -> None:
    """Read exactly ``len(view)`` decoded bytes from ``reader`` (``done`` of ``want``
    already read, for the message)."""
    got = 0
    while got < len(view):
        n = reader.readinto(view[got:])
        if not n:
            raise damaged(f"its frame ends after {done + got} of {want} bytes")
        got += n


class Decoded:
    """The raw bytes of a compressed chunk of ``want`` bytes in element order, a block at a
    time: iterate to get flat uint8 arrays (each valid until the next is asked for); once
    the iteration ends, the frame was checked to end where the chunk does and ``crc`` is
    the CRC-32C of the stored bytes. ``head``: its first stored bytes (up to 18), whose
    frame header is checked before anything is decoded; ``open_stored(walk)`` opens the
    stored bytes afresh (``walk``: follow the frame's blocks, on the reader that reads them
    all); ``damaged(what)`` makes the error raised. A decoding error is raised only after
    the whole chunk was read, so that a CRC mismatch (the likelier cause) can be told
    first: the caller compares the CRC when ``damaged`` errors come with ``.crc`` set."""

    def __init__(self, codec: str, itemsize: int, want: int, head: bytes,
                 open_stored: Callable[[Optional[FrameWalk]], StoredReader], damaged) -> None:
        self.codec, self.itemsize, self.want, self.head = codec, itemsize, want, head
        self.open_stored, self.damaged = open_stored, damaged
        self.crc: Optional[int] = None

    def __iter__(self) -> Iterator[np.ndarray]:
        import zstandard

        want, damaged = self.want, self.damaged
        params, header = codecs.check_header(self.head, want, damaged)
        planes = self.itemsize if self.codec == codecs.BYTEGROUP and self.itemsize > 1 else 1
        count = want // planes
        walk = FrameWalk(header, params.has_checksum, codecs.max_blocks(want), damaged)
        stored: List[StoredReader] = [self.open_stored(None) for _ in range(planes - 1)]
        last = self.open_stored(walk)
        stored.append(last)
        try:
            readers = [zstandard.ZstdDecompressor(max_window_size=codecs.MAX_WINDOW)
                       .stream_reader(s, read_size=BLOCK, read_across_frames=False)
                       for s in stored]  # (a decoder each: the readers of one share its context)
            skip = np.empty(min(BLOCK, max(count, 1)), dtype=np.uint8)
            for j, r in enumerate(readers):  # decoder j skips to plane j
                left = j * count
                while left:
                    n = min(left, len(skip))
                    _fill(r, memoryview(skip)[:n], damaged, j * count - left, want)
                    left -= n
            rows = min(BLOCK, max(count, 1))
            grid = np.empty((planes, rows), dtype=np.uint8)
            items = np.empty((rows, planes), dtype=np.uint8)
            done = 0
            while done < count:
                take = min(rows, count - done)
                for j, r in enumerate(readers):
                    _fill(r, memoryview(grid[j])[:take], damaged, j * count + done, want)
                if planes == 1:
                    yield grid[0, :take]
                else:
                    np.copyto(items[:take], grid[:, :take].T)
                    yield items[:take].reshape(-1)
                done += take
            if readers[-1].read(1):
                raise damaged(f"its frame holds more than the {want} bytes it declares")
            last.drain()
            if walk.end is None:
                raise damaged("its frame is cut short")
            if walk.end != last.length:
                raise damaged(f"its frame is {walk.end} bytes long, the chunk {last.length}")
        except (zstandard.ZstdError, CorruptCheckpointError) as e:
            error = e if isinstance(e, CorruptCheckpointError) else \
                damaged(f"Zstandard cannot decode it ({e})")
            try:
                last.drain()
            except Exception:  # noqa: BLE001 - the read error explains less than the decode one
                pass
            error.crc = last.crc if last.done == last.length else None
            raise error from None
        self.crc = last.crc

