"""Re-encode a committed checkpoint's data files with another compression (a tier copy).

A durable tier with ``compression`` (``uckpt.Tier(path, compression="zstd")``) receives
checkpoints from the fast tier with their raw chunks compressed while they are copied:
each rank reads the chunks of the data files it wrote (every byte checked against its
CRC-32C), encodes the raw ones (chunks already compressed are kept as they are), and
writes each file anew through the target's sink, a few chunks in memory at a time
(an object store's sink gathers a file's pieces first); the manifest is the source's with the
new chunks (offsets, lengths, codecs, checksums) and file sizes, written by the
committing rank once every rank has written (:func:`uckpt.saving.collective.copy_collective`).

Content hashes are of the raw bytes, so they, and the Merkle roots built from them, do
not change (a chunk read from a manifest older than version 4 gets its hash here). An
incremental checkpoint's references to its bases (docs/format.md section 11.4) stay
references: the bases are copied to the tier first, and each reference is pointed at
the base's chunk of the same box as the tier holds it (:func:`target_bases`), whose
offset, length and codec differ from the source's when the base was re-encoded too.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Mapping, Optional, Sequence, Tuple

from ..codecs import hashing
from ..codecs.pipeline import Compression
from ..errors import CheckpointNotFoundError, CorruptCheckpointError
from ..format import Chunk, FileEntry, Manifest
from ..options import DEFAULT_ALIGNMENT
from ..loading.reader import CheckpointReader, read_manifest
from .writer import encode_chunk, file_end, write_encoded

#: a chunk's place in a manifest: (array path, index in its ``chunks``)
Key = Tuple[str, int]


def recode_files(source, manifest: Manifest, files: Sequence[str], sink,
                 compression: Compression, alignment: int = DEFAULT_ALIGNMENT
                 ) -> Dict[str, list]:
    """Write ``files`` (of the checkpoint's own) of the checkpoint ``source`` holds
    (``manifest``: its manifest) into ``sink``, raw chunks encoded with ``compression``
    (each array starting at a multiple of ``alignment``),
    a few chunks at a time (:func:`uckpt.saving.writer.write_encoded`); returns what
    :func:`recoded_manifest` needs: ``{"chunks": [(path, index, offset, length, codec,
    checksum, hash)], "sizes": [(file, size)]}``."""
    out: Dict[str, list] = {"chunks": [], "sizes": []}
    reader = CheckpointReader(source, manifest=manifest)  # the caller closes ``source``
    reader.open_files(files)
    for name in files:
        keys = sorted(((path, i, c) for path, e in manifest.arrays.items()
                       for i, c in enumerate(e.chunks) if c.file == name and c.base is None),
                      key=lambda key: key[2].offset)

        def encode(k: int, memory, keys=keys) -> tuple:
            path, _, chunk = keys[k]
            entry = manifest.arrays[path]
            stored = reader.read_stored(entry, chunk)  # checksum checked
            if chunk.compressed:  # kept as it is
                content = chunk.hash or hashing.of(reader.decoded(entry, chunk, stored))
                return chunk.codec, stored, chunk.checksum, content
            return encode_chunk(compression, stored, chunk, chunk.hash or None, memory)

        written = write_encoded(sink, name, [(key[0], key, key[2].length) for key in keys],
                                encode, alignment)
        out["chunks"].extend((path, i, c.offset, c.length, c.codec, c.checksum, c.hash)
                             for (path, i, _), c in written.items())
        out["sizes"].append((name, file_end(written.values())))
    return out


def target_bases(dst, manifest: Manifest) -> Dict[str, Manifest]:
    """The manifests, as store ``dst`` holds them, of the bases ``manifest`` refers to
    (they are copied before the checkpoints referring to them)."""
    out = {}
    for base in manifest.bases:
        if not dst.has(base):
            where = str(dst.location(base))
            raise CheckpointNotFoundError(
                f"the base {where!r} of the checkpoint being copied is not committed there",
                path=where, hint="copy the bases first (CheckpointManager does), or copy "
                                 "a consolidated checkpoint (uckpt.consolidate)")
        out[base] = read_manifest(dst.source(base))
    return out


def recoded_manifest(manifest: Manifest, parts: Sequence[Dict[str, list]],
                     bases: Mapping[str, Manifest]) -> Manifest:
    """``manifest`` with the chunks and file sizes every rank's :func:`recode_files`
    returned, and its references pointed at the chunks of ``bases`` (the target's
    manifests of its bases, :func:`target_bases`)."""
    new: Dict[Key, tuple] = {(p, i): rest for part in parts for p, i, *rest in part["chunks"]}
    sizes = {name: size for part in parts for name, size in part["sizes"]}
    held = {(b, path, c.start, c.shape): c for b, m in bases.items()
            for path, e in m.arrays.items() for c in e.chunks if c.base is None}
    arrays = {}
    for path, entry in manifest.arrays.items():
        chunks = []
        for i, c in enumerate(entry.chunks):
            if c.base is not None:
                chunks.append(_rebased(c, path, held.get((c.base, path, c.start, c.shape))))
            elif (path, i) in new:
                offset, length, codec, checksum, content = new[(path, i)]
                chunks.append(dataclasses.replace(c, offset=offset, length=length,
                                                  codec=tuple(codec), checksum=checksum,
                                                  hash=content))
            else:
                chunks.append(c)
        arrays[path] = dataclasses.replace(entry, chunks=tuple(chunks))
    files = {n: FileEntry(n, f.rank, sizes.get(n, f.size)) for n, f in manifest.files.items()}
    referred: Dict[str, Dict[str, int]] = {}
    for e in arrays.values():
        for c in e.chunks:
            if c.base is not None:
                referred.setdefault(c.base, {})[c.file] = bases[c.base].files[c.file].size
    return dataclasses.replace(manifest, arrays=arrays, files=files, bases={
        b: dict(sorted(f.items())) for b, f in sorted(referred.items())})


def _rebased(chunk: Chunk, path: str, held: Optional[Chunk]) -> Chunk:
    """``chunk``, a reference to a base, pointed at ``held``: the base's own chunk of the
    same box as the target holds it, which must have the same content hash."""
    if held is None or held.hash != chunk.hash:
        raise CorruptCheckpointError(
            f"leaf {path!r}: the copy of base {chunk.base!r} on the target holds no chunk at "
            f"start {list(chunk.start)} with content hash {chunk.hash}", leaf=path,
            hint="the target's copy of the base differs from the source's; delete it there "
                 "and copy again")
    return dataclasses.replace(held, base=chunk.base)
