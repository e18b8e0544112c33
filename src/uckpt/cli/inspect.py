"""``uckpt inspect CKPT``: what a checkpoint holds, from its manifest alone (no data is read)."""
from __future__ import annotations

import argparse
import json
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from ..conversion.subtree import SelectError
from ..format import FORMAT_NAME, Manifest
from ..loading import manifest_io
from ..loading.selection import matches, patterns_of
from ..loading.stored_sizes import Stored, of_entry, stored_sizes
from ..tree.flatten import escape
from ..storage import canonical, open_source
from . import foreign
from .storage_args import add_storage_arguments, options_for
from .common import bytes_text, human_bytes, human_time, print_error, print_json, shape_str, table

HELP = "show a checkpoint's header, metadata, values and leaves"
DESCRIPTION = """\
Show what the checkpoint CKPT holds: its header (format version, world size,
step, creation time, writer, size, files), user metadata, the framework
objects and plain values of its state tree, and a table of its array leaves
with their codecs and compression ratios (stored size / raw size).
Only the manifest is read, so this is fast on checkpoints of any size: the
root first, then its parts (a save by several ranks) one at a time, only those
that hold a shown array. A part that cannot be read is named (exit 1) after
what the root gives is shown; run "uckpt verify" to check the data and the
manifest whole. CKPT may also be a file or directory in
another format uckpt convert reads (NPZ, torch.save, HDF5, safetensors, .keras,
Hugging Face, DCP): its arrays and values are listed from its headers."""


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("inspect", help=HELP, description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", metavar="CKPT",
                   help="a checkpoint directory, or an s3://bucket/prefix URL")
    p.add_argument("--json", action="store_true", help="print a JSON document instead of text")
    p.add_argument("--select", metavar="PATTERN", action="append",
                   help="show only the leaves whose paths match this glob, as uckpt.load's "
                        "select= (* matches across /; a node's path, e.g. model, picks "
                        "everything below it; repeat for more): their objects, values and "
                        "leaves, with totals over those leaves; only the manifest parts "
                        "holding their arrays are read")
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


def describe(directory, manifest: Manifest,
             stored: Optional[Mapping[str, Optional[Stored]]] = None,
             select: Union[str, Sequence[str], None] = None) -> Dict[str, Any]:
    """The JSON document of ``uckpt inspect --json``: ``stored`` gives each array's chunks
    as stored (None: an array of a manifest part that could not be read; the mapping
    None: counted from ``manifest``'s chunks); ``select``: only the leaves these glob
    patterns pick (as ``uckpt.load``'s ``select=``), and the objects holding them."""
    found: Dict[str, list] = {"objects": [], "values": [], "refs": []}
    walk(manifest.tree, [], found)
    patterns = None if select is None else patterns_of(select, "--select")
    if patterns is not None:
        found = _picked(found, patterns)
    kinds = {r["array"]: r["type"] for r in found["refs"] if r["path"] == r["array"]}
    entries = [a for a in manifest.arrays.values()
               if patterns is None or _matched(a.path, patterns)]
    if stored is None:
        stored = {a.path: of_entry(a) for a in entries}
    sizes = [stored[a.path] for a in entries]
    nbytes = sum(a.nbytes for a in entries)
    known = all(s is not None for s in sizes)
    total = sum(s.stored for s in sizes if s is not None) if known else None
    doc = {
        "path": str(canonical(directory)),
        "format": FORMAT_NAME,
        "format_version": manifest.format_version,
        "generator": manifest.generator,
        "created": manifest.created,
        "step": manifest.step,
        "world_size": manifest.world_size,
        "nbytes": nbytes,
        "stored": total,
        "ratio": None if total is None else _ratio(total, nbytes),
        "files": [{"name": f.name, "rank": f.rank, "size": f.size}
                  for f in manifest.files.values()],
        "merkle_root": manifest.merkle_root or None,
        "bases": manifest.bases,
        "referring_chunks": sum(s.referring for s in sizes if s is not None) if known else None,
        "metadata": manifest.metadata,
        "objects": found["objects"],
        "values": found["values"],
        "leaves": [_leaf(a, kinds.get(a.path, "array"), s) for a, s in zip(entries, sizes)],
        # array references stored once under another path (tied / shared arrays)
        "shared": [{"path": r["path"], "array": r["array"]}
                   for r in found["refs"] if r["path"] != r["array"]],
    }
    if patterns is not None:
        doc["select"] = patterns[0] if len(patterns) == 1 else list(patterns)
    return doc


def _leaf(a, kind: str, s: Optional[Stored]) -> Dict[str, Any]:
    return {"path": a.path, "dtype": a.dtype, "shape": list(a.shape), "nbytes": a.nbytes,
            "chunks": s and s.chunks, "kind": kind, "codec": s and s.codec,
            "stored": s and s.stored, "ratio": s and _ratio(s.stored, a.nbytes)}


def _matched(path: str, patterns: Sequence[str]) -> bool:
    return any(matches(path, p) for p in patterns)


def _picked(found: Dict[str, list], patterns: Sequence[str]) -> Dict[str, list]:
    """The values and array references ``patterns`` pick, and the objects at or above
    them (or picked themselves)."""
    out = {k: [v for v in found[k] if _matched(v["path"], patterns)]
           for k in ("values", "refs")}
    held = [v["path"] for k in out for v in out[k]]
    out["objects"] = [o for o in found["objects"] if _matched(o["path"], patterns) or any(
        not o["path"] or p == o["path"] or p.startswith(o["path"] + "/") for p in held)]
    return out


def selected_arrays(manifest: Manifest, select: Union[str, Sequence[str]]) -> List[str]:
    """The arrays the glob patterns ``select`` pick; raises SelectError naming a
    pattern that picks no node of the state tree."""
    found: Dict[str, list] = {"objects": [], "values": [], "refs": []}
    walk(manifest.tree, [], found)
    patterns = patterns_of(select, "--select")
    for pattern in patterns:
        if not any(matches(v["path"], pattern) for k in found for v in found[k]):
            raise SelectError(f"--select {pattern!r}: the checkpoint's state tree has no "
                              "node there", leaf=pattern,
                              hint="run `uckpt inspect CKPT` (without --select) for its "
                                   "paths; a pattern is a glob (* matches across /)")
    return [p for p in manifest.arrays if _matched(p, patterns)]


def _ratio(stored: int, nbytes: int) -> float:
    """Stored bytes per raw byte (1.0 for raw or empty arrays)."""
    return round(stored / nbytes, 4) if nbytes else 1.0


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
            if doc["stored"] is not None and doc["stored"] != doc["nbytes"] else
            "; stored sizes unknown (a manifest part could not be read)"
            if doc["stored"] is None else ""),
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
                     ("" if doc["referring_chunks"] is None else
                      f"; {doc['referring_chunks']} of "
                      f"{sum(a['chunks'] for a in doc['leaves'])} chunks refer to them"))
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
                 shape_str(a["shape"]), human_bytes(a["nbytes"]),
                 "-" if a["chunks"] is None else a["chunks"], a["codec"] or "-",
                 "-" if a["ratio"] is None else f"{a['ratio']:.3f}"]
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
        if args.select is not None:
            raise SelectError(f"--select {' '.join(args.select)!r}: only a uckpt checkpoint's "
                              f"inspection takes --select, and {args.checkpoint!r} is not one",
                              hint="inspect it without --select, or convert it with "
                                   "`uckpt convert --select PATH`")
        doc = foreign.describe(args.checkpoint, args.src_format)
        if args.json:
            print_json(doc)
        else:
            print(foreign.render(doc))
        return 0
    with open_source(args.checkpoint, options_for(args.checkpoint, args)) as source:
        manifest = manifest_io.read_root(source)  # (parts: read one at a time, if needed)
        select = None if args.select is None else patterns_of(args.select, "--select")
        paths = None if select is None else selected_arrays(manifest, select)
        sizes = stored_sizes(source, manifest, paths)
    doc = describe(args.checkpoint, manifest, sizes.by_path, select)
    if args.json:
        print_json(doc)
    else:
        print(render(doc))
    for error in sizes.errors:  # (what the root gives is shown; each bad part is named)
        print_error(error)
    return 1 if sizes.errors else 0
