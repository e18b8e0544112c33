"""Open a committed checkpoint, read arrays (verifying every chunk), verify files.

Every byte read is checked against its chunk's CRC-32C; a mismatch raises
:class:`~uckpt.errors.ChecksumMismatchError` naming the file, the leaf and the
byte offset. A compressed chunk (docs/format.md section 5) is checked as stored,
then decoded (:func:`uckpt.codecs.pipeline.decode_into`) straight into the destination where
the box is a contiguous part of it, else into one chunk-sized buffer.

A checkpoint directory may be hostile: only regular files directly inside it are
read, never through a symlink and never blocking (``fsutil.open_regular``); a
manifest over ``MAX_MANIFEST_BYTES`` is refused by its size, and no read of it goes
past that + 1 bytes; data files are checked to hold their declared sizes before any
array is allocated, and the arrays to allocate against ``max_bytes`` or the memory
available (:mod:`uckpt.runtime.memory`); verification streams (:mod:`uckpt.codecs.stream`);
and every failure is a :class:`~uckpt.errors.UckptError` (so
``CheckpointManager.restore`` falls back).
"""
from __future__ import annotations

import logging
import math
import os
import threading
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

import numpy as np

from ..codecs import stream as codec_stream, pipeline as codecs, hashing
from .. import dtypes, knobs
from ..storage import fsutil
from . import manifest_io
from ..runtime import memory
from ..codecs.checksum import crc32c, format_checksum
from ..errors import (ChecksumMismatchError, CorruptCheckpointError, ManifestError,
                      TruncatedDataError, UckptError)
from ..format import ArrayEntry, Chunk, Manifest
from ..format.cover import attach_covering
from ..format.rows import made
from ..format.manifest import MAX_RATIO
from ..format import part_roots
from ..runtime.parallel import parallel_map
from ..tree.shard import Shard
from . import castread
from .boxes import chunk_region, intersection as _intersection
from .readruns import ChunkRead, flat_chunks, plan_runs, split_whole
from ..storage import open_source
from ..storage.base import wrong_size

log = logging.getLogger("uckpt.loading.reader")



def read_manifest(directory, storage_options=None) -> Manifest:
    """Read and validate the manifest of checkpoint ``directory`` (a path or an ``s3://``
    URL); raises if absent or malformed."""
    with open_source(directory, storage_options) as source:
        return manifest_io.read(source)


class CheckpointReader:
    """Reads arrays of one committed checkpoint. Use as a context manager.

    ``directory`` is a path, an ``s3://`` URL (with ``storage_options``) or a
    :class:`~uckpt.storage.base.CheckpointSource`. A local directory is opened once
    (following a symlink there: the caller chose the path); the manifest and data files
    are opened relative to it, never through a symlink, and must be regular files
    (:func:`uckpt.storage.fsutil.open_regular`). Every data file a read needs is opened and
    checked to hold its declared size before any array is allocated, so a hostile
    manifest cannot make the reader allocate more than its files hold.
    """

    def __init__(self, directory, manifest: Optional[Manifest] = None, *,
                 storage_options=None, max_bytes: Optional[int] = None,
                 rank: Optional[Tuple[int, int]] = None, on_demand: bool = False) -> None:
        """``manifest``: one already read (e.g. the source's, for a copy not yet committed);
        ``max_bytes``: the most bytes of new arrays :meth:`read_arrays` allocates (None: the
        memory available, :mod:`uckpt.runtime.memory`); ``rank``: ``(rank, world size)`` of a
        reader that loads only its share: the manifest's parts are then read on demand,
        only those that cover what :meth:`read_arrays` reads (its own part first), and
        ``parts_read`` lists them. ``on_demand``: the same for a reader that is no rank of a
        job (the lazy reader): the root alone is read at open, and the parts holding an
        array when it is read (:meth:`read_arrays`, :meth:`entry`)."""
        self.max_bytes = max_bytes
        self.rank = rank
        self.parts_read: List[str] = []
        self.source = open_source(directory, storage_options)
        self.directory = self.source.location
        self._sizes: Dict[tuple, int] = {}  # (base, name) -> actual sizes of open data files
        self._bases: Dict[str, Any] = {}  # base checkpoint name -> its source
        try:
            self.manifest = manifest if manifest is not None else \
                manifest_io.read_root(self.source) if rank is not None or on_demand else \
                manifest_io.read(self.source)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> "CheckpointReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for source in self._bases.values():
            source.close()
        self._bases.clear()
        self.source.close()

    @property
    def bytes_read(self) -> int:
        """The bytes this reader's sources (the checkpoint's, its bases') read from storage
        so far (:attr:`uckpt.storage.base.CheckpointSource.bytes_read`)."""
        return self.source.bytes_read + sum(s.bytes_read for s in self._bases.values())

    def _source(self, base: Optional[str]):
        """The source holding files of ``base`` (None: this checkpoint), opened on first use."""
        if base is None:
            return self.source
        if base not in self._bases:
            own = os.path.basename(self.source.where.rstrip("/"))
            if base == own:
                raise CorruptCheckpointError(
                    f"{self.source.where}: the manifest names the checkpoint itself as a base",
                    path=self.source.where, hint="the manifest is damaged; restore an earlier "
                                                 "checkpoint")
            self._bases[base] = self.source.sibling(base)
        return self._bases[base]

    def _open(self, name: str, base: Optional[str] = None) -> None:
        """Open data file ``name`` (of checkpoint ``base``, None: this one) and check that it
        holds at least its declared size (on first use)."""
        if (base, name) in self._sizes:
            return
        expected = self.manifest.files[name].size if base is None else \
            self.manifest.bases[base][name]
        source = self._source(base)
        path = source.file_where(name)
        try:
            actual = source.open_file(name)
        except OSError as e:
            if isinstance(e, UckptError):
                raise
            raise fsutil.unreadable(e, path, "data file") from None
        if actual < expected:
            cut = self._first_chunk_beyond(name, base, actual)
            at = f"; leaf {cut[0]!r} (chunk at byte offset {cut[1]}) is cut off" if cut else ""
            raise TruncatedDataError(
                f"data file {path!r} is truncated: {actual} bytes, the manifest "
                f"records {expected}{at}", path=path, offset=actual,
                leaf=cut[0] if cut else None,
                hint="the file was damaged after commit; restore an earlier checkpoint")
        if actual > expected:
            raise wrong_size(path, actual, expected)
        self._sizes[(base, name)] = actual

    def _first_chunk_beyond(self, name: str, base: Optional[str], size: int):
        cut = [(c.offset, e.path) for e in self.manifest.arrays.values() for c in e.chunks
               if c.file == name and c.base == base and c.offset + c.length > size]
        return (min(cut)[1], min(cut)[0]) if cut else None

    # -- reading -------------------------------------------------------------------------------
    def entry(self, path: str) -> ArrayEntry:
        """Array ``path``'s entry with all its chunks: the pending manifest parts that hold
        it are read first (its dtype and shape, in the root, need none)."""
        if self.manifest.parts_pending:
            self._attach_parts({path: None})
        return self.manifest.arrays[path]

    def read_arrays(self, wanted: Mapping[str, "np.ndarray | Shard | np.dtype | None"]
                    ) -> Dict[str, np.ndarray]:
        """Read the arrays named in ``wanted``: path -> an in-place target, None (a new
        array), a dtype (a new array of that dtype), or a :class:`~uckpt.tree.shard.Shard`
        to read its box into its array (the caller has checked its global shape against
        the manifest). Only chunks that intersect a wanted box are read (whole, so that
        their checksums can be verified). A target or new array of another dtype than the
        stored one is converted into while reading (:mod:`uckpt.loading.castread`; the
        caller has checked that the load's dtype policy allows it)."""
        plan = self.checked_plan(wanted)
        with memory.mapped("reading arrays from", self.source.where):
            return self._read_planned(plan)

    def checked_plan(self, wanted: Mapping[str, Any]) -> list:
        """:meth:`read_arrays`' plan of ``wanted`` (see :meth:`_plan`), its data files opened
        and size-checked and its new arrays checked against the memory limit: nothing
        allocated or read yet."""
        plan = self._plan(wanted)
        files = {(c.base, c.file) for _, _, _, cs in plan for c in cs}
        for base, name in files:
            self._open(name, base)  # open and size-check files before any allocation or thread
        fresh = [p for p in plan if _is_fresh(p[1])]
        new = [p[0] for p in fresh]
        self._check_allocation(new, files)
        memory.check(sum(_fresh_nbytes(e, t) for e, t, _, _ in fresh), self.max_bytes,
                     ", ".join(repr(e.path) for e in new[:3]) + (", ..." if len(new) > 3 else ""),
                     self.source.where, leaf=new[0].path if len(new) == 1 else None)
        return plan

    def chunks_for(self, wanted: Mapping[str, "np.ndarray | Shard | None"]) -> List[Chunk]:
        """The chunks :meth:`read_arrays` reads for ``wanted`` (no data is read)."""
        return [c for _, _, _, cs in self._plan(wanted) for c in cs]

    def _plan(self, wanted: Mapping[str, Any]) -> list:
        """(entry, target or None, target_start (None: the whole array), chunks to read)
        for each array of ``wanted``; the manifest's parts that cover it are read first."""
        if self.manifest.parts_pending:
            self._attach_parts(wanted)
        arrays = self.manifest.arrays
        boxes = []  # (entry, target, target_start: None for the whole array)
        for path, target in wanted.items():
            entry = arrays[path]
            target_start = None
            if (type(target) is np.ndarray and target.shape == entry.shape) or \
                    isinstance(target, np.dtype):  # (the common case; a new array)
                boxes.append((entry, target, None))
                continue
            if isinstance(target, Shard):
                target, target_start = target.array, target.offsets
            if target is not None and target_start is None and target.shape != entry.shape:
                target_start = (0,) * len(entry.shape)
            if target_start is not None and not any(target_start) and target.shape == entry.shape:
                target_start = None  # a box that is the whole array
            boxes.append((entry, target, target_start))
        # the whole arrays' chunks made together; a box's filtered as they are made
        whole = iter(made([e.chunks for e, _, start in boxes if start is None]))
        plan = []
        for entry, target, target_start in boxes:
            if target_start is None:  # the whole array: every chunk that holds elements
                plan.append((entry, target, None, [c for c in next(whole) if all(c.shape)]))
            else:
                plan.append((entry, target, target_start,
                             [c for c in entry.chunks
                              if _intersection(c.start, c.shape, target_start, target.shape)]))
        return plan

    def _attach_parts(self, wanted: Mapping[str, Any]) -> None:
        """Read the pending parts of the manifest that cover ``wanted`` (as
        :meth:`read_arrays` takes it); log how many of them were read."""
        m = self.manifest
        boxes: Dict[str, Any] = {}
        for path, target in wanted.items():
            if isinstance(target, Shard):
                boxes[path] = target.box
            elif isinstance(target, np.ndarray) and target.shape != m.arrays[path].shape:
                boxes[path] = ((0,) * len(target.shape), tuple(target.shape))
            else:
                boxes[path] = None
        rank, world = self.rank or (0, 1)
        read = attach_covering(m, boxes, lambda e: manifest_io.part_bytes(self.source, e),
                               rank, world)
        self.parts_read += [m.parts[k].file for k in read]
        log.info("%s read %d of %d manifest part(s) of %s (%d bytes) for %d array(s)",
                 f"rank {rank} of {world}" if self.rank else "an on-demand reader", len(read),
                 len(m.parts), self.source.where, sum(m.parts[k].size for k in read), len(boxes))

    def _read_planned(self, plan: list) -> Dict[str, np.ndarray]:
        """Allocate the new arrays of ``plan`` (checked by :meth:`read_arrays`) and read."""
        out: Dict[str, np.ndarray] = {}
        reads: List[ChunkRead] = []
        jobs: List[tuple] = []  # (entry, chunk, dest, target_start): chunks read on their own
        coalesce = self.source.coalesce
        for entry, dest, target_start, cs in allocated(plan):
            out[entry.path] = dest
            if dest.dtype != dtypes.to_numpy(entry.dtype):  # converted while read: chunk by chunk
                zero = target_start or (0,) * len(entry.shape)
                jobs.extend((entry, chunk, dest, zero) for chunk in cs)
                continue
            if target_start is None and coalesce:
                whole, cs = split_whole(entry, dest, cs)
                reads += whole
            if cs:
                zero = target_start or (0,) * len(entry.shape)
                jobs.extend((entry, chunk, dest, zero) for chunk in cs)
        runs = plan_runs(reads, self.source.block_bytes)
        runs.sort(key=lambda run: -run[-1].offset - run[-1].chunk.length + run[0].offset)
        tasks = [(self._read_run, run) for run in runs]  # largest first: threads end together
        tasks.extend((self._read_job, job) for job in jobs)
        parallel_map(lambda task: task[0](task[1]), tasks, self.source.read_threads,
                     "uckpt-read")
        return out

    def _check_allocation(self, entries: List[ArrayEntry], files) -> int:
        """Refuse, before allocating, new arrays larger than the data files being read
        (already open and size-checked) can hold: chunks of a valid checkpoint never share
        bytes, so its arrays always fit in its files, each compressed byte counting as at
        most ``MAX_RATIO`` bytes of array (docs/format.md section 5). Returns their
        bytes."""
        need = sum(e.nbytes for e in entries)
        have = sum(self._sizes[key] for key in files) + (MAX_RATIO - 1) * sum(
            c.length for e in entries for c in e.chunks
            if c.compressed and (c.base, c.file) in files)
        if need > have:
            raise CorruptCheckpointError(
                f"{self.source.where}: the manifest declares {need} bytes of arrays "
                f"({', '.join(repr(e.path) for e in entries[:3])}"
                f"{', ...' if len(entries) > 3 else ''}) stored in files of {have} bytes",
                path=self.source.where, leaf=entries[0].path if len(entries) == 1 else None,
                hint="the manifest is damaged (chunks share bytes); restore an earlier "
                     "checkpoint")
        return need

    def _read_run(self, run: List[ChunkRead]) -> None:
        """Read one run (:mod:`uckpt.loading.readruns`) of one file with one vectored read
        into their destinations, then check each one's checksum while it is hot in cache.
        A short or failed read is retried chunk by chunk, which names the leaf and offset."""
        first = run[0]
        if len(run) == 1:
            raw = first.raw
            self._stream(first.entry, first.chunk, lambda done, want: raw[done:done + want])
            return
        bufs, end = [], first.offset
        for p in run:
            if p.offset > end:
                bufs.append(bytearray(p.offset - end))  # padding between chunks: dropped
            bufs.append(p.raw)
            end = p.offset + p.chunk.length
        try:
            n = self._source(first.chunk.base).read_vectored(first.chunk.file, bufs,
                                                             first.offset)
        except OSError as e:
            if isinstance(e, UckptError):
                raise
            n = -1
        if n != end - first.offset:
            for p in run:
                self._read_run([p])
            return
        for p in run:
            got = format_checksum(crc32c(p.raw))
            if got != p.chunk.checksum:
                self._mismatch(p.entry, p.chunk, got)

    def _read_job(self, job: tuple) -> None:
        entry, _, dest, _ = job
        if dest.dtype != dtypes.to_numpy(entry.dtype):
            castread.read_converted(self, *job)
        else:
            self._read_chunk(*job)

    def _read_chunk(self, entry: ArrayEntry, chunk: Chunk, dest: np.ndarray,
                    target_start: tuple) -> None:
        start, shape, region = chunk_region(chunk, target_start, dest)
        direct = tuple(shape) == tuple(chunk.shape) and region.flags.c_contiguous
        itemsize = dtypes.itemsize(entry.dtype)
        buf = region if direct else np.empty(itemsize * math.prod(chunk.shape), dtype=np.uint8)
        raw = buf.reshape(-1).view(np.uint8)  # a view: reading fills dest (or buf) directly
        if chunk.compressed:
            self._decode_into(entry, chunk, self.read_stored(entry, chunk), raw)
        else:
            self._stream(entry, chunk, lambda done, want: raw[done:done + want])
        if not direct:
            whole = raw.view(dest.dtype).reshape(chunk.shape)
            region[...] = whole[tuple(slice(s - c, s - c + n)
                                      for s, c, n in zip(start, chunk.start, shape))]

    def read_stored(self, entry: ArrayEntry, chunk: Chunk) -> np.ndarray:
        """A chunk's stored bytes (compressed ones as they are), checksum verified; its
        data file was opened by :meth:`open_files` (or, for a chunk of a base, by a read)."""
        stored = np.empty(chunk.length, dtype=np.uint8)
        self._stream(entry, chunk, lambda done, want: stored[done:done + want])
        return stored

    def open_files(self, names) -> None:
        """Open this checkpoint's data files ``names`` and check their sizes (before
        reading any chunk)."""
        for name in names:
            self._open(name)

    def _stream(self, entry: ArrayEntry, chunk: Chunk, into, hasher=None) -> None:
        """Read a chunk block by block into ``into(done, want)``, checksumming each block
        (and feeding it to ``hasher``, if given) while it is still in the CPU cache; raise
        on a short file or a mismatch."""
        for _ in self._blocks(entry, chunk, into, hasher):
            pass

    def _blocks(self, entry: ArrayEntry, chunk: Chunk, into, hasher=None,
                block_bytes: int = 0) -> Iterator[np.ndarray]:
        """:meth:`_stream` as a generator of the blocks read (``block_bytes``: their most
        size, 0: the source's); the CRC is compared after the last."""
        value, done = 0, 0
        block_bytes = block_bytes or self._source(chunk.base).block_bytes
        while done < chunk.length:
            block = into(done, min(block_bytes, chunk.length - done))
            self._read_block(entry, chunk, block, done)
            value = crc32c(block, value)
            if hasher is not None:
                hasher.update(block)
            yield block
            done += len(block)
        self._mismatch(entry, chunk, format_checksum(value))

    def _read_block(self, entry: ArrayEntry, chunk: Chunk, block, done: int) -> None:
        """Fill ``block`` with the chunk's stored bytes from ``done`` on; raise on a short
        file or an I/O error, naming the leaf and offset."""
        source, want = self._source(chunk.base), len(block)
        try:
            n = source.read_into(chunk.file, block, chunk.offset + done)
        except OSError as e:  # EIO, ... (the file was checked to be a regular file)
            if isinstance(e, UckptError):
                raise
            raise fsutil.unreadable(
                e, source.file_where(chunk.file), "data file", leaf=entry.path,
                offset=chunk.offset + done,
                detail=f" (leaf {entry.path!r}, byte offset {chunk.offset + done})") from None
        if n != want:
            end = chunk.offset + done + n
            where = source.file_where(chunk.file)
            raise TruncatedDataError(
                f"{where}: leaf {entry.path!r} needs bytes "
                f"{chunk.offset}..{chunk.offset + chunk.length}, the file ends at {end}",
                path=where, leaf=entry.path, offset=end)

    def _mismatch(self, entry: ArrayEntry, chunk: Chunk, got: str, kind: str = "checksum",
                  hint: str = "the file is corrupted; restore an earlier checkpoint") -> None:
        """Raise ChecksumMismatchError if ``got`` differs from the chunk's ``kind``
        (``checksum``, or ``hash``: its content hash), naming the file, leaf and offset."""
        recorded = chunk.checksum if kind == "checksum" else chunk.hash
        if got != recorded:
            where = self._source(chunk.base).file_where(chunk.file)
            raise ChecksumMismatchError(
                f"{where}: {'checksum' if kind == 'checksum' else 'content hash'} mismatch in "
                f"leaf {entry.path!r}, chunk at byte offset {chunk.offset} (length "
                f"{chunk.length}): stored {recorded}, computed {got}", path=where,
                leaf=entry.path, offset=chunk.offset, hint=hint)

    # -- verification --------------------------------------------------------------------------
    def verify(self, progress=None, files: Optional[set] = None) -> int:
        """Re-check every chunk's checksum (of ``files`` only, if given), streaming;
        returns the bytes verified. Chunks are checked one after another (local files:
        sequential reads), or on ``source.verify_threads`` threads (object stores: each
        block is a request, and requests in parallel are what make them fast).

        Version 4: every chunk's content hash is recomputed from its bytes and compared
        (chunks of ``bases`` are read too, unless ``files`` limits the check to some of
        this checkpoint's own files), then, when every chunk was read, each array's Merkle
        root and the checkpoint's (docs/format.md section 11.3)."""
        for name in self.manifest.files:
            if files is None or name in files:
                self._open(name)  # every file is checked first, even one without chunks
        if files is None:
            for base, sizes in self.manifest.bases.items():
                for name in sizes:
                    self._open(name, base)
        jobs = [(entry, chunk) for entry in self.manifest.arrays.values()
                for chunk in entry.chunks
                if files is None or (chunk.base is None and chunk.file in files)]
        done = [0]
        lock = threading.Lock()
        scratch = threading.local()
        hashed = self.manifest.unhashed() is None
        digests: Dict[tuple, bytes] = {}

        def check(job) -> None:
            if not hasattr(scratch, "buf"):
                scratch.buf = np.empty(self.source.block_bytes, dtype=np.uint8)
            buf = scratch.buf
            entry, chunk = job
            if hashed and chunk.compressed:  # the hash is of the raw bytes: decode them
                digest = self._compressed_digest(entry, chunk)
            else:
                hasher = hashing.hasher() if hashed else None
                self._stream(entry, chunk, lambda done_, want: buf[:want], hasher)
                digest = hasher.digest() if hasher is not None else b""
            if hashed:
                self._mismatch(entry, chunk, hashing.format_hash(digest), "hash",
                               "the manifest is inconsistent; restore an earlier checkpoint")
            with lock:
                if hashed:
                    digests[(entry.path, chunk.start)] = digest
                done[0] += chunk.length
                if progress:
                    progress(done[0])

        with memory.mapped("verifying", self.source.where):
            parallel_map(check, jobs, self.source.verify_threads, "uckpt-verify")
        if hashed and files is None:
            self._check_roots(digests)
        return done[0]

    def _compressed_digest(self, entry: ArrayEntry, chunk: Chunk) -> bytes:
        """The content hash digest of compressed ``chunk``, its CRC checked: decoded in
        memory up to ``knobs.verify_decode_bytes`` of raw bytes, streamed beyond
        (:mod:`uckpt.codecs.stream`: memory bounded whatever size the manifest declares)."""
        itemsize = dtypes.itemsize(entry.dtype)
        if itemsize * math.prod(chunk.shape) <= knobs.verify_decode_bytes:
            return hashing.digest(self.read_raw(entry, chunk))
        hasher = hashing.hasher()
        for block in self._decoded(entry, chunk):
            hasher.update(block)
        return hasher.digest()

    def _decoded(self, entry: ArrayEntry, chunk: Chunk) -> Iterator[np.ndarray]:
        """The raw bytes of compressed ``chunk`` a block at a time (each valid until the
        next), streamed (:class:`uckpt.codecs.stream.Decoded`); its CRC is checked, before
        any decoding error is raised, once the last block was given."""
        itemsize = dtypes.itemsize(entry.dtype)
        want = itemsize * math.prod(chunk.shape)
        block = self._source(chunk.base).block_bytes
        head = bytearray(min(18, chunk.length))
        self._read_block(entry, chunk, memoryview(head), 0)

        def read_into(buf, done: int) -> None:
            self._read_block(entry, chunk, buf, done)

        def open_stored(walk):
            return codec_stream.StoredReader(read_into, chunk.length, block, walk)

        damaged = codecs.damage(chunk.codec, where=self._source(chunk.base).file_where(
            chunk.file), leaf=entry.path, offset=chunk.offset)
        decoded = codec_stream.Decoded(chunk.codec, itemsize, want, bytes(head), open_stored,
                                       damaged)
        try:
            yield from decoded
        except CorruptCheckpointError as e:
            if getattr(e, "crc", None) is not None:  # the whole chunk was read: CRC first
                self._mismatch(entry, chunk, format_checksum(e.crc))
            raise
        self._mismatch(entry, chunk, format_checksum(decoded.crc))

    def stream(self, entry: ArrayEntry, block_bytes: int) -> Iterator[np.ndarray]:
        """The bytes of array ``entry`` in flat C order, as flat uint8 blocks of at most
        ``block_bytes`` (each valid until the next is asked for), in memory bounded by a
        constant whatever size the manifest declares: raw chunks read a block at a time,
        compressed ones over ``block_bytes`` decoded as a stream; each chunk's CRC (and a
        compressed one's frame) checked once its last block was given, so a damaged chunk
        raises as :meth:`read_arrays` would. Only for arrays whose chunks tile them in flat
        order (:func:`uckpt.loading.readruns.flat_chunks`); anything else is a ValueError."""
        chunks = flat_chunks(entry)
        if chunks is None:
            raise ValueError(f"the chunks of leaf {entry.path!r} do not tile it in flat order")
        for chunk in chunks:
            self._open(chunk.file, chunk.base)  # every file size-checked before reading
        itemsize = dtypes.itemsize(entry.dtype)
        buf = np.empty(min(block_bytes, max((c.length for c in chunks if not c.compressed),
                                            default=0)), dtype=np.uint8)
        for chunk in chunks:
            if not chunk.compressed:
                yield from self._blocks(entry, chunk, lambda done, want: buf[:want],
                                        block_bytes=block_bytes)
            elif max(chunk.length, itemsize * math.prod(chunk.shape)) <= block_bytes:
                yield self.read_raw(entry, chunk)
            else:
                yield from self._decoded(entry, chunk)

    def read_raw(self, entry: ArrayEntry, chunk: Chunk) -> np.ndarray:
        """A chunk's raw bytes (flat uint8): read (CRC checked), and decoded if compressed;
        its data file is open (:meth:`open_files`, or a read of a base's chunk)."""
        stored = self.read_stored(entry, chunk)
        return self.decoded(entry, chunk, stored) if chunk.compressed else stored

    def decoded(self, entry: ArrayEntry, chunk: Chunk, stored) -> np.ndarray:
        """The raw bytes (flat uint8) of compressed ``chunk``, from its ``stored`` bytes."""
        raw = np.empty(dtypes.itemsize(entry.dtype) * math.prod(chunk.shape), dtype=np.uint8)
        self._decode_into(entry, chunk, stored, raw)
        return raw

    def _decode_into(self, entry: ArrayEntry, chunk: Chunk, stored, raw: np.ndarray) -> None:
        """Decode compressed ``chunk``'s ``stored`` bytes into ``raw`` (flat uint8 of its
        size); a damaged frame raises naming the file, leaf and offset."""
        codecs.decode_into(chunk.codec, stored, raw, dtypes.itemsize(entry.dtype),
                           where=self._source(chunk.base).file_where(chunk.file),
                           leaf=entry.path, offset=chunk.offset)

    def _check_roots(self, digests: Dict[tuple, bytes]) -> None:
        """Recompute every array's Merkle root from the hashes of its bytes, and the
        checkpoint's; raise on the first that differs from the manifest's."""
        roots = {}
        for entry in self.manifest.arrays.values():
            root = entry.merkle_root([digests[(entry.path, c.start)] for c in entry.chunks])
            recorded = entry.recorded_root()
            if hashing.format_hash(root) != recorded:
                raise CorruptCheckpointError(
                    f"{self.source.where}: the Merkle root of leaf {entry.path!r} is "
                    f"{hashing.format_hash(root)}, the manifest records {recorded}",
                    path=self.source.where, leaf=entry.path,
                    hint="the manifest is inconsistent; restore an earlier checkpoint")
            roots[entry.path] = root
        if self.manifest.part_roots is None:
            top = hashing.format_hash(hashing.checkpoint_root(roots))
        else:  # extension part-roots (docs/format.md section 13.2)
            top = hashing.format_hash(part_roots.recompute(
                [(e.path, e.chunks) for e in self.manifest.arrays.values()],
                len(self.manifest.parts), lambda path, start: digests[(path, start)]))
        if top != self.manifest.merkle_root:
            raise CorruptCheckpointError(
                f"{self.source.where}: the checkpoint's Merkle root is {top}, the manifest "
                f"records {self.manifest.merkle_root}", path=self.source.where,
                hint="the manifest is inconsistent; restore an earlier checkpoint")


#: new arrays of one read are carved from allocations of up to this many bytes
ARENA_BYTES = 256 << 20


def allocated(plan: list) -> list:
    """``plan`` (:meth:`CheckpointReader.checked_plan`) with a new array in place of each
    target that asks for one (:func:`_new_arrays`)."""
    fresh = iter(_new_arrays([(p[0], p[1]) for p in plan if _is_fresh(p[1])]))
    return [(e, next(fresh) if _is_fresh(t) else t, start, cs) for e, t, start, cs in plan]


def _is_fresh(target: Any) -> bool:
    """Whether a ``read_arrays`` target asks for a new array (None, or its dtype)."""
    return target is None or isinstance(target, np.dtype)


def _fresh_nbytes(entry: ArrayEntry, dtype: Optional[np.dtype]) -> int:
    """Bytes of the new array for ``entry``, of ``dtype`` (None: the stored one)."""
    return entry.nbytes if dtype is None else dtype.itemsize * math.prod(entry.shape)


def _new_arrays(fresh: List[Tuple[ArrayEntry, Optional[np.dtype]]]) -> List[np.ndarray]:
    """New arrays for ``fresh`` ((entry, dtype or None: the stored one) each), in order,
    carved from as few allocations as ``ARENA_BYTES`` allows (each array at a multiple of
    64 bytes). Fresh memory is paid for page by page when first written; one large region
    is faulted in far faster than hundreds of small ones (huge pages). An array keeps its
    whole region alive."""
    out: List[np.ndarray] = []
    group: List[Tuple[ArrayEntry, Optional[np.dtype], int]] = []
    size = 0
    for item in fresh + [None]:
        nbytes = _fresh_nbytes(*item) if item is not None else 0
        step = -(-nbytes // 64) * 64
        if group and (item is None or size + step > ARENA_BYTES):
            buf = np.empty(size + 64, dtype=np.uint8)
            at = -buf.ctypes.data % 64  # (the region itself 64-byte aligned)
            for e, dtype, n in group:
                out.append(_array_at(e, buf[at:at + n], dtype))
                at += -(-n // 64) * 64
            group, size = [], 0
        if item is not None:
            group.append((item[0], item[1], nbytes))
            size += step
    return out


def _array_at(entry: ArrayEntry, raw: np.ndarray, dtype: Optional[np.dtype] = None
              ) -> np.ndarray:
    try:
        return raw.view(dtype or dtypes.to_numpy(entry.dtype)).reshape(entry.shape)
    except ValueError as e:  # e.g. more dimensions than NumPy supports
        raise ManifestError(f"leaf {entry.path!r}: cannot make an array of shape "
                            f"{list(entry.shape)} ({entry.dtype}): {e}", leaf=entry.path) from None
