"""Structured mutations of a format-1.0 checkpoint as written (tests/test_fuzz_checkpoint.py).

:func:`edit_10` draws one edit of a 1.0 root manifest or of one of its parts, on the
documents as written: a chunk table's ``count``, ``sources``, ``layout`` and ``digests``
(rows decoded from the spec with base64, zlib and NumPy, edited, encoded again, or the
texts themselves damaged), the ``codecs`` pipelines, the array table, a part entry's
``size``, ``checksum``, ``arrays`` runs and ``file`` (or the entry dropped, duplicated,
reordered), ``extensions`` declared required or optional, a namespaced member. Nothing
here comes from uckpt's parser or writer.
"""
from __future__ import annotations

import base64
import copy
import json
import zlib
from pathlib import Path
from typing import Any, Dict, List

import crc32c
import numpy as np
from hypothesis import strategies as st

from fuzz_common import dumps
from format10_writer import b64, planes

#: (column, byte width) in the order of the layout (docs/format.md, the chunk table)
COLUMNS = (("array", 4), ("offset", 8), ("length", 8), ("source", 4), ("codec", 1))
ODD_VALUES = (0, 1, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1)


def _column(raw: bytes, at: int, width: int, n: int) -> List[int]:
    """``n`` values stored as ``width`` byte planes at ``raw[at:]``."""
    out = np.zeros((n, 8), np.uint8)
    out[:, :width] = np.frombuffer(raw, np.uint8, width * n, at).reshape(width, n).T
    return [int(v) for v in out.view("<u8").reshape(-1)]


def decode(table: Dict[str, Any], ndims: List[int]) -> List[Dict[str, Any]]:
    """The rows of chunk table ``table`` (its arrays having ``ndims`` dimensions): dicts of
    the five columns plus ``start``, ``shape``, ``crc`` (4 bytes) and ``hash`` (16)."""
    n = table["count"]
    raw = zlib.decompress(base64.b64decode(table["layout"]))
    rows: List[Dict[str, Any]] = [{} for _ in range(n)]
    at = 0
    for name, width in COLUMNS:
        for r, v in zip(rows, _column(raw, at, width, n)):
            r[name] = v
        at += width * n
    box = _column(raw, at, 8, (len(raw) - at) // 8)
    digests = base64.b64decode(table["digests"])
    for i, r in enumerate(rows):
        d = ndims[r["array"]]
        r["start"], r["shape"], box = box[:d], box[d:2 * d], box[2 * d:]
        r["crc"], r["hash"] = digests[4 * i:4 * i + 4], digests[4 * n + 16 * i:4 * n + 16 * i + 16]
    return rows


def layout_bytes(rows: List[Dict[str, Any]]) -> bytes:
    """The inflated layout of ``rows`` (values wrap at each column's width)."""
    cols = [planes([r[name] % 2**64 for r in rows], width) for name, width in COLUMNS]
    box = [v % 2**64 for r in rows for v in (*r["start"], *r["shape"])]
    return b"".join(cols) + planes(box, 8)


def encode(rows: List[Dict[str, Any]], sources: List[Any], level: int = 1) -> Dict[str, Any]:
    """A chunk table of ``rows`` (``source``: an index into ``sources``)."""
    digests = b"".join(r["crc"] for r in rows) + b"".join(r["hash"] for r in rows)
    return {"count": len(rows), "sources": sources,
            "layout": b64(zlib.compress(layout_bytes(rows), level)), "digests": b64(digests)}


#: the 1.0 pipeline of each version-6 codec name
PIPELINE_OF = {"raw": [], "zstd": ["zstd"], "zstd+bytegroup": ["bytegroup", "zstd"]}


def as_1_0(doc6: Dict[str, Any], raw: Dict[str, Any]) -> Dict[str, Any]:
    """Version-6 document ``doc6`` (chunk lists, as tests/grid_listing.py renders a 1.0
    checkpoint) written as a format-1.0 root like ``raw`` (its root as written): every
    chunk in the root's table, no parts (any part files left are debris), so no extension
    about parts and 11.3's ``merkle_root``."""
    paths = list(doc6["arrays"])
    entries = [doc6["arrays"][p] for p in paths]
    codecs: List[List[str]] = []
    rows = []
    for i, a in enumerate(entries):
        for c in a["chunks"]:
            pipeline = PIPELINE_OF[c["codec"]]
            if pipeline not in codecs:
                codecs.append(pipeline)
            rows.append({"array": i, "offset": c["offset"], "length": c["length"],
                         "source": (c.get("base"), c["file"]), "codec": codecs.index(pipeline),
                         "start": c["start"], "shape": c["shape"],
                         "crc": int(c["checksum"][7:], 16).to_bytes(4, "little"),
                         "hash": bytes.fromhex(c["hash"].split(":")[1])})
    sources = list(dict.fromkeys(r["source"] for r in rows))
    for r in rows:
        r["source"] = sources.index(r["source"])
    out = copy.deepcopy(raw)
    out["arrays"] = {"paths": paths, "dtypes": [a["dtype"] for a in entries],
                     "shapes": [a["shape"] for a in entries]}
    out.update(codecs=codecs or [[]], chunks=encode(rows, [list(s) for s in sources]),
               parts=[], merkle_root=doc6["merkle_root"])
    for name in ("part-ranks", "part-roots"):  # (extensions of parts: none left)
        out["extensions"].pop(name, None)
        for key in [k for k in out if k.startswith(name + ":")]:
            del out[key]
    return out


def part_bytes(table: Any) -> bytes:
    """A part file holding chunk table ``table`` (compact, as uckpt writes it)."""
    return dumps({"format": "uckpt-part", "format_version": "1.0", "chunks": table}).encode()


@st.composite
def table_edit(draw, table: Dict[str, Any], ndims: List[int], files: List[str]):
    """(description, new table, equivalent): one edit of a chunk table; ``equivalent``:
    the same chunks, differently written (must load exactly as saved)."""
    rows, sources = decode(table, ndims), copy.deepcopy(table["sources"])
    n = len(rows)
    kinds = ["count", "sources", "layout text", "digests text", "relevel"]
    if n:
        kinds += ["row"] * 4 + ["swap field", "drop row", "repeat row", "reorder rows",
                                "digest"]
    kind = draw(st.sampled_from(kinds))
    if kind == "count":
        new = dict(table, count=draw(st.sampled_from(
            [n + 1, n - 1, 0, 2**32, 10**18, -1, str(n), float(n), True, None])))
        return f"chunks.count {table['count']} -> {new['count']!r}", new, False
    if kind == "relevel":
        level = draw(st.sampled_from([0, 9]))
        return f"layout deflated at level {level}", encode(rows, sources, level), True
    if kind == "reorder rows":
        order = draw(st.permutations(range(n)))
        return f"rows reordered {order}", encode([rows[i] for i in order], sources), True
    if kind == "row":
        r = draw(st.integers(0, n - 1))
        d = len(rows[r]["start"])
        fields = ([name for name, _ in COLUMNS] + [f"start[{i}]" for i in range(d)]
                  + [f"shape[{i}]" for i in range(d)])
        name = draw(st.sampled_from(fields))
        if "[" in name:
            col, i = name[:5], int(name[6:-1])
            old = rows[r][col][i]
        else:
            old = rows[r][name]
        width = dict(COLUMNS).get(name, 8)  # (a value past the column's width wraps)
        value = draw(st.sampled_from(sorted({v % 2**(8 * width) for v in (
            old + 1, max(old - 1, 0), *ODD_VALUES)} - {old})))
        if "[" in name:
            rows[r][col][i] = value
        else:
            rows[r][name] = value
        return f"row {r} {name} {old} -> {value}", encode(rows, sources), False
    if kind == "swap field":
        a, b = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
        name = draw(st.sampled_from(["offset", "length", "start", "shape", "crc", "hash",
                                     "source", "codec"]))
        rows[a][name], rows[b][name] = rows[b][name], rows[a][name]
        return f"rows {a} and {b} swap {name}", encode(rows, sources), a == b
    if kind == "drop row":
        i = draw(st.integers(0, n - 1))
        del rows[i]
        return f"row {i} dropped", encode(rows, sources), False
    if kind == "repeat row":
        i = draw(st.integers(0, n - 1))
        rows.append(rows[i])
        return f"row {i} repeated", encode(rows, sources), False
    if kind == "digest":
        i, which = draw(st.integers(0, n - 1)), draw(st.sampled_from(["crc", "hash"]))
        b = draw(st.integers(0, len(rows[i][which]) - 1))
        d = bytearray(rows[i][which])
        d[b] ^= draw(st.integers(1, 255))
        rows[i][which] = bytes(d)
        return f"row {i} {which} byte {b} changed", encode(rows, sources), False
    if kind == "sources":
        how = draw(st.sampled_from(["swap", "drop", "repeat", "file", "base", "empty"]))
        if how == "swap" and len(sources) > 1:
            sources[0], sources[-1] = sources[-1], sources[0]
        elif how == "drop" and sources:
            sources.pop()
        elif how == "repeat" and sources:
            sources.append(sources[0])
        elif how == "file" and sources:
            sources[0] = [sources[0][0], draw(st.sampled_from(
                files + ["manifest.json", "manifest.part-00000.json", "../data-00000.bin",
                         "no-such.bin", "", 7]))]
        elif how == "base" and sources:
            sources[0] = [draw(st.sampled_from([None, "step_00000001", "step_99999999",
                                                "..", 0])), sources[0][1]]
        elif how == "empty":
            sources = []
        else:  # (what was drawn does not apply to these sources)
            how, sources = "unused pair added", sources + [[None, "extra.bin"]]
        return f"chunks.sources {how}: {sources!r}"[:160], dict(table, sources=sources), False
    if kind == "layout text":
        raw = layout_bytes(rows)
        how = draw(st.sampled_from(["truncated", "bad base64", "trailing bytes",
                                    "longer inflated", "shorter inflated", "preset dictionary",
                                    "raw deflate", "no padding", "not a string"]))
        text = table["layout"]
        if how == "truncated":
            text = text[:draw(st.integers(0, max(len(text) - 1, 0)))]
        elif how == "bad base64":
            i = draw(st.integers(0, len(text) - 1))
            text = text[:i] + draw(st.sampled_from(["!", "\n", "-", "é"])) + text[i + 1:]
        elif how == "trailing bytes":
            text = b64(zlib.compress(raw) + b"\x00junk")
        elif how == "longer inflated":
            text = b64(zlib.compress(raw + bytes(draw(st.sampled_from([1, 8, 1 << 20])))))
        elif how == "shorter inflated":
            text = b64(zlib.compress(raw[:-draw(st.integers(1, max(len(raw), 1)))]))
        elif how == "preset dictionary":
            c = zlib.compressobj(zdict=b"uckpt")
            text = b64(c.compress(raw) + c.flush())
        elif how == "raw deflate":
            c = zlib.compressobj(wbits=-15)
            text = b64(c.compress(raw) + c.flush())
        elif how == "no padding":
            text = text.rstrip("=")
        else:
            text = [text]
        return f"chunks.layout {how}", dict(table, layout=text), False
    how = draw(st.sampled_from(["truncated", "one row short", "bad base64", "longer",
                                "not a string"]))
    text = table["digests"]
    raw = base64.b64decode(text)
    text = {"truncated": text[:len(text) // 2], "one row short": b64(raw[:-20]),
            "bad base64": "*" + text[1:], "longer": b64(raw + bytes(20)),
            "not a string": 0}[how]
    return f"chunks.digests {how}", dict(table, digests=text), False


def _runs_edit(draw, runs, narrays):
    """(description, new runs): one edit of a part entry's ``arrays`` runs."""
    how = draw(st.sampled_from(["empty", "count 0", "past the end", "one more", "one less",
                                "split", "overlap", "unsorted", "not a list"]))
    runs = copy.deepcopy(runs)
    if how == "empty":
        runs = []
    elif how == "count 0":
        runs.append([narrays, 0])
    elif how == "past the end":
        runs = [[0, narrays + 1]]
    elif how == "one more":
        runs[-1][1] += 1
    elif how == "one less" and runs[-1][1] > 1:
        runs[-1][1] -= 1
    elif how == "split" and runs[0][1] > 1:
        runs[:1] = [[runs[0][0], 1], [runs[0][0] + 1, runs[0][1] - 1]]
    elif how == "overlap":
        runs.append(list(runs[0]))
    elif how == "unsorted" and len(runs) > 1:
        runs.reverse()
    else:  # (what was drawn does not apply to these runs)
        how, runs = "not a list", {"first": 0}
    return how, runs


EXTENSIONS = {
    "required extension": ({"x-fuzz": {"required": True}}, {}),
    "optional extension": ({"x-fuzz": {"required": False}}, {}),
    "optional extension with its member": ({"x-fuzz": {"required": False}}, {"x-fuzz:data": [1]}),
    "undeclared namespaced member": ({}, {"x-fuzz:data": 1}),
    "member of another extension": ({"x-fuzz": {"required": False}}, {"y:data": 1}),
    "bad extension name": ({"X_Fuzz": {"required": False}}, {}),
    "extension without required": ({"x-fuzz": {}}, {}),
    "required not a bool": ({"x-fuzz": {"required": 1}}, {}),
    "extension with an extra member": ({"x-fuzz": {"required": False, "v": 2}}, {}),
}


def _root_edit(draw, doc):
    """(description, equivalent) of an edit of root ``doc`` (in place) outside its tables."""
    region = draw(st.sampled_from(["codecs", "arrays", "extensions"]
                                  + ["parts"] * 2 * bool(doc["parts"])))
    if region == "codecs":
        old = doc["codecs"]
        how = draw(st.sampled_from(["reversed", "repeated", "unused added", "zstd first",
                                    "unknown codec", "empty list", "raw as zstd",
                                    "duplicate bytegroup"]))
        doc["codecs"] = {
            "reversed": old[::-1], "repeated": old + old[:1],
            "unused added": old + [p for p in ([], ["zstd"], ["bytegroup", "zstd"])
                                   if p not in old][:1],
            "zstd first": [["zstd", "bytegroup"] if p else p for p in old],
            "unknown codec": [["lz4"]] + old[1:], "empty list": [],
            "raw as zstd": [p or ["zstd"] for p in old],
            "duplicate bytegroup": [["bytegroup"] + p for p in old],
        }[how]
        same = how == "unused added" and len(doc["codecs"]) > len(old)
        return f"codecs {how}: {doc['codecs']}", same
    if region == "arrays":
        t = doc["arrays"]
        how = draw(st.sampled_from(["paths swapped", "dtype", "shape", "one dim more",
                                    "one short", "same path twice"]))
        n = len(t["paths"])
        if n and how == "paths swapped":
            t["paths"][0], t["paths"][-1] = t["paths"][-1], t["paths"][0]
        elif n and how == "dtype":
            t["dtypes"][0] = draw(st.sampled_from(["int8", "float64", "bfloat16", "bool", "u8"]))
        elif n and how == "shape" and t["shapes"][0]:
            t["shapes"][0][0] += draw(st.sampled_from([1, -1, 2**63]))
        elif n and how == "one dim more":
            t["shapes"][0].append(1)
        elif n and how == "same path twice":
            t["paths"][-1] = t["paths"][0]
        else:  # (also where what was drawn does not apply)
            how = "one short"
            for k in t:
                t[k] = t[k][:-1]
        return f"arrays: {how}", False
    if region == "extensions":
        how = draw(st.sampled_from(sorted(EXTENSIONS)))
        ext, members = EXTENSIONS[how]
        doc["extensions"] = copy.deepcopy(ext)
        doc.update(copy.deepcopy(members))
        return f"extensions: {how}", False
    parts = doc["parts"]
    k = draw(st.integers(0, len(parts) - 1))
    how = draw(st.sampled_from(["size", "checksum", "runs", "file", "dropped", "repeated",
                                "reordered", "extra member", "checksum form"]))
    e = parts[k]
    if how == "size":
        e["size"] = draw(st.sampled_from([e["size"] + 1, e["size"] - 1, 0, 2**63, -1]))
    elif how == "checksum":
        e["checksum"] = "crc32c:%08x" % (int(e["checksum"][7:], 16) ^ draw(st.integers(1, 255)))
    elif how == "checksum form":
        e["checksum"] = draw(st.sampled_from([e["checksum"].upper(), e["checksum"][7:],
                                              "crc32c:" + "0" * 9, None]))
    elif how == "runs":
        how, e["arrays"] = _runs_edit(draw, e["arrays"], len(doc["arrays"]["paths"]))
        how = f"runs {how}"
    elif how == "file":
        e["file"] = draw(st.sampled_from(["data-00000.bin", "manifest.json", "../" + e["file"],
                                          "manifest.part-00099.json", parts[-1 - k]["file"],
                                          "sub/" + e["file"], ""]))
    elif how == "dropped":
        del parts[k]
    elif how == "repeated":
        parts.append(copy.deepcopy(e))
    elif how == "reordered":
        parts.reverse()
    else:
        e["fuzz"] = 1
    return f"parts[{k}] {how}"[:160], how == "reordered" and len(parts) > 1


@st.composite
def edit_10(draw, source_raw: Dict[str, Any], directory: Path):
    """(description, root text, {part file: new bytes}, equivalent): one edit of format-1.0
    root ``source_raw`` (as written, less its checksum) or of one of its parts (read from
    ``directory``), the root's entry of an edited part updated to its new size and
    checksum."""
    doc = copy.deepcopy(source_raw)
    ndims = [len(s) for s in doc["arrays"]["shapes"]]
    files = sorted(doc["files"])
    tables = ["root"] * bool(doc["chunks"]["count"]) + [e["file"] for e in doc["parts"]]
    where = draw(st.sampled_from(["root fields"] + tables + tables))
    if where == "root fields":
        desc, same = _root_edit(draw, doc)
        return desc, dumps(doc).encode(), {}, same
    if where == "root":
        desc, doc["chunks"], same = draw(table_edit(doc["chunks"], ndims, files))
        return f"root {desc}", dumps(doc).encode(), {}, same
    part = json.loads((directory / where).read_bytes())
    desc, part["chunks"], same = draw(table_edit(part["chunks"], ndims, files))
    data = part_bytes(part["chunks"])
    entry = next(e for e in doc["parts"] if e["file"] == where)
    entry["size"], entry["checksum"] = len(data), "crc32c:%08x" % crc32c.crc32c(data)
    return f"{where} {desc}", dumps(doc).encode(), {where: data}, same
