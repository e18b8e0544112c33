"""``uckpt inspect`` and ``uckpt verify`` of a file or directory in another format (NPZ,
torch.save, HDF5, safetensors, .keras, Hugging Face, DCP, TensorFlow and Orbax checkpoints): read
through the converter's readers, so the same safety checks and limits apply and nothing of
the input is run."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from ..format import MANIFEST_NAME
from ..storage import local_path
from .common import bytes_text

#: what verifying a foreign input can check, per format (a format without checksums is
#: only parsed)
CHECKS = {
    "npz": "zip structure, every .npy header, sizes; CRC-32 of deflated members",
    "pickle": "zip structure, the pickle through the restricted unpickler, storage sizes",
    "hdf5": "HDF5 structure, dataset sizes and filters, no external links",
    "safetensors": "header, dtypes, offsets inside the file and not overlapping",
    "keras": "zip structure, config and metadata as text, the weights file as HDF5",
    "hf": "the index against its shards, every shard as its format",
    "dcp": ".metadata through the restricted unpickler, every chunk inside its file",
    "tf": "the index and every data shard there, every tensor read by TensorFlow's reader",
    "orbax": "_METADATA, every leaf's zarr metadata and chunks read by TensorStore",
}


def is_foreign(path: str) -> bool:
    """A local file, or a directory of another format (DCP, Hugging Face, a TensorFlow
    checkpoint's directory), or a TensorFlow checkpoint's prefix; a directory that is
    none of these is left to uckpt's own reader (and its "no manifest.json" error)."""
    from ..conversion.orbax_dir import is_source as is_orbax_checkpoint
    from ..conversion.tf_prefix import is_source as is_tf_checkpoint

    p = local_path(path)
    if p is None:
        return False
    if p.is_dir():
        from ..conversion.hf_names import is_hf_directory

        return not (p / MANIFEST_NAME).is_file() and \
            ((p / ".metadata").is_file() or is_hf_directory(p) or is_tf_checkpoint(p) or
             is_orbax_checkpoint(p))
    return p.is_file() or is_tf_checkpoint(p)


def describe(path: str, fmt: Optional[str] = None) -> Dict[str, Any]:
    """The document of ``uckpt inspect --json`` for a foreign input (no array is read)."""
    from ..conversion.api import open_checkpoint
    from ..conversion.interchange import Leaf, Obj, walk
    from ..tree.flatten import join

    with open_checkpoint(path, fmt) as tree:
        leaves: List[Dict[str, Any]] = []
        values, objects, shared = [], [], []
        first: Dict[int, str] = {}
        for parts, node in walk(tree.root):
            where = join(parts)
            if isinstance(node, Leaf):
                if id(node) in first:
                    shared.append({"path": where, "array": first[id(node)]})
                    continue
                first[id(node)] = where
                leaves.append({"path": where, "dtype": node.dtype, "shape": list(node.shape),
                               "nbytes": node.nbytes, "kind": node.kind})
            elif isinstance(node, Obj):
                objects.append({"path": where, "adapter": node.adapter, "class": node.cls})
            elif not isinstance(node, (dict, list, tuple)):
                values.append({"path": where, "value": node if not isinstance(node, bytes)
                               else f"<{len(node)} bytes>"})
        kept = sorted(k for k in tree.extras.get("", {}))
        return {"path": str(Path(path).absolute()), "format": tree.format,
                "nbytes": sum(a["nbytes"] for a in leaves), "leaves": leaves,
                "values": values, "objects": objects, "shared": shared,
                "kept": kept, "notes": list(tree.notes)}


def render(doc: Dict[str, Any]) -> str:
    from .common import human_bytes, shape_str, table

    lines = [f"checkpoint   {doc['path']}", f"format       {doc['format']}",
             f"total        {bytes_text(doc['nbytes'])} in {len(doc['leaves'])} leaves"]
    if doc["kept"]:
        lines.append(f"kept         {', '.join(doc['kept'])}")
    if doc["objects"]:
        lines += ["", "objects:"] + [f"  {o['path'] or '<root>'}: {o['adapter']} "
                                     f"({o['class']})" for o in doc["objects"]]
    if doc["values"] or doc["shared"]:
        lines += ["", "values:"] + [f"  {v['path']} = {v['value']!r}" for v in doc["values"]]
        lines += [f"  {s['path']} -> {s['array']} (shared array)" for s in doc["shared"]]
    if doc["leaves"]:
        rows = [[a["path"], a["dtype"], shape_str(a["shape"]), human_bytes(a["nbytes"])]
                for a in doc["leaves"]]
        lines += ["", "leaves:"] + ["  " + line for line in table(
            ["PATH", "DTYPE", "SHAPE", "SIZE"], rows, right=[3]).splitlines()]
    for note in doc["notes"]:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def verify(path: str, fmt: Optional[str] = None) -> str:
    """Parse ``path`` fully and read every array (each reader checks what its format can);
    returns the OK line saying what was checked, or raises."""
    from ..conversion.api import open_checkpoint
    from ..conversion.interchange import unique_leaves

    start = time.perf_counter()
    with open_checkpoint(path, fmt) as tree:
        arrays = unique_leaves(tree.root)
        nbytes = 0
        for _, leaf in arrays:
            nbytes += leaf.read().nbytes
        kind = tree.format
    took = time.perf_counter() - start
    return (f"OK: {kind}: {len(arrays)} arrays, {bytes_text(nbytes)} read and parsed in "
            f"{took:.3f} s: {path}\n  checked: {CHECKS.get(kind, 'its structure')}; "
            "structural limits (nodes, depth, sizes); the format holds no checksums of "
            "its own beyond these")
