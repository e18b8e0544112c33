"""How a POSIX file is written fast: the system calls behind :class:`PosixStore`'s writes.

* :func:`write_buffered`: ``(offset, bytes)`` pieces of a file of known size (or of at
  most a reserved size), preallocated, written in file order with vectored writes
  batched up to :data:`BATCH_BYTES`, each batch's writeback started at once
  (``sync_file_range``, on its own thread) so that the final fsync has little left to do;
* :class:`DirectFile`, :func:`write_image`: page-aligned buffers written with O_DIRECT
  (no page-cache copy), buffered with writeback where the file system refuses O_DIRECT;
* :func:`write_stream`: pieces copied as they come into a page-aligned buffer written
  with O_DIRECT whenever full (the caller may reuse a piece once it hands over the next).

Every function makes a new file (``O_EXCL``) and fsyncs it; moving it into place is the
caller's.
"""
from __future__ import annotations

import errno
import mmap
import os
import queue
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .. import fsutil
from ... import knobs

if TYPE_CHECKING:
    from typing_extensions import Buffer

    #: ``(offset, bytes)`` of a file, sorted by offset (gaps between them are zeros)
    Pieces = Iterable[tuple[int, Buffer]]

BATCH_BUFFERS = 512  # buffers written together (pwritev_all splits at the OS limit)
BATCH_BYTES = 16 << 20  # written, then handed to writeback, in batches of this size
PAGE = 4096


class Writeback:
    """Starts storage writeback of written ranges on its own thread (it may block)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.queue: queue.SimpleQueue[tuple[int, int] | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="uckpt-writeback", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            fsutil.start_writeback(self.fd, *item)

    def add(self, offset: int, nbytes: int) -> None:
        self.queue.put((offset, nbytes))

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join()


def write_in_order(fd: int, pieces: Pieces) -> int:
    """Write pieces sorted by offset, batching adjacent ones (small gaps written as
    zeros); returns the end of the last one."""
    zeros = memoryview(bytes(PAGE))
    writeback = Writeback(fd)
    try:
        batch: list[memoryview] = []
        start = end = 0
        for offset, data in pieces:
            gap = offset - end
            if batch and (0 <= gap <= len(zeros)) and len(batch) < BATCH_BUFFERS and \
                    end - start < BATCH_BYTES:
                if gap:
                    batch.append(zeros[:gap])  # alignment padding is written as zeros
            else:
                if batch:
                    fsutil.pwritev_all(fd, batch, start)
                    writeback.add(start, end - start)
                batch, start = [], offset
            view = memoryview(data)
            batch.append(view)
            end = offset + view.nbytes
        if batch:
            fsutil.pwritev_all(fd, batch, start)
        return end
    finally:
        writeback.close()


def write_buffered(path: Path | str, size: int | None, pieces: Pieces, reserve: int = 0) -> None:
    """Write pieces, sorted by offset, as a new file of ``size`` bytes; or, with ``size``
    None, a file ending with the last piece, of at most ``reserve`` bytes, preallocated
    where the disk has room (it is cut to its end after)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        if size is not None:
            fsutil.preallocate(fd, size)
        else:
            try:
                fsutil.preallocate(fd, reserve)
            except OSError as e:  # only a bound: what is written may still fit
                if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
        end = write_in_order(fd, pieces)
        if size is None:
            size = end
        if os.fstat(fd).st_size != size:
            os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


class DirectFile:
    """A new file written with O_DIRECT (storage DMA, no page-cache copy: almost no
    CPU) from page-aligned buffers at page-aligned offsets, falling back to buffered
    writes (their writeback started per write) where O_DIRECT is refused (tmpfs)."""

    def __init__(self, path: Path | str) -> None:
        self.path = path
        self.writeback: Writeback | None = None
        try:
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL |
                              getattr(os, "O_DIRECT", 0), 0o644)
            self.direct = hasattr(os, "O_DIRECT")
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            self.direct = False

    def pwrite(self, data: memoryview, offset: int) -> None:
        """Write all of ``data`` at ``offset`` (both page-aligned, unless at the end)."""
        done = 0
        while done < len(data):
            try:
                n = os.pwrite(self.fd, data[done:], offset + done)
            except OSError as e:
                if e.errno != errno.EINVAL or not self.direct:
                    raise
                os.close(self.fd)  # O_DIRECT refused for this buffer or file system
                self.fd, self.direct = os.open(self.path, os.O_WRONLY), False
                continue
            if not self.direct:
                if self.writeback is None:
                    self.writeback = Writeback(self.fd)
                self.writeback.add(offset + done, n)
            done += n

    def finish(self, size: int) -> None:
        """Cut the file to ``size`` bytes (the last write may be padded) and fsync it."""
        os.ftruncate(self.fd, size)
        os.fsync(self.fd)

    def close(self) -> None:
        if self.writeback is not None:
            self.writeback.close()
        os.close(self.fd)


def write_image(path: Path | str, image: Buffer, size: int) -> None:
    """Write the first ``size`` bytes of a page-aligned file image (holding ``size``
    rounded up to whole pages) with O_DIRECT where the file system takes it."""
    view = memoryview(image).cast("B")
    padded = view[:-(-size // PAGE) * PAGE] if size else view[:0]
    out = DirectFile(path)
    try:
        fsutil.preallocate(out.fd, size)
        for at in range(0, len(padded), BATCH_BYTES * 4):
            out.pwrite(padded[at:at + BATCH_BYTES * 4], at)
        out.finish(size)
    finally:
        out.close()


def write_stream(path: Path | str, pieces: Pieces) -> None:
    """Write pieces sorted by offset (gaps are zero; the file ends with the last piece) as
    a new file: each piece is copied as it comes into a page-aligned buffer of
    ``knobs.stream_buffer_bytes``, written with O_DIRECT when full (:class:`DirectFile`).
    Pieces of any size and offset go this way (every write but the last is whole pages)."""
    page = mmap.PAGESIZE
    size = max(page, knobs.stream_buffer_bytes // page * page)
    arena = mmap.mmap(-1, size)  # anonymous: page-aligned
    buf = np.frombuffer(arena, dtype=np.uint8)
    out = DirectFile(path)
    base = fill = 0  # the file offset of buf[0]; bytes of buf in use

    def put(data: memoryview | None, part: int) -> None:
        nonlocal base, fill
        done = 0
        while done < part:
            n = min(part - done, size - fill)
            buf[fill:fill + n] = 0 if data is None else data[done:done + n]
            fill, done = fill + n, done + n
            if fill == size:
                flush()

    def flush() -> None:  # the whole buffer, or at the end what it holds, padded
        nonlocal base, fill
        whole = -(-fill // page) * page
        buf[fill:whole] = 0  # the last page's padding (cut off by finish)
        out.pwrite(memoryview(arena)[:whole], base)
        base, fill = base + whole, 0

    try:
        end = 0
        for offset, piece in pieces:
            data = memoryview(piece).cast("B")
            gap = offset - end
            assert gap >= 0, (offset, end)
            put(None, gap)
            put(data, len(data))
            end = offset + len(data)
            del data, piece  # copied: not held while the next piece is made
        flush()
        out.finish(end)
    finally:
        out.close()
