"""Manifest documents with their chunks written out as chunk lists (pre-release version 6).

Tests that edit a manifest's chunks as JSON start from :func:`listed`: a version-5 or 6
manifest may list any array either way (docs/format-legacy.md), so the listed document is
valid too; a format-1.0 root becomes the version-6 document of the same checkpoint (same
files, chunks, hashes and Merkle root; the chunks of its parts, read from its directory,
listed with the others), so such edits test the rules of the legacy parser, which are
those of 1.0 for each chunk. The grids are decoded by
``chunk_list`` of tests/data/make_golden.py (written from the spec with base64, zlib and
NumPy, not uckpt).
"""
from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path
from typing import Any, Dict

from uckpt.format import integrity
from uckpt.format import parse_manifest
from uckpt.format.strict_json import loads as strict_json

_spec = importlib.util.spec_from_file_location(
    "make_golden_listing", Path(__file__).resolve().parent / "data" / "make_golden.py")
golden = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(golden)
chunk_list = golden.chunk_list


def listed(doc: Dict[str, Any], directory=None) -> Dict[str, Any]:
    """A copy of manifest document ``doc`` whose arrays all have ``chunks`` (keys in the
    order uckpt writes them: ``root`` last): grids decoded, and a version-6 ``table``'s rows
    turned into array entries (after the others), their roots computed from the spec.
    ``directory``: the checkpoint's, where a 1.0 root's parts are read from."""
    if doc.get("format_version") == "1.0":
        return as_version_6(doc, directory)
    doc = copy.deepcopy(doc)
    for entry in doc.get("arrays", {}).values():
        if isinstance(entry, dict) and "grid" in entry:
            entry["chunks"] = chunk_list(entry)
            del entry["grid"]
            if "root" in entry:
                entry["root"] = entry.pop("root")
    rows = golden.table_entries(doc)
    if rows:
        roots, _ = golden.merkle_roots(rows)
        for path, entry in rows.items():
            entry["root"] = roots[path]
        doc["arrays"].update(rows)
        del doc["table"]
    return doc


def doc_of(directory) -> Dict[str, Any]:
    """The manifest document of the checkpoint at ``directory``."""
    return strict_json((Path(directory) / "manifest.json").read_bytes())


def sealed(doc: Dict[str, Any]) -> bytes:
    """Manifest document ``doc`` as a compact manifest file, ending in its checksum."""
    doc = {k: v for k, v in doc.items() if k != integrity.FIELD}
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
    return integrity.seal(text[:-1].encode("utf-8"))


#: the version-6 codec name of each 1.0 pipeline
CODEC_NAMES = {(): "raw", ("zstd",): "zstd", ("bytegroup", "zstd"): "zstd+bytegroup"}


def as_version_6(doc: Dict[str, Any], directory=None) -> Dict[str, Any]:
    """The version-6 document (chunk lists) of format-1.0 root ``doc``, its chunk tables
    decoded by uckpt's 1.0 parser (its parts read from ``directory``)."""
    def read_part(entry):
        assert directory is not None, "a root with parts needs its directory"
        return (Path(directory) / entry.file).read_bytes()

    m = parse_manifest(sealed(doc), read_part=read_part)
    out = {k: copy.deepcopy(doc[k]) for k in ("format", "format_version", "generator",
                                                "created", "world_size", "step", "metadata",
                                                "files", "tree")}
    out["format_version"] = 6
    out["arrays"] = {}
    for a in m.arrays.values():
        chunks = []
        for c in a.chunks:
            chunk = {"file": c.file, "offset": c.offset, "length": c.length,
                     "start": list(c.start), "shape": list(c.shape),
                     "codec": CODEC_NAMES[c.codec], "checksum": c.checksum, "hash": c.hash}
            if c.base is not None:
                chunk["base"] = c.base
            chunks.append(chunk)
        out["arrays"][a.path] = {"dtype": a.dtype, "shape": list(a.shape), "chunks": chunks,
                                 "root": a.recorded_root()}
    out["bases"] = copy.deepcopy(doc["bases"])
    out["merkle_root"] = doc["merkle_root"]
    if integrity.FIELD in doc:
        out[integrity.FIELD] = doc[integrity.FIELD]
    return out
