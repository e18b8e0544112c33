"""Make the golden checkpoints of format 1.0 in tests/data/golden_1.0/.

    .venv/bin/python tests/data/make_golden.py            # refuses to replace existing files
    .venv/bin/python tests/data/make_golden.py --force    # only when the format version changes
    .venv/bin/python tests/data/make_golden.py --add part_roots   # one added later, if absent
    .venv/bin/python tests/data/make_golden.py --add redundancy_xor

Golden files pin the on-disk format: tests/test_format.py loads them, re-saves
the same state and requires byte-identical data files. Never regenerate them to
make a failing test pass; a change in the bytes is a format change, which needs
a new format version (docs/format.md, "Versioning") and a new golden_vN folder.

tests/data/golden_1.0/ holds the five checkpoints below in format 1.0. ``all_types``,
``example`` and ``chain`` are written by ``uckpt.save`` with the same knobs as the
pre-release versions' (so their data files are identical to golden_v6's); ``sharded``
and ``codecs`` are golden_v6's (hand-written) data files with their manifests written
as 1.0 by :func:`write_as_1_0`: ``sharded`` (world size 2) as a root and two parts.
``part_roots`` (added with extension ``part-roots``, docs/format.md 13.2, after the
others, by ``--add part_roots``) is written by ``uckpt.save`` on two thread ranks
(:func:`write_part_roots`): a sharded array in one part per rank, a replicated one in
the root's rows. ``redundancy_xor`` and ``redundancy_partner`` (added with extension
``redundancy``, docs/format.md 13.3, by ``--add``) are written by ``uckpt.save`` on four
thread ranks, their pieces made from the section's words (:func:`write_redundancy`).
The pre-release folders below are never made again (their writers are kept where the
tests reproduce them by hand: ``write_sharded``, ``write_codecs``).

tests/data/golden_v6/ holds the same five checkpoints in format version 6, made by this
script when uckpt wrote version 6, and never made again.

tests/data/golden_v5/ holds the same five checkpoints in format version 5, made by this
script when uckpt wrote version 5, and never made again: version 6 only lists arrays stored
whole as rows of a ``table`` (docs/format.md section 16; ``all_types`` is written with
``table_min_arrays = 1``, so all its whole arrays are rows), so their data files are
identical to golden_v6's, and so are the manifests of ``example`` (three arrays: no table),
``chain``, ``sharded`` and ``codecs`` but for ``format_version``, the metadata's
``purpose`` and the checksum.

tests/data/golden_v4/ holds the same five checkpoints in format version 4, made by this
script when uckpt wrote version 4, and never made again: version 5 only lists evenly cut
arrays as a ``grid`` (docs/format.md section 15), so their data files are identical to
golden_v5's, and so are the manifests of ``sharded`` and ``codecs`` (written by hand with
chunk lists) but for ``format_version``, the metadata's ``purpose`` and the checksum.

tests/data/golden_v3/ holds ``all_types``, ``example``, ``sharded`` and ``codecs`` in
format version 3, made by this script when uckpt wrote version 3, and never made again:
version 4 adds content hashes, Merkle roots and ``bases``, so their data files are
identical to golden_v4's.

tests/data/golden_v2/ holds ``all_types``, ``example`` and ``sharded`` in format
version 2, made by this script when uckpt wrote version 2 (uckpt 0.2.0) and never made
again: version 3 only adds codecs, so their data files are identical to golden_v3's and
their manifests differ in ``format_version``, ``created``, ``generator``, the
metadata's ``purpose`` and the checksum.

tests/data/golden_v1/ holds the same three checkpoints in format version 1.
They were made by this script when uckpt wrote version 1 (uckpt 0.1.0) and are
never made again: version 1 is version 2 without the manifest checksum, so
their data files are identical to golden_v2's and their manifests differ only
in ``format_version``, ``created``, ``generator``, the metadata's ``purpose``
and the missing checksum member. ``write_manifest(..., version=1)`` and
``write_sharded(..., version=1)`` still write version-1 manifests the way they
were written (the tests check that golden_v1/sharded is reproduced exactly).

Both versions' manifests are indented for people to read (whitespace carries no
meaning in JSON; uckpt itself writes them compact). A version-2 manifest's
checksum covers its exact bytes, so :func:`write_manifest` seals the indented
text by the rule of docs/format.md section 4.4, implemented here by hand (with
``crc32c`` only) rather than by uckpt: an independent check of uckpt's reader.

Five checkpoints are made:

``all_types``  written by ``uckpt.save`` from :func:`golden_state` with the
               knobs in :data:`KNOBS`: every node type, every dtype, and an
               array split into several chunks.
``example``    the worked example of docs/format.md (:func:`example_state`).
``chain``      (versions 4 and 5) two checkpoints side by side: ``step_00000001`` saved
               with ``incremental=True``, and ``step_00000002`` saved with
               ``base=step_00000001``: one chunk changed, the others refer to the
               base's data file.
``sharded``    written by hand (NumPy, json, crc32c and xxhash only, no uckpt writer;
               the Merkle roots computed by :func:`merkle_roots`, written here from
               docs/format.md section 14.3):
               two files as if from two ranks, one array cut into 2-D boxes,
               chunks packed at offsets that are not multiples of 64 and listed
               out of file order. uckpt's single-process writer cannot write
               such a checkpoint but must read it; so must any reader following
               the spec.
``codecs``     written by hand (NumPy, json, crc32c, zstandard and xxhash, no uckpt code):
               every codec of version 3 (docs/format.md section 6.3): ``zstd``,
               ``zstd+bytegroup`` and ``raw`` chunks, one array mixing two codecs.
"""
from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

HERE = Path(__file__).resolve().parent
VERSION = "1.0"
GOLDEN = HERE / f"golden_{VERSION}"
LEGACY = 6  # the last pre-release version (golden_v6, never regenerated)
GOLDEN_V6 = HERE / "golden_v6"  # never regenerated
GOLDEN_V1 = HERE / "golden_v1"  # never regenerated
GOLDEN_V2 = HERE / "golden_v2"  # never regenerated
GOLDEN_V3 = HERE / "golden_v3"  # never regenerated
GOLDEN_V4 = HERE / "golden_v4"  # never regenerated
GOLDEN_V5 = HERE / "golden_v5"  # never regenerated

#: knob values the golden checkpoints are written with (re-saves in tests use the same)
KNOBS = {"chunk_bytes": 256, "alignment": 64}
EXAMPLE_KNOBS = {"chunk_bytes": 8, "alignment": 64}
CHAIN_KNOBS = {"incremental_chunk_bytes": 16, "alignment": 64}
STEP = 42


def metadata(version=VERSION):
    """The user metadata of the golden ``all_types`` checkpoint of ``version``."""
    return {"purpose": f"golden checkpoint of uckpt format version {version}",
            "nested": {"list": [1, 2.5, None, True, "x"]}}


METADATA = metadata()


class Counter:
    """A stateful object (``state_dict``/``load_state_dict``): saved as an "object" node."""

    def __init__(self) -> None:
        self.count = 3
        self.history = np.array([5, 8, 13], dtype=np.int64)

    def state_dict(self):
        return {"count": self.count, "history": self.history}

    def load_state_dict(self, sd) -> None:
        self.count = sd["count"]
        self.history = np.array(sd["history"])


# a stable class name in the manifest, however this file is imported
Counter.__module__ = "golden"
Counter.__qualname__ = "Counter"


def _bits(values, dtype, bits):
    """An array of ``dtype`` from raw bit patterns (keeps NaN payloads exact)."""
    return np.array(values, dtype=bits).view(dtype)


def golden_state():
    """The state saved as golden_v1/all_types (a fresh, equal object on every call)."""
    bf16 = ml_dtypes.bfloat16
    shared = np.array([1.5, -2.25, 3.0], dtype=np.float64)
    return {
        "dtypes": {
            "bool": np.array([[True, False, True], [False, False, True]]),
            "int8": np.array([-128, -1, 0, 127], dtype=np.int8),
            "int16": np.array([-32768, -2, 2, 32767], dtype=np.int16),
            "int32": np.array([-2 ** 31, -3, 3, 2 ** 31 - 1], dtype=np.int32),
            "int64": np.array([-2 ** 63, -1, 0, 2 ** 63 - 1], dtype=np.int64),
            "uint8": np.arange(0, 256, 37, dtype=np.uint8),
            "uint16": np.array([0, 1, 0xBEEF, 0xFFFF], dtype=np.uint16),
            "uint32": np.array([0, 1, 0xDEADBEEF, 0xFFFFFFFF], dtype=np.uint32),
            "uint64": np.array([0, 1, 0x0123456789ABCDEF, 2 ** 64 - 1], dtype=np.uint64),
            "float16": np.array([1.0, -2.0, 65504.0, 2.0 ** -24, np.inf, np.nan], dtype=np.float16),
            # 0, -0, 1, -1.5, max, smallest subnormal, quiet NaN, a NaN with a payload, -inf
            "float32": _bits([0x00000000, 0x80000000, 0x3F800000, 0xBFC00000, 0x7F7FFFFF,
                              0x00000001, 0x7FC00000, 0x7FA00001, 0xFF800000],
                             np.float32, np.uint32),
            "float64": np.array([[math.pi, -math.e], [1e-300, -0.0]], dtype=np.float64),
            "complex64": np.array([1 + 2j, -0.5 - 0.25j], dtype=np.complex64),
            "complex128": np.array([[1e100 - 1j]], dtype=np.complex128),
            "bfloat16": np.array([1.0, -3.140625, 2.0 ** -133, np.inf], dtype=bf16),
            "float8_e4m3fn": np.array([1.0, -0.5, 448.0, np.nan], dtype=ml_dtypes.float8_e4m3fn),
            "float8_e5m2": np.array([1.0, -0.5, 57344.0, -np.inf], dtype=ml_dtypes.float8_e5m2),
        },
        "zero_d": np.array(-7, dtype=np.int32),
        "empty": np.zeros((0, 3), dtype=np.float32),
        "scalars": {"f32": np.float32(2.5), "i16": np.int16(-3), "b": np.bool_(True)},
        "blob": b"\x00uckpt\xff",
        "empty_blob": b"",
        "floats": {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "pi": 3.14159,
                   "neg_zero": -0.0, "tiny": 5e-324},
        "values": {"int": 42, "negative": -7, "big": 2 ** 70, "str": "h\u00e9llo \u2713",
                   "none": None, "true": True, "false": False},
        "by_epoch": {0: "start", 10: np.array([0.1, 0.01], dtype=np.float32), -1: "last"},
        "pair": (1, ("two", np.arange(3, dtype=np.int8))),
        "history": [1.0, [2, {"deep": {"deeper": {"deepest": np.ones(2, dtype=np.uint8)}}}], []],
        "empty_dict": {},
        "weird/key~name": {"a/b": np.array([1, 2], dtype=np.int64), "~0": 5, "": "empty key"},
        "shared": shared,
        "tied": {"again": shared},  # the same array twice: stored once, referred to twice
        "big": np.arange(160, dtype=np.float32).reshape(40, 4) * 0.5,  # 640 bytes: 3 chunks
        "counter": Counter(),
    }


def expected_loaded(state):
    """What ``uckpt.load`` returns for ``state``: objects become their extracted state."""
    if isinstance(state, Counter):
        return expected_loaded(state.state_dict())
    if isinstance(state, dict):
        return {k: expected_loaded(v) for k, v in state.items()}
    if isinstance(state, list):
        return [expected_loaded(v) for v in state]
    if isinstance(state, tuple):
        return tuple(expected_loaded(v) for v in state)
    return state


def example_state():
    """The worked example of docs/format.md (saved with EXAMPLE_KNOBS, step=7)."""
    return {
        "model": {"w": np.array([[1.0, -2.0], [0.5, 0.25]], dtype=np.float32),
                  "b": np.array([1.0, -1.5], dtype=ml_dtypes.bfloat16)},
        "epoch": 3,
        "lr": math.inf,
        "tag": b"hi",
    }


def sharded_expected():
    """The arrays of golden_v1/sharded, as NumPy arrays."""
    return {"layer/weight": np.arange(24, dtype=np.float32).reshape(4, 6) - 11.5,
            "layer/bias": np.array([1, -1, 2, -2, 3, -3], dtype=np.int16)}


def write_manifest(path: Path, doc, version=VERSION) -> None:
    """Write the manifest ``doc`` (without a checksum member) as the golden files hold
    it: indented; for version 2 ended by its checksum member (docs/format.md 4.4): the
    CRC-32C of every byte before the checksum's value."""
    import crc32c

    doc = dict(doc, format_version=version)
    text = json.dumps(doc, indent=1, ensure_ascii=False, allow_nan=False)
    if version == 1:
        data = (text + "\n").encode("utf-8")
    else:
        assert text.endswith("\n}")
        covered = (text[:-2] + ',\n "manifest_checksum":').encode("utf-8")
        data = covered + b'"crc32c:%08x"}\n' % crc32c.crc32c(covered)
    path.write_bytes(data)


def write_sharded(directory: Path, version: int = LEGACY) -> None:
    """A checkpoint as two ranks of a tensor-parallel job could write it (by hand)."""
    import crc32c
    import xxhash

    arrays = sharded_expected()
    # (file, offset, array, start, shape): weight cut into four 2x3 boxes, rank 0 owns the
    # left column of boxes, rank 1 the right one; bias whole on rank 1. Chunks are packed
    # (offsets are multiples of 8, not 64) and listed out of file order on purpose.
    pieces = [
        ("data-00001.bin", 24, "layer/weight", (0, 3), (2, 3)),
        ("data-00000.bin", 0, "layer/weight", (0, 0), (2, 3)),
        ("data-00000.bin", 24, "layer/weight", (2, 0), (2, 3)),
        ("data-00001.bin", 48, "layer/weight", (2, 3), (2, 3)),
        ("data-00001.bin", 0, "layer/bias", (0,), (6,)),
    ]
    files = {"data-00000.bin": bytearray(48), "data-00001.bin": bytearray(72)}
    entries = {p: {"dtype": {"layer/weight": "float32", "layer/bias": "int16"}[p],
                   "shape": list(a.shape), "chunks": []} for p, a in arrays.items()}
    for file, offset, path, start, shape in pieces:
        box = tuple(slice(s, s + n) for s, n in zip(start, shape))
        raw = np.ascontiguousarray(arrays[path][box]).astype(arrays[path].dtype.newbyteorder("<"))
        data = raw.tobytes(order="C")
        files[file][offset:offset + len(data)] = data
        entries[path]["chunks"].append({
            "file": file, "offset": offset, "length": len(data), "start": list(start),
            "shape": list(shape), "codec": "raw", "checksum": f"crc32c:{crc32c.crc32c(data):08x}"})
        if version >= 4:
            entries[path]["chunks"][-1]["hash"] = "xxh3-128:" + xxhash.xxh3_128_hexdigest(data)
    leaf = {"type": "array"}
    manifest = {
        "format": "uckpt", "format_version": version, "generator": "hand-written (make_golden.py)",
        "created": "2025-01-01T00:00:00.000000Z", "world_size": 2, "step": 1000,
        "metadata": {"parallelism": "2-way tensor parallel"},
        "files": {name: {"rank": int(name[5:10]), "size": len(data)}
                  for name, data in files.items()},
        "tree": {"type": "dict", "items": {"layer": {"type": "dict", "items": {
            "weight": dict(leaf, path="layer/weight"), "bias": dict(leaf, path="layer/bias")}}}},
        "arrays": entries,
    }
    if version >= 4:
        add_merkle_roots(manifest)
    directory.mkdir(parents=True)
    for name, data in files.items():
        (directory / name).write_bytes(bytes(data))
    write_manifest(directory / "manifest.json", manifest, version)


def codecs_expected():
    """The arrays of golden_v3/codecs, as NumPy arrays."""
    x = np.linspace(-1.0, 1.0, 512, dtype=np.float32)
    return {
        "weights": (np.round(x * 64) / 64).reshape(64, 8),  # chunks: bytegroup, then zstd
        "bf16": np.round(np.linspace(-4, 4, 256)).astype(ml_dtypes.bfloat16),
        "ids": np.arange(100, dtype=np.int64) * 3,
        "mask": np.arange(200) % 7 == 0,
        "c64": (np.arange(32) % 4 + 1j * (np.arange(32) % 2)).astype(np.complex64),
        "noise": np.frombuffer(bytes(range(7, 256, 3)), dtype=np.uint8).copy(),  # stays raw
    }


#: how golden_v3/codecs stores its arrays: (path, rows of each chunk, codec of each chunk)
CODECS_LAYOUT = [("weights", (32, 32), ("zstd+bytegroup", "zstd")),
                 ("bf16", (256,), ("zstd+bytegroup",)), ("ids", (100,), ("zstd",)),
                 ("mask", (200,), ("zstd",)), ("c64", (32,), ("zstd+bytegroup",)),
                 ("noise", (83,), ("raw",))]


def write_codecs(directory: Path, version: int = LEGACY) -> None:
    """A checkpoint of every codec, encoded by hand (docs/format.md section 6.3)."""
    import crc32c
    import xxhash
    import zstandard

    arrays = codecs_expected()
    data, entries = bytearray(), {}
    for path, rows, codecs in CODECS_LAYOUT:
        arr = arrays[path]
        dtype = {"bool": "bool"}.get(arr.dtype.name, arr.dtype.name)
        entries[path] = {"dtype": dtype, "shape": list(arr.shape), "chunks": []}
        data += bytes(-len(data) % 64)  # each array starts at a multiple of 64
        first = 0
        for n, codec in zip(rows, codecs):
            box = np.ascontiguousarray(arr[first:first + n])
            raw = box.view(np.uint8).reshape(-1)
            k = arr.dtype.itemsize
            if codec == "raw":
                stored = raw.tobytes()
            else:
                content = raw.reshape(-1, k).T.tobytes() if codec == "zstd+bytegroup" else raw.tobytes()
                stored = zstandard.ZstdCompressor(level=3, write_content_size=True).compress(content)
                assert len(stored) < raw.nbytes, (path, codec)
            entries[path]["chunks"].append({
                "file": "data-00000.bin", "offset": len(data), "length": len(stored),
                "start": [first] + [0] * (arr.ndim - 1), "shape": list(box.shape),
                "codec": codec, "checksum": f"crc32c:{crc32c.crc32c(stored):08x}"})
            if version >= 4:  # the content hash is of the raw bytes, whatever the codec
                entries[path]["chunks"][-1]["hash"] = "xxh3-128:" + xxhash.xxh3_128_hexdigest(raw)
            data += stored
            first += n
    manifest = {
        "format": "uckpt", "format_version": version, "generator": "hand-written (make_golden.py)",
        "created": "2026-01-01T00:00:00.000000Z", "world_size": 1, "step": 5,
        "metadata": {"codecs": "zstd, zstd+bytegroup and raw"},
        "files": {"data-00000.bin": {"rank": 0, "size": len(data)}},
        "tree": {"type": "dict", "items": {p: {"type": "array", "path": p} for p in arrays}},
        "arrays": entries,
    }
    if version >= 4:
        add_merkle_roots(manifest)
    directory.mkdir(parents=True)
    (directory / "data-00000.bin").write_bytes(bytes(data))
    write_manifest(directory / "manifest.json", manifest, version)


def merkle_roots(entries):
    """The arrays' Merkle roots and the checkpoint's, of array entries holding chunks with
    hashes (docs/format.md section 14.3; written from the spec, not taken from uckpt)."""
    import struct

    import xxhash

    def h(data):
        return xxhash.xxh3_128_digest(data)

    def tree(nodes):
        while len(nodes) > 1:
            pairs = [h(b"\x01" + nodes[i] + nodes[i + 1]) for i in range(0, len(nodes) - 1, 2)]
            nodes = pairs + ([nodes[-1]] if len(nodes) % 2 else [])
        return nodes[0] if nodes else b""

    def u64(values):
        return b"".join(struct.pack("<Q", v) for v in values)

    roots = {}
    for path, entry in entries.items():
        chunks = sorted(chunk_list(entry), key=lambda c: c["start"])
        leaves = [h(b"\x00" + struct.pack("<I", len(c["start"])) + u64(c["start"]) +
                    u64(c["shape"]) + bytes.fromhex(c["hash"][9:])) for c in chunks]
        roots[path] = h(b"\x02" + entry["dtype"].encode() + b"\x00" +
                        struct.pack("<I", len(entry["shape"])) + u64(entry["shape"]) +
                        u64([len(leaves)]) + tree(leaves))
    leaves = [h(b"\x03" + u64([len(p.encode())]) + p.encode() + roots[p])
              for p in sorted(roots, key=lambda p: p.encode())]
    top = h(b"\x04" + u64([len(leaves)]) + tree(leaves))
    return {p: "xxh3-128:" + r.hex() for p, r in roots.items()}, "xxh3-128:" + top.hex()


def chunk_list(entry):
    """The chunk objects of an array entry: its ``chunks``, or those its version-5 ``grid``
    lists (decoded from docs/format.md section 15 with base64, zlib and NumPy only, not
    taken from uckpt; a ``base`` member only where the source names one)."""
    import base64
    import zlib

    if "grid" not in entry:
        return entry["chunks"]
    g, shape = entry["grid"], entry["shape"]
    n, axis, rows = g["count"], g["axis"], g["rows"]
    digests = base64.b64decode(g["digests"], validate=True)
    inflated = zlib.decompress(base64.b64decode(g["layout"], validate=True))
    assert len(inflated) == 21 * n and len(digests) == 20 * n

    def column(start, width):
        planes = np.frombuffer(inflated, np.uint8, width * n, start).reshape(width, n)
        return [sum(int(planes[j][k]) << (8 * j) for j in range(width)) for k in range(n)]

    offset, length = column(0, 8), column(8 * n, 8)
    source, codec = column(16 * n, 4), column(20 * n, 1)
    crcs = np.frombuffer(digests, "<u4", n)
    out = []
    for k in range(n):
        start = [0] * len(shape)
        start[axis] = k * rows
        box = list(shape)
        box[axis] = min(rows, shape[axis] - k * rows)
        base, file = g["sources"][source[k]]
        chunk = {"file": file, "offset": offset[k], "length": length[k], "start": start,
                 "shape": box, "codec": ["raw", "zstd", "zstd+bytegroup"][codec[k]],
                 "checksum": f"crc32c:{int(crcs[k]):08x}",
                 "hash": "xxh3-128:" + digests[4 * n + 16 * k:4 * n + 16 * k + 16].hex()}
        if base is not None:
            chunk["base"] = base
        out.append(chunk)
    return out


def table_entries(doc):
    """The array entries (with ``chunks``, without ``root``) that a version-6 ``table``
    lists, by path (docs/format.md section 16: its columns are a grid's, one chunk a row,
    covering its array; decoded by :func:`chunk_list`, not by uckpt)."""
    t = doc.get("table")
    if t is None:
        return {}
    n = len(t["paths"])
    rows = chunk_list({"shape": [n], "grid": dict(t, count=n, axis=0, rows=1)})
    return {path: {"dtype": dtype, "shape": shape,
                   "chunks": [dict(c, start=[0] * len(shape), shape=shape)]}
            for path, dtype, shape, c in zip(t["paths"], t["dtypes"], t["shapes"], rows)}


def add_merkle_roots(manifest) -> None:
    """Complete a version-4 manifest document: arrays' roots, ``bases`` (none) and the
    checkpoint's root."""
    roots, top = merkle_roots(manifest["arrays"])
    for path, root in roots.items():
        manifest["arrays"][path]["root"] = root
    manifest.update(bases={}, merkle_root=top)


def chain_states():
    """The two states of the golden ``chain``: the second changes one 16-byte row."""
    first = {"w": np.arange(16, dtype=np.float32).reshape(4, 4), "step": 1}
    second = {"w": first["w"].copy(), "step": 2}
    second["w"][2, 1] = -1.0
    return first, second


def options_and_knobs(knob_values):
    """Split ``knob_values`` into the ``uckpt.SaveOptions`` of its layout fields and the
    rest (``uckpt.knobs`` attributes)."""
    import dataclasses

    import uckpt

    fields = {f.name for f in dataclasses.fields(uckpt.SaveOptions)}
    return (uckpt.SaveOptions(**{k: v for k, v in knob_values.items() if k in fields}),
            {k: v for k, v in knob_values.items() if k not in fields})


def save_with_knobs(directory, state, knob_values, **kw):
    """``uckpt.save`` with ``knob_values`` (SaveOptions fields passed as options, knobs set
    for the call and restored after); the manifest is then re-written indented
    (``write_manifest``)."""
    import uckpt
    import uckpt.knobs as knobs

    options, knob_values = options_and_knobs(knob_values)
    old = {k: getattr(knobs, k) for k in knob_values}
    try:
        for k, v in knob_values.items():
            setattr(knobs, k, v)
        path = uckpt.save(directory, state, options=options, **kw)
    finally:
        for k, v in old.items():
            setattr(knobs, k, v)
    manifest = json.loads((path / "manifest.json").read_text("utf-8"))
    assert manifest.pop("manifest_checksum") and manifest["format_version"] == VERSION
    write_manifest(path / "manifest.json", manifest)
    return path


PART_ROOTS_ROWS = 6


def part_roots_state(rank: int, world: int):
    """Rank ``rank``'s state of golden_1.0/part_roots: its rows of a sharded array, and a
    replicated one (and a step)."""
    import uckpt

    w = np.arange(PART_ROOTS_ROWS * 4, dtype=np.float32).reshape(PART_ROOTS_ROWS, 4) - 7.5
    lo, hi = rank * PART_ROOTS_ROWS // world, (rank + 1) * PART_ROOTS_ROWS // world
    return {"w": uckpt.Shard(w[lo:hi].copy(), w.shape, (lo, 0)),
            "b": np.array([0.5, -1.0, 2.0], dtype=np.float64), "epoch": 9}


def part_roots_expected():
    """What golden_1.0/part_roots loads to (in one process)."""
    whole = part_roots_state(0, 1)
    return {"w": whole["w"].array, "b": whole["b"], "epoch": 9}


def write_part_roots(directory: Path) -> None:
    """golden_1.0/part_roots: saved by two thread ranks (a root with the replicated array's
    row, one part per rank, extension part-roots), the root re-written indented."""
    import uckpt
    from uckpt.testing import run_ranks

    outcomes = run_ranks(2, lambda c: uckpt.save(directory, part_roots_state(c.rank, 2),
                                                 comm=c, step=11))
    assert not any(isinstance(o, BaseException) for o in outcomes), outcomes
    manifest = json.loads((directory / "manifest.json").read_text("utf-8"))
    assert manifest.pop("manifest_checksum") and "part-roots" in manifest["extensions"]
    write_manifest(directory / "manifest.json", manifest)


#: golden_1.0/redundancy_*: four ranks on three nodes, their rows of a sharded array cut
#: unevenly (4, 3, 2, 1 of 10)
REDUNDANCY_CUTS = (0, 4, 7, 9, 10)
REDUNDANCY_NODES = (("node-a", (0, 1)), ("node-b", (2,)), ("node-c", (3,)))


def redundancy_state(rank: int):
    """Rank ``rank``'s state of golden_1.0/redundancy_*: its rows of a sharded array and a
    replicated one."""
    import uckpt

    w = np.arange(10 * 6, dtype=np.int32).reshape(10, 6) * 3 - 50
    lo, hi = REDUNDANCY_CUTS[rank], REDUNDANCY_CUTS[rank + 1]
    return {"w": uckpt.Shard(w[lo:hi].copy(), w.shape, (lo, 0)),
            "b": np.array([1.5, -2.0, 0.25], dtype=np.float32)}


def redundancy_expected():
    """What golden_1.0/redundancy_* load to."""
    return {"w": np.arange(10 * 6, dtype=np.int32).reshape(10, 6) * 3 - 50,
            "b": np.array([1.5, -2.0, 0.25], dtype=np.float32)}


def write_redundancy(directory: Path, scheme: str) -> None:
    """golden_1.0/redundancy_<kind>: saved by four thread ranks, then declared extension
    ``redundancy`` (docs/format.md 13.3) on three nodes: the pieces computed straight from
    the section (whole shares, plain NumPy: tests/redundancy_common.spec_pieces), every
    node's share and piece in the one directory, the root re-written indented."""
    import uckpt
    from uckpt.codecs.checksum import of
    from uckpt.testing import run_ranks

    sys.path.insert(0, str(HERE.parent))
    from redundancy_common import spec_pieces

    outcomes = run_ranks(4, lambda c: uckpt.save(directory, redundancy_state(c.rank),
                                                 comm=c, step=5))
    assert not any(isinstance(o, BaseException) for o in outcomes), outcomes
    doc = json.loads((directory / "manifest.json").read_text("utf-8"))
    assert doc.pop("manifest_checksum")
    part_rank = dict(zip([p["file"] for p in doc["parts"]], doc["part-ranks:ranks"]))
    nodes, shares = [], []
    for name, ranks in REDUNDANCY_NODES:
        files = sorted(f for f, e in doc["files"].items() if e["rank"] in ranks)
        files += [p for p, r in part_rank.items() if r in ranks]
        data = [(directory / f).read_bytes() for f in files]
        nodes.append({"name": name, "ranks": list(ranks),
                      "files": [{"name": f, "size": len(b), "checksum": of(b)}
                                for f, b in zip(files, data)]})
        shares.append(b"".join(data))
    kind, _, g = scheme.partition(":")
    for i, (node, piece) in enumerate(zip(nodes, spec_pieces(kind, int(g or 2), shares))):
        (directory / f"redundancy-{i:05d}.bin").write_bytes(piece)
        node["piece"] = {"name": f"redundancy-{i:05d}.bin", "size": len(piece),
                         "checksum": of(piece)}
    doc["extensions"]["redundancy"] = {"required": False}
    at = list(doc).index("manifest_checksum") if "manifest_checksum" in doc else len(doc)
    items = list(doc.items())[:at] + [("redundancy:scheme", scheme), ("redundancy:nodes", nodes)]
    write_manifest(directory / "manifest.json", dict(items))


#: checkpoints added to golden_1.0 after it was made (``--add NAME``), each made once
ADDED = {"part_roots": write_part_roots,
         "redundancy_xor": lambda d: write_redundancy(d, "xor:3"),
         "redundancy_partner": lambda d: write_redundancy(d, "partner")}


def write_as_1_0(legacy: Path, directory: Path) -> None:
    """Checkpoint ``legacy`` (pre-release) with its manifest written as format 1.0 by
    uckpt's writer: the same data files; parts (compact) as written, the root indented."""
    from uckpt.format import Manifest
    from uckpt.format import encode_manifest_files, parse_manifest

    directory.mkdir(parents=True)
    m = parse_manifest((legacy / "manifest.json").read_bytes())
    for name in m.files:
        shutil.copyfile(legacy / name, directory / name)
    root, parts = encode_manifest_files(m)
    for name, data in parts:
        (directory / name).write_bytes(data)
    doc = json.loads(root)
    assert doc.pop("manifest_checksum")
    write_manifest(directory / "manifest.json", doc)


def main(argv) -> int:
    force = "--force" in argv
    if "--add" in argv:
        name = argv[argv.index("--add") + 1]
        if (GOLDEN / name).exists():
            print(f"{GOLDEN / name} exists; golden files are never regenerated",
                  file=sys.stderr)
            return 1
        ADDED[name](GOLDEN / name)
        return 0
    if GOLDEN.exists():
        if not force:
            print(f"{GOLDEN} exists; golden files are never regenerated for a released "
                  "format version (pass --force if you really mean it)", file=sys.stderr)
            return 1
        shutil.rmtree(GOLDEN)
    GOLDEN.mkdir(parents=True)
    save_with_knobs(GOLDEN / "all_types", golden_state(), KNOBS, step=STEP, metadata=metadata())
    save_with_knobs(GOLDEN / "example", example_state(), EXAMPLE_KNOBS, step=7)
    first, second = chain_states()
    save_with_knobs(GOLDEN / "chain" / "step_00000001", first, CHAIN_KNOBS, step=1,
                    incremental=True)
    save_with_knobs(GOLDEN / "chain" / "step_00000002", second, CHAIN_KNOBS, step=2,
                    base=GOLDEN / "chain" / "step_00000001")
    write_as_1_0(GOLDEN_V6 / "sharded", GOLDEN / "sharded")
    write_as_1_0(GOLDEN_V6 / "codecs", GOLDEN / "codecs")
    for name, write in ADDED.items():
        write(GOLDEN / name)
    for p in sorted(GOLDEN.rglob("*")):
        if p.is_file():
            print(f"{p.stat().st_size:6d}  {p.relative_to(HERE)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
