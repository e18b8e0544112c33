"""Incremental saves: write only the chunks whose content hash changed (docs/format.md 14).

A :class:`Baseline` is what an incremental save compares with: every chunk of the
previous checkpoint by its box, each pointing at the checkpoint whose own data file holds
its bytes (references are one hop). A ``CheckpointManager`` keeps the baseline of its
own last save in memory; ``uckpt.save(..., base=dir)`` builds one from ``dir``'s
manifest. :func:`write_changed` hashes this rank's chunks, refers to the unchanged ones
and writes the others, packed, into this rank's data file.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Set, Tuple

import numpy as np

from ..codecs import hashing
from ..codecs.checksum import crc32c, format_checksum
from ..format import Chunk, Manifest
from ..options import DEFAULT_ALIGNMENT
from .plan import WriteItem, layout
from .writer import encode_chunk, chunk_data, write_checksummed, write_encoded

log = logging.getLogger("uckpt.saving.incremental")

Key = Tuple[str, Tuple[int, ...], Tuple[int, ...]]  # (array path, start, shape)


@dataclass
class Baseline:
    """The chunks of committed checkpoint ``name``, by box, with ``base`` set to the
    checkpoint holding each one's bytes; ``sizes``: checkpoint name -> file -> size, for
    every checkpoint holding some of them."""

    name: str
    chunks: Dict[Key, Chunk] = field(default_factory=dict)
    sizes: Dict[str, Dict[str, int]] = field(default_factory=dict)

    @classmethod
    def of(cls, manifest: Manifest, name: str) -> "Baseline":
        """The baseline of ``manifest``, the manifest of committed checkpoint ``name``
        (chunks without a content hash, from an older format version, are left out: they
        are written again)."""
        sizes: Dict[str, Dict[str, int]] = {b: dict(f) for b, f in manifest.bases.items()}
        sizes[name] = {f.name: f.size for f in manifest.files.values()}
        chunks = {(e.path, c.start, c.shape): (c if c.base else _based(c, name))
                  for e in manifest.arrays.values() for c in e.chunks if c.hash}
        return cls(name, chunks, sizes)

    def holders(self) -> Set[str]:
        """The checkpoints holding the bytes of this baseline's chunks."""
        return {c.base for c in self.chunks.values() if c.base is not None}


def _based(c: Chunk, name: str) -> Chunk:
    """``c`` stored in checkpoint ``name`` (``dataclasses.replace`` costs several times
    more, for each of up to hundreds of thousands of chunks a save)."""
    return Chunk(c.file, c.offset, c.length, c.start, c.shape, c.codec, c.checksum, c.hash, name)


def write_changed(sink, file: str, items: List[WriteItem], arrays: Mapping[str, np.ndarray],
                  file_image: "np.ndarray | None", starts: "Mapping[str, tuple] | None",
                  baseline: Baseline, compression=None,
                  alignment: int = DEFAULT_ALIGNMENT) -> List[Chunk]:
    """Write data file ``file`` holding only those of ``items`` whose content differs from
    ``baseline``'s chunk of the same box (compressed with ``compression``, if given; each
    array starting at a multiple of ``alignment``);
    return a chunk per item, in the order of ``items``: the unchanged ones refer to where
    their bytes already are."""
    data = chunk_data(items, arrays, file_image, starts)
    chunks: List[Optional[Chunk]] = [None] * len(items)
    if compression is None and file_image is None:
        written = _stream_changed(sink, file, items, data, baseline, chunks, alignment)
        log.debug("%s: %d of %d chunks changed", file, written, len(items))
        return chunks  # type: ignore[return-value]
    digests = hashing.digests(data)
    changed = []
    for i, (it, d) in enumerate(zip(items, digests)):
        old = baseline.chunks.get((it.path, it.start, it.shape))
        if old is not None and old.hash == hashing.format_hash(d):
            chunks[i] = old  # (its box is the item's: the key says so)
        else:
            changed.append(i)
    if compression is not None:
        def encode(k: int, memory) -> tuple:
            i = changed[k]
            return encode_chunk(compression, data[i], items[i], hashing.format_hash(digests[i]),
                                memory)

        chunk_of = write_encoded(sink, file, [(items[i].path, items[i], items[i].length)
                                             for i in changed], encode, alignment)
        written = [chunk_of[items[i]] for i in changed]
    else:
        packed = layout([(items[i].path, items[i].start, items[i].shape, 0, items[i].length)
                         for i in changed], 1, alignment)
        placed = [(items[i], it.offset, data[i]) for i, it in zip(changed, packed.items)]
        # everything changed: the staging arena (if any) is the file, written in one piece
        whole = file_image is not None and all(p[0].offset == p[1] for p in placed) and \
            len(changed) == len(items)
        written = write_checksummed(sink, file, packed.file_sizes[0][1], placed,
                                    file_image if whole else None, [digests[i] for i in changed])
    for i, c in zip(changed, written):
        chunks[i] = c
    log.debug("%s: %d of %d chunks changed", file, len(changed), len(items))
    return chunks  # type: ignore[return-value]


def _stream_changed(sink, file: str, items: List[WriteItem], data: List[np.ndarray],
                    baseline: Baseline, chunks: List[Optional[Chunk]],
                    alignment: int) -> int:
    """Write the raw ``data`` of those ``items`` whose content hash differs from
    ``baseline``'s, packed in item order (each array starting at a multiple of
    ``alignment``), as a stream into data file ``file``; fill ``chunks`` (a chunk
    per item: written, or the baseline's); return how many were written.

    One thread hashes every item, and checksums the changed ones, ahead of the writes, as
    a plain save checksums beside its writes: hashing costs no time on the write path."""
    verdicts: List[Tuple[str, Optional[int]]] = []  # per item: (hash text, CRC if changed)
    failed: List[BaseException] = []
    done = threading.Event()  # set, under ``cond``, when the hashing thread ends
    cond = threading.Condition()

    def judge() -> None:
        try:
            for it, d in zip(items, data):
                content = hashing.format_hash(hashing.digest(d))
                old = baseline.chunks.get((it.path, it.start, it.shape))
                same = old is not None and old.hash == content
                verdicts.append((content, None if same else crc32c(d)))
                with cond:
                    cond.notify()
        except BaseException as e:  # noqa: BLE001 - re-raised by the writing thread
            failed.append(e)
        finally:
            with cond:
                done.set()
                cond.notify()

    def changed_writes():
        end, last = 0, None
        for i, (it, d) in enumerate(zip(items, data)):
            with cond:
                while len(verdicts) <= i and not done.is_set():
                    cond.wait()
            if len(verdicts) <= i:
                raise failed[0]
            content, crc = verdicts[i]
            if crc is None:
                chunks[i] = baseline.chunks[(it.path, it.start, it.shape)]
                continue
            if it.path != last:
                end, last = -(-end // alignment) * alignment, it.path
            chunks[i] = Chunk(file, end, it.length, it.start, it.shape, (),
                              format_checksum(crc), content)
            yield end, d
            end += it.length

    hasher = threading.Thread(target=judge, name="uckpt-hash", daemon=True)
    hasher.start()
    try:
        # at most every item, each array aligned: reserved up front (a plain save's
        # writes go to preallocated space; without it they cost twice as much here)
        bound = sum(it.length + alignment for it in items)
        sink.write_stream(file, changed_writes(), reserve=bound)
    finally:
        hasher.join()
    return sum(1 for c in chunks if c is not None and c.base is None)


def bases_of(chunks, baseline: Optional[Baseline]) -> Dict[str, Dict[str, int]]:
    """The manifest's ``bases``: every checkpoint and file the chunks refer to, with sizes."""
    out: Dict[str, Dict[str, int]] = {}
    for c in chunks:
        if c.base is not None:
            assert baseline is not None
            out.setdefault(c.base, {})[c.file] = baseline.sizes[c.base][c.file]
    return {b: dict(sorted(f.items())) for b, f in sorted(out.items())}
