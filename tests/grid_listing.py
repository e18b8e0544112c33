"""Version-5 and 6 manifest documents with their grids and table written out as chunk lists.

Tests that edit a manifest's chunks as JSON start from :func:`listed`: a version-5 or 6
manifest may list any array either way (docs/format.md sections 15 and 16), so the listed
document is valid too. The grids are decoded by ``chunk_list`` of
tests/data/make_golden.py (written from the spec with base64, zlib and NumPy, not uckpt).
"""
from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path
from typing import Any, Dict

from uckpt.format import integrity
from uckpt.format.strict_json import loads as strict_json

_spec = importlib.util.spec_from_file_location(
    "make_golden_listing", Path(__file__).resolve().parent / "data" / "make_golden.py")
golden = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(golden)
chunk_list = golden.chunk_list


def listed(doc: Dict[str, Any]) -> Dict[str, Any]:
    """A copy of manifest document ``doc`` whose arrays all have ``chunks`` (keys in the
    order uckpt writes them: ``root`` last): grids decoded, and a version-6 ``table``'s rows
    turned into array entries (after the others), their roots computed from the spec."""
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
