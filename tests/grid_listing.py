"""Version-5 manifest documents with their grids written out as chunk lists.

Tests that edit a manifest's chunks as JSON start from :func:`listed`: a version-5
manifest may list any array either way (docs/format.md section 15), so the listed
document is valid too. The grids are decoded by ``chunk_list`` of
tests/data/make_golden.py (written from the spec with base64, zlib and NumPy, not uckpt).
"""
from __future__ import annotations

import copy
import importlib.util
from pathlib import Path
from typing import Any, Dict

_spec = importlib.util.spec_from_file_location(
    "make_golden_listing", Path(__file__).resolve().parent / "data" / "make_golden.py")
golden = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(golden)
chunk_list = golden.chunk_list


def listed(doc: Dict[str, Any]) -> Dict[str, Any]:
    """A copy of manifest document ``doc`` whose arrays all have ``chunks`` (keys in the
    order uckpt writes them: ``root`` last)."""
    doc = copy.deepcopy(doc)
    for entry in doc.get("arrays", {}).values():
        if isinstance(entry, dict) and "grid" in entry:
            entry["chunks"] = chunk_list(entry)
            del entry["grid"]
            if "root" in entry:
                entry["root"] = entry.pop("root")
    return doc
