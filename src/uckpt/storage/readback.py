"""Reading stored chunks back from the storage medium, and the I/O priority of the threads
that do it (used by :mod:`uckpt.saving.reverify`; docs/architecture.md, "Incremental saves refer
only to verified bytes").

Where the bytes come from:

- a local file: ``O_DIRECT`` reads where the file system takes them (ext4, XFS, ...);
  where it refuses them (tmpfs, some network file systems) the file is fsynced and its
  cached pages dropped (``posix_fadvise(POSIX_FADV_DONTNEED)``) before plain reads; where
  neither exists (macOS, Windows) plain reads, which may be answered by the page cache;
- any other store (S3, memory, fsspec): :meth:`CheckpointSource.read_into`, i.e. a ranged
  GET answered by the object store, which checks its own copies.
"""
from __future__ import annotations

import logging
import mmap
import platform
import sys
import threading
from typing import TYPE_CHECKING, Any, Optional

from .. import knobs
from ..codecs.checksum import crc32c, format_checksum

if TYPE_CHECKING:  # collections.abc.Buffer from Python 3.12 on
    from typing_extensions import Buffer

log = logging.getLogger("uckpt.storage.readback")

#: offsets and lengths of O_DIRECT reads are multiples of this (the largest common
#: logical block size)
ALIGN = 4096


class SourceReader:
    """Data file ``name`` of ``source``, read through :meth:`CheckpointSource.read_into`."""

    how = "store read"

    def __init__(self, source: Any, name: str) -> None:
        self.source, self.name = source, name
        source.open_file(name)

    def read(self, buf: Buffer, offset: int) -> int:
        return int(self.source.read_into(self.name, buf, offset))

    def close(self) -> None:
        pass


def block_buffer() -> mmap.mmap:
    """A page-aligned buffer (what O_DIRECT reads need) of ``knobs.read_block_bytes``."""
    return mmap.mmap(-1, max(ALIGN, knobs.read_block_bytes // ALIGN * ALIGN))


def stored_checksum(reader: Any, offset: int, length: int, buf: mmap.mmap) -> Optional[str]:
    """The checksum of bytes ``[offset, offset + length)`` as ``reader`` reads them, in
    aligned blocks of ``buf``'s size; None if the file ends before them."""
    view = memoryview(buf)
    end, value = offset + length, 0
    pos = offset - offset % ALIGN
    while pos < end:
        want = min(len(buf), -(-(end - pos) // ALIGN) * ALIGN)
        n = reader.read(view[:want], pos)
        lo, hi = max(offset - pos, 0), min(end - pos, n)
        if pos + n < min(end, pos + want):
            return None
        value = crc32c(view[lo:hi], value)
        pos += want
    view.release()
    return format_checksum(value)


#: the ``ioprio_set`` system call's number, by machine (Linux)
_IOPRIO_SET = {"x86_64": 251, "amd64": 251, "aarch64": 30, "arm64": 30}
_IOPRIO_CLASS_SHIFT = 13
_IOPRIO_WHO_PROCESS = 1  # with a thread id: that thread


def lower_io_priority(idle: bool) -> str:
    """Give this thread's disk reads a low priority; return what it got, for the logs.

    Linux (x86-64, arm64): the ``idle`` class if ``idle`` (served only when the disk has
    nothing else to do), else best-effort level 7 (the lowest), by ``ioprio_set``. Only
    schedulers that honour priorities (BFQ; CFQ before Linux 5.0) act on them. Elsewhere,
    or if refused: the CPU niceness of background threads (``knobs.background_nice``),
    which those schedulers also map to a best-effort level."""
    number = _IOPRIO_SET.get(platform.machine().lower()) if sys.platform == "linux" else None
    if number is not None:
        import ctypes

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            for cls, level, name in ([(3, 0, "idle")] if idle else []) + [(2, 7, "best-effort 7")]:
                if libc.syscall(number, _IOPRIO_WHO_PROCESS, threading.get_native_id(),
                                (cls << _IOPRIO_CLASS_SHIFT) | level) == 0:
                    return name
        except (OSError, AttributeError):
            pass
    if knobs.background_nice > 0:
        from ..runtime.priority import lower_priority

        lower_priority()
        return f"nice +{knobs.background_nice}"
    return "unchanged"
