"""Open a committed checkpoint, read arrays (verifying every chunk), verify files.

Every byte read is checked against its chunk's CRC-32C; a mismatch raises
:class:`~uckpt.errors.ChecksumMismatchError` naming the file, the leaf and the
byte offset.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple

import numpy as np

from . import dtypes, knobs
from .checksum import crc32c, format_checksum
from .errors import (ChecksumMismatchError, CheckpointNotFoundError, ManifestError,
                     NotACheckpointError, TruncatedDataError)
from .format import MANIFEST_NAME, ArrayEntry, Chunk, Manifest
from .fsutil import pread_into
from .parallel import parallel_map

MAX_MANIFEST_BYTES = 1 << 30


def read_manifest(directory) -> Manifest:
    """Read and validate ``directory/manifest.json`` (raises if absent or malformed)."""
    directory = Path(directory)
    if not directory.exists():
        raise CheckpointNotFoundError(f"checkpoint {str(directory)!r} does not exist",
                                      path=str(directory))
    if not directory.is_dir():
        raise NotACheckpointError(f"{str(directory)!r} is a file, not a checkpoint directory",
                                  path=str(directory))
    mpath = directory / MANIFEST_NAME
    try:
        size = mpath.stat().st_size
    except FileNotFoundError:
        raise NotACheckpointError(
            f"{str(directory)!r} is not a committed uckpt checkpoint: it has no {MANIFEST_NAME}",
            path=str(directory),
            hint="a save that was interrupted leaves no manifest; use an earlier checkpoint "
                 "(CheckpointManager.restore() picks the newest committed one)") from None
    if size > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{mpath}: {size} bytes is too large for a manifest", path=str(mpath))
    return Manifest.parse(mpath.read_bytes(), where=str(mpath))


class CheckpointReader:
    """Reads arrays of one committed checkpoint. Use as a context manager."""

    def __init__(self, directory, manifest: Optional[Manifest] = None) -> None:
        """``manifest``: one already read (e.g. the source's, for a copy not yet committed)."""
        self.directory = Path(directory)
        self.manifest = manifest if manifest is not None else read_manifest(self.directory)
        self._fds: Dict[str, int] = {}

    def __enter__(self) -> "CheckpointReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def _fd(self, name: str) -> int:
        if name not in self._fds:
            path = self.directory / name
            expected = self.manifest.files[name].size
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                raise CheckpointNotFoundError(
                    f"data file {str(path)!r} listed in the manifest is missing",
                    path=str(path)) from None
            actual = os.fstat(fd).st_size
            if actual < expected:
                os.close(fd)
                cut = self._first_chunk_beyond(name, actual)
                at = f"; leaf {cut[0]!r} (chunk at byte offset {cut[1]}) is cut off" if cut else ""
                raise TruncatedDataError(
                    f"data file {str(path)!r} is truncated: {actual} bytes, the manifest "
                    f"records {expected}{at}", path=str(path), offset=actual,
                    leaf=cut[0] if cut else None,
                    hint="the file was damaged after commit; restore an earlier checkpoint")
            self._fds[name] = fd
        return self._fds[name]

    def _first_chunk_beyond(self, name: str, size: int):
        cut = [(c.offset, e.path) for e in self.manifest.arrays.values() for c in e.chunks
               if c.file == name and c.offset + c.length > size]
        return (min(cut)[1], min(cut)[0]) if cut else None

    # -- reading -------------------------------------------------------------------------------
    def read_arrays(self, wanted: Mapping[str, "np.ndarray | Tuple[np.ndarray, tuple] | None"]
                    ) -> Dict[str, np.ndarray]:
        """Read the arrays named in ``wanted``: path -> an in-place target, None (a new
        array), or ``(target, offsets)``: the box of the global array at ``offsets`` with
        the target's shape. Only chunks that intersect a wanted box are read (whole, so
        that their checksums can be verified)."""
        out: Dict[str, np.ndarray] = {}
        jobs: List[Tuple[ArrayEntry, Chunk, np.ndarray, tuple]] = []
        for path, target in wanted.items():
            entry = self.manifest.arrays[path]
            origin: tuple = (0,) * len(entry.shape)
            if isinstance(target, tuple):
                target, origin = target
            dest = target if target is not None else \
                np.empty(entry.shape, dtype=dtypes.to_numpy(entry.dtype))
            out[path] = dest
            jobs.extend((entry, chunk, dest, tuple(origin)) for chunk in entry.chunks
                        if _intersection(chunk.start, chunk.shape, origin, dest.shape))
        for name in {c.file for _, c, _, _ in jobs}:
            self._fd(name)  # open (and size-check) files before threads start
        parallel_map(lambda j: self._read_chunk(*j), jobs, knobs.io_threads, "uckpt-read")
        return out

    def _read_chunk(self, entry: ArrayEntry, chunk: Chunk, dest: np.ndarray, origin: tuple) -> None:
        start, shape = _intersection(chunk.start, chunk.shape, origin, dest.shape)
        region = dest[tuple(slice(s - o, s - o + n) for s, o, n in zip(start, origin, shape)) + (...,)]
        direct = tuple(shape) == tuple(chunk.shape) and region.flags.c_contiguous
        buf = region if direct else np.empty(chunk.length, dtype=np.uint8)
        raw = buf.reshape(-1).view(np.uint8)  # a view: reading fills dest (or buf) directly
        self._stream(entry, chunk, lambda done, want: raw[done:done + want])
        if not direct:
            whole = raw.view(dest.dtype).reshape(chunk.shape)
            region[...] = whole[tuple(slice(s - c, s - c + n)
                                      for s, c, n in zip(start, chunk.start, shape))]

    def _stream(self, entry: ArrayEntry, chunk: Chunk, into) -> None:
        """Read a chunk block by block into ``into(done, want)``, checksumming each block
        while it is still in the CPU cache; raise on a short file or a mismatch."""
        fd, value, done = self._fd(chunk.file), 0, 0
        while done < chunk.length:
            want = min(knobs.read_block_bytes, chunk.length - done)
            block = into(done, want)
            n = pread_into(fd, block, chunk.offset + done)
            if n != want:
                end = chunk.offset + done + n
                raise TruncatedDataError(
                    f"{self.directory / chunk.file}: leaf {entry.path!r} needs bytes "
                    f"{chunk.offset}..{chunk.offset + chunk.length}, the file ends at {end}",
                    path=str(self.directory / chunk.file), leaf=entry.path, offset=end)
            value = crc32c(block, value)
            done += n
        self._mismatch(entry, chunk, format_checksum(value))

    def _mismatch(self, entry: ArrayEntry, chunk: Chunk, got: str) -> None:
        if got != chunk.checksum:
            raise ChecksumMismatchError(
                f"{self.directory / chunk.file}: checksum mismatch in leaf {entry.path!r}, "
                f"chunk at byte offset {chunk.offset} (length {chunk.length}): stored "
                f"{chunk.checksum}, computed {got}", path=str(self.directory / chunk.file),
                leaf=entry.path, offset=chunk.offset,
                hint="the file is corrupted; restore an earlier checkpoint")

    # -- verification --------------------------------------------------------------------------
    def verify(self, progress=None, files: Optional[set] = None) -> int:
        """Re-check every chunk's checksum (of ``files`` only, if given), streaming;
        returns the bytes verified."""
        total = 0
        scratch = np.empty(knobs.read_block_bytes, dtype=np.uint8)
        for entry in self.manifest.arrays.values():
            for chunk in entry.chunks:
                if files is not None and chunk.file not in files:
                    continue
                self._stream(entry, chunk, lambda done, want: scratch[:want])
                total += chunk.length
                if progress:
                    progress(total)
        for name in self.manifest.files:
            if files is None or name in files:
                self._fd(name)  # files without chunks must still exist at their size
        return total


def _intersection(start_a, shape_a, start_b, shape_b):
    """The box where two boxes overlap, ``(start, shape)``, or None when they do not."""
    lo = [max(a, b) for a, b in zip(start_a, start_b)]
    hi = [min(a + m, b + n) for a, m, b, n in zip(start_a, shape_a, start_b, shape_b)]
    if any(h <= l for l, h in zip(lo, hi)):
        return None
    return tuple(lo), tuple(h - l for l, h in zip(lo, hi))
