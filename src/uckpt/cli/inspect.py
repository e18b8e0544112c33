"""``uckpt inspect CKPT``: what a checkpoint holds, from its manifest alone (no data is read)."""
from __future__ import annotations

import argparse
import json
from typing import Any, Dict, List

from ..codecs import pipeline as codecs
from ..format import FORMAT_NAME, Manifest
from ..loading.reader import read_manifest
from ..tree.flatten import escape
from ..storage import canonical
from . import foreign
from .storage_args import add_storage_arguments, options_for
from .common import bytes_text, human_bytes, human_time, print_json, shape_str, table

HELP = "show a checkpoint's header, metadata, values and leaves"
DESCRIPTION = """\
Show what the checkpoint CKPT holds: its header (format version, world size,
step, creation time, writer, size, files), user metadata, the framework
objects and plain values of its state tree, and a table of its array leaves
with their codecs and compression ratios (stored size / raw size).
Only the manifest is read, so this is fast on checkpoints of any size; run
"uckpt verify" to check the data. CKPT may also be a file or directory in
another format uckpt convert reads (NPZ, torch.save, HDF5, safetensors, .keras,
Hugging Face, DCP): its arrays and values are listed from its headers."""


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("inspect", help=HELP, description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", metavar="CKPT",
                   help="a checkpoint directory, or an s3://bucket/prefix URL")
    p.add_argument("--json", action="store_true", help="print a JSON document instead of text")
    add_from_argument(p)
    add_storage_arguments(p)
    p.set_defaults(run=run)
    return p


def walk(node: Dict[str, Any], parts: List[str], out: Dict[str, list]) -> None:
    """Collect, in tree order, objects, plain values and array references with their paths."""
    path = "/".join(parts)
    kind = node["type"]
    if kind == "object":
        out["objects"].append({"path": path, "adapter": node["adapter"], "class": node["class"]})
        walk(node["state"], parts, out)
    elif kind == "dict":
        if not node["items"] and parts:
            out["values"].append({"path": path, "type": "dict", "value": {}})
        for k, v in node["items"].items():
            walk(v, parts + [escape(k)], out)
    elif kind in ("list", "tuple"):
        if not node["items"]:
            out["values"].append({"path": path, "type": kind, "value": []})
        for i, v in enumerate(node["items"]):
            walk(v, parts + [str(i)], out)
    elif kind in ("value", "float"):  # "float" holds "nan", "inf" or "-inf" as a string
        out["values"].append({"path": path, "type": kind, "value": node["value"]})
    elif kind in ("array", "bytes"):
        ref = {"path": path, "array": node["path"], "type": kind}
        if node.get("numpy_scalar"):
            ref["numpy_scalar"] = True
        out["refs"].append(ref)


def describe(directory, manifest: Manifest) -> Dict[str, Any]:
    """The JSON document of ``uckpt inspect --json``."""
    found: Dict[str, list] = {"objects": [], "values": [], "refs": []}
    walk(manifest.tree, [], found)
    kinds = {r["array"]: r["type"] for r in found["refs"] if r["path"] == r["array"]}
    return {
        "path": str(canonical(directory)),
        "format": FORMAT_NAME,
        "format_version": manifest.format_version,
        "generator": manifest.generator,
        "created": manifest.created,
        "step": manifest.step,
        "world_size": manifest.world_size,
        "nbytes": manifest.nbytes,
        "stored": sum(_stored(a) for a in manifest.arrays.values()),
        "ratio": _ratio(sum(_stored(a) for a in manifest.arrays.values()), manifest.nbytes),
        "files": [{"name": f.name, "rank": f.rank, "size": f.size}
                  for f in manifest.files.values()],
        "merkle_root": manifest.merkle_root or None,
        "bases": manifest.bases,
        "referring_chunks": sum(1 for a in manifest.arrays.values() for c in a.chunks if c.base),
        "metadata": manifest.metadata,
        "objects": found["objects"],
        "values": found["values"],
        "leaves": [{"path": a.path, "dtype": a.dtype, "shape": list(a.shape), "nbytes": a.nbytes,
                    "chunks": len(a.chunks), "kind": kinds.get(a.path, "array"),
                    "codec": _codec(a), "stored": _stored(a), "ratio": _ratio(_stored(a), a.nbytes)}
                   for a in manifest.arrays.values()],
        # array references stored once under another path (tied / shared arrays)
        "shared": [{"path": r["path"], "array": r["array"]}
                   for r in found["refs"] if r["path"] != r["array"]],
    }


def _stored(entry) -> int:
    return sum(c.length for c in entry.chunks)


def _ratio(stored: int, nbytes: int) -> float:
    """Stored bytes per raw byte (1.0 for raw or empty arrays)."""
    return round(stored / nbytes, 4) if nbytes else 1.0


def _codec(entry) -> str:
    """The codec pipeline of an array's chunks (``raw``, ``zstd``, ``bytegroup+zstd``), or
    those joined by ``,`` when its chunks differ (``-`` for an array without chunks)."""
    names = sorted({codecs.label(c.codec) for c in entry.chunks})
    return ",".join(names) or "-"


def _value_text(v: Dict[str, Any]) -> str:
    if v["type"] == "float":
        return v["value"]
    return json.dumps(v["value"], ensure_ascii=False)


def render(doc: Dict[str, Any]) -> str:
    files = doc["files"]
    lines = [
        f"checkpoint   {doc['path']}",
        f"format       {doc['format']} v{doc['format_version']}",
        f"step         {'-' if doc['step'] is None else doc['step']}",
        f"created      {human_time(doc['created'])}",
        f"generator    {doc['generator'] or '-'}",
        f"world size   {doc['world_size']}",
        f"total        {bytes_text(doc['nbytes'])} in "
        f"{len(doc['leaves'])} leaves" + (
            f"; stored {human_bytes(doc['stored'])} (ratio {doc['ratio']:.3f})"
            if doc["stored"] != doc["nbytes"] else ""),
        f"files        {len(files)}: " + (", ".join(
            f"{f['name']} (rank {f['rank']}, {human_bytes(f['size'])})" for f in files[:4])
            + (f", ... ({len(files) - 4} more)" if len(files) > 4 else "")),
    ]
    if doc["merkle_root"]:
        lines.append(f"merkle root  {doc['merkle_root']}")
    if doc["bases"]:
        names = list(doc["bases"])
        lines.append(f"bases        {len(names)}: " + ", ".join(names[:4]) +
                     (f", ... ({len(names) - 4} more)" if len(names) > 4 else "") +
                     f"; {doc['referring_chunks']} of "
                     f"{sum(a['chunks'] for a in doc['leaves'])} chunks refer to them")
    if doc["metadata"]:
        lines += ["", "metadata:"]
        lines += [f"  {k} = {json.dumps(v, ensure_ascii=False)}"
                  for k, v in doc["metadata"].items()]
    if doc["objects"]:
        lines += ["", "objects:"]
        lines += [f"  {o['path'] or '<root>'}: {o['adapter']} ({o['class']})"
                  for o in doc["objects"]]
    if doc["values"] or doc["shared"]:
        lines += ["", "values:"]
        lines += [f"  {v['path']} = {_value_text(v)}" for v in doc["values"]]
        lines += [f"  {s['path']} -> {s['array']} (shared array)" for s in doc["shared"]]
    if doc["leaves"]:
        lines += ["", "leaves:"]
        rows = [[a["path"] + (" (bytes)" if a["kind"] == "bytes" else ""), a["dtype"],
                 shape_str(a["shape"]), human_bytes(a["nbytes"]), a["chunks"], a["codec"],
                 f"{a['ratio']:.3f}"]
                for a in doc["leaves"]]
        body = table(["PATH", "DTYPE", "SHAPE", "SIZE", "CHUNKS", "CODEC", "RATIO"], rows,
                     right=[3, 4, 6])
        lines += ["  " + line for line in body.splitlines()]
    return "\n".join(lines)


def add_from_argument(p: argparse.ArgumentParser) -> None:
    from ..conversion.detect import ALIASES, FORMATS

    p.add_argument("--from", dest="src_format", metavar="FORMAT",
                   choices=sorted(FORMATS + tuple(ALIASES)),
                   help="format of a CKPT that is not a uckpt checkpoint (default: detected)")


def run(args) -> int:
    if foreign.is_foreign(args.checkpoint):
        doc = foreign.describe(args.checkpoint, args.src_format)
        if args.json:
            print_json(doc)
        else:
            print(foreign.render(doc))
        return 0
    manifest = read_manifest(args.checkpoint, options_for(args.checkpoint, args))
    doc = describe(args.checkpoint, manifest)
    if args.json:
        print_json(doc)
    else:
        print(render(doc))
    return 0
