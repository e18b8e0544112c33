"""Re-encode a committed checkpoint's data files with another compression (a tier copy).

A durable tier with ``compression`` (``uckpt.Tier(path, compression="zstd")``) receives
checkpoints from the fast tier with their raw chunks compressed while they are copied:
each rank reads the chunks of the data files it wrote (every byte checked against its
CRC-32C), encodes the raw ones (chunks already compressed are kept as they are), and
writes each file anew through the target's sink; the manifest is the source's with the
new chunks (offsets, lengths, codecs, checksums) and file sizes, written by the
committing rank once every rank has written (:func:`uckpt.collective.copy_collective`).
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Sequence, Tuple

from .codecs import Compression
from .format import Chunk, FileEntry, Manifest
from .parallel import parallel_map
from .reader import CheckpointReader
from .writer import encode_chunks, file_end, write_encoded

#: a chunk's place in a manifest: (array path, index in its ``chunks``)
Key = Tuple[str, int]


def recode_files(source, manifest: Manifest, files: Sequence[str], sink,
                 compression: Compression) -> Dict[str, list]:
    """Write ``files`` of the checkpoint ``source`` holds (``manifest``: its manifest)
    into ``sink``, raw chunks encoded with ``compression``; returns what
    :func:`recoded_manifest` needs: ``{"chunks": [(path, index, offset, length, codec,
    checksum)], "sizes": [(file, size)]}``."""
    out: Dict[str, list] = {"chunks": [], "sizes": []}
    reader = CheckpointReader(source, manifest=manifest)  # the caller closes ``source``
    reader.open_files(files)
    for name in files:
        keyed = sorted(((c.offset, path, i, c) for path, e in manifest.arrays.items()
                        for i, c in enumerate(e.chunks) if c.file == name),
                       key=lambda x: x[0])
        stored = parallel_map(lambda x: reader.read_stored(manifest.arrays[x[1]], x[3]), keyed,
                              source.read_threads, "uckpt-recode-read")
        pieces = [(path, (path, i, c), data) for (_, path, i, c), data in zip(keyed, stored)]
        raw = [k for k, (_, (_, _, c), _) in enumerate(pieces) if not c.compressed]
        encoded: List[tuple] = [(c.codec, data, c.checksum) for (_, (_, _, c), data) in pieces]
        for k, result in zip(raw, encode_chunks([pieces[k] for k in raw], compression)):
            encoded[k] = result
        written = write_encoded(sink, name, pieces, encoded)
        out["chunks"].extend((path, i, c.offset, c.length, c.codec, c.checksum)
                             for (path, i, _), c in written.items())
        out["sizes"].append((name, file_end(written.values())))
    return out


def recoded_manifest(manifest: Manifest, parts: Sequence[Dict[str, list]]) -> Manifest:
    """``manifest`` with the chunks and file sizes every rank's :func:`recode_files`
    returned."""
    new: Dict[Key, tuple] = {(p, i): rest for part in parts for p, i, *rest in part["chunks"]}
    sizes = {name: size for part in parts for name, size in part["sizes"]}
    arrays = {}
    for path, entry in manifest.arrays.items():
        chunks = []
        for i, c in enumerate(entry.chunks):
            offset, length, codec, checksum = new.get((path, i), (c.offset, c.length, c.codec,
                                                                  c.checksum))
            chunks.append(Chunk(c.file, offset, length, c.start, c.shape, codec, checksum))
        arrays[path] = dataclasses.replace(entry, chunks=tuple(chunks))
    files = {n: FileEntry(n, f.rank, sizes.get(n, f.size)) for n, f in manifest.files.items()}
    return dataclasses.replace(manifest, arrays=arrays, files=files)
