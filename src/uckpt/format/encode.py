"""The writer of format 1.0: a manifest's root and its parts, as bytes.

A world of one rank is written as a root alone (every chunk in the root's chunk
table); a larger one as a root with an empty chunk table and one part per rank that
stored chunks (the rows of the chunks that rank wrote, its references to bases
included), the parts written before the root.
"""
from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Tuple

from ..codecs import hashing
from ..codecs.checksum import of as _crc_text
from ..errors import ManifestError
from . import chunk_table, integrity
from .model import Chunk, Manifest, Pipeline

FORMAT_NAME = "uckpt"
FORMAT_VERSION = "1.0"
PART_FORMAT = "uckpt-part"


def part_name(index: int) -> str:
    """The name uckpt gives the part at ``index`` of the root's ``parts``."""
    return f"manifest.part-{index:05d}.json"


def encode(m: Manifest) -> Tuple[bytes, List[Tuple[str, bytes]]]:
    """``(root bytes, [(part name, part bytes), ...])`` of manifest ``m`` in format 1.0."""
    unhashed = m.unhashed()
    if unhashed is not None:
        raise ManifestError(
            f"leaf {unhashed!r} has a chunk without a content hash: a manifest read from "
            f"format version {m.format_version} cannot be written as format "
            f"{FORMAT_VERSION} without reading its data", leaf=unhashed,
            hint="load the checkpoint and save it again, or use uckpt.consolidate")
    entries = list(m.arrays.values())
    rows = [(i, c) for i, a in enumerate(entries) for c in a.chunks]
    used: Dict[Pipeline, int] = {}
    for _, c in rows:
        used.setdefault(c.codec, len(used))
    if not used:
        used[()] = 0
    parts: List[Tuple[str, bytes]] = []
    part_entries: List[Dict[str, Any]] = []
    root_rows: List[Tuple[int, Chunk]] = rows
    if m.world_size > 1:
        root_rows = []
        for _, mine in sorted(_by_rank(m, rows).items()):
            name = part_name(len(parts))
            data, entry = encode_part(mine, used)
            parts.append((name, data))
            part_entries.append({"file": name, **entry})
    roots = {a.path: a.merkle_root() for a in entries}
    return encode_root(m, used, root_rows, part_entries,
                       hashing.format_hash(hashing.checkpoint_root(roots))), parts


def encode_root(m: Manifest, used: Dict[Pipeline, int], root_rows: List[Tuple[int, Chunk]],
                part_entries: List[Dict[str, Any]], merkle_root: str,
                extensions: Optional[Dict[str, Any]] = None) -> bytes:
    """The root manifest of ``m`` (its arrays' dtypes and shapes; its chunks are ignored)
    with ``root_rows`` in its chunk table, pipelines ``used`` (pipeline -> index), part
    entries ``part_entries`` and ``merkle_root`` (text); ``extensions``: extension name
    -> ``(required, {member: value})``, declared and their members added."""
    entries = list(m.arrays.values())
    extensions = extensions or {}
    doc = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "extensions": {name: {"required": req} for name, (req, _) in extensions.items()},
        "generator": m.generator,
        "created": m.created,
        "world_size": m.world_size,
        "step": m.step,
        "metadata": m.metadata,
        "files": {f.name: {"rank": f.rank, "size": f.size} for f in m.files.values()},
        "bases": m.bases,
        "tree": m.tree,
        "arrays": {"paths": [a.path for a in entries], "dtypes": [a.dtype for a in entries],
                   "shapes": [list(a.shape) for a in entries]},
        "codecs": [list(p) for p in used],
        "chunks": chunk_table.encode(root_rows, used),
        "parts": part_entries,
        "merkle_root": merkle_root,
    }
    for _, members in extensions.values():
        doc.update(members)
    return integrity.seal(_json(doc)[:-1])  # sealed without the closing brace


def encode_part(rows: List[Tuple[int, Chunk]], used: Dict[Pipeline, int]
                ) -> Tuple[bytes, Dict[str, Any]]:
    """``(part bytes, its entry in the root without "file")`` of chunk rows ``rows``
    (array index, chunk); ``used``: the root's pipelines (pipeline -> index)."""
    data = _json({"format": PART_FORMAT, "format_version": FORMAT_VERSION,
                  "chunks": chunk_table.encode(rows, used)}) + b"\n"
    return data, {"size": len(data), "checksum": _crc_text(data),
                  "arrays": _runs(sorted({i for i, _ in rows}))}


def encode_manifest(m: Manifest) -> bytes:
    """The root manifest of format 1.0 of a manifest without parts (a world of one rank);
    ValueError when it has parts (:func:`encode`)."""
    root, parts = encode(m)
    if parts:
        raise ValueError("this manifest has parts: write them with encode()")
    return root


def _json(doc: Dict[str, Any]) -> bytes:
    try:
        # compact, so json's C encoder runs (indent selects the slow pure-Python one)
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False).encode("utf-8")
    except ValueError as e:  # NaN/inf in metadata, or a lone surrogate in a string
        raise ManifestError(f"the manifest cannot be written as UTF-8 JSON: {e}",
                            hint="metadata must be JSON (no NaN or infinity) and strings "
                                 "valid Unicode") from None


def _by_rank(m: Manifest, rows: List[Tuple[int, Chunk]]) -> Dict[int, List[Tuple[int, Chunk]]]:
    """The rows of each rank: the rank of the data file a chunk is in (a reference to a
    base's file: the rank of this checkpoint's file of that name, else rank 0)."""
    out: Dict[int, List[Tuple[int, Chunk]]] = {}
    for row in rows:
        entry = m.files.get(row[1].file)
        out.setdefault(entry.rank if entry is not None else 0, []).append(row)
    return out


def _runs(indices: List[int]) -> List[List[int]]:
    """Sorted indices as ``[first, count]`` runs (non-adjacent)."""
    runs: List[List[int]] = []
    last: Optional[int] = None
    for i in indices:
        if last is not None and i == last + 1:
            runs[-1][1] += 1
        else:
            runs.append([i, 1])
        last = i
    return runs
