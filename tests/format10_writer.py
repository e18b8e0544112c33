"""An independent writer of format 1.0, built from docs/format.md alone (not from uckpt's code).

It uses NumPy, json, zlib and base64, plus the ``crc32c``, ``xxhash`` and (for compressed
pipelines) ``zstandard`` packages for the checksums, content hashes and frames the spec names.
Tests build small 1.0 checkpoints with it by hand and check that readers (the reference reader
of docs/format.md, and uckpt) read them back:

    expected = build("sharded", tmp_path / "c")   # {array path: what the reference reader gives}

``expected`` holds each array as the reference reader returns it: ``bfloat16`` widened to
``float32``, the float8 types as their ``uint8`` bits, every other dtype as itself.
Lower-level pieces (:class:`Checkpoint`, :func:`chunk_table`, :func:`seal`) let a test build a
damaged variant.
"""
from __future__ import annotations

import base64
import json
import struct
import zlib
from pathlib import Path

import crc32c as _crc32c
import numpy as np
import xxhash

#: section 10: dtype -> NumPy type of its bytes (bfloat16 and float8 as their bits)
BITS = {"bool": "|b1", "int8": "|i1", "int16": "<i2", "int32": "<i4", "int64": "<i8",
        "uint8": "|u1", "uint16": "<u2", "uint32": "<u4", "uint64": "<u8", "float16": "<f2",
        "float32": "<f4", "float64": "<f8", "complex64": "<c8", "complex128": "<c16",
        "bfloat16": "<u2", "float8_e4m3fn": "|u1", "float8_e5m2": "|u1"}
PIPELINES = ((), ("zstd",), ("bytegroup", "zstd"))
KINDS = ("example", "all_types", "codecs", "sharded", "chain", "ext_optional", "ext_required",
         "part_roots")


def crc32c(data: bytes) -> int:
    return _crc32c.crc32c(data)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def planes(values, width: int) -> bytes:
    """``values`` as ``width`` byte planes: byte 0 of every value, then byte 1, ..."""
    a = np.asarray(values, dtype="<u8").reshape(-1)
    return a.view(np.uint8).reshape(-1, 8)[:, :width].T.tobytes()


def encode(raw: bytes, pipeline, itemsize: int) -> bytes:
    """The stored bytes of a chunk: ``pipeline`` applied to its raw bytes (section 5)."""
    for codec in pipeline:
        if codec == "bytegroup":
            raw = np.frombuffer(raw, np.uint8).reshape(-1, itemsize).T.tobytes()
        else:
            import zstandard
            raw = zstandard.ZstdCompressor(level=3, write_content_size=True).compress(raw)
    return raw


def chunk_table(rows, ndims, level: int = 1) -> dict:
    """A chunk table of ``rows`` (dicts: array, offset, length, source (base, file), codec,
    start, shape, crc, hash) whose arrays have ``ndims`` dimensions."""
    sources = list(dict.fromkeys(r["source"] for r in rows))
    box = [v for r in rows for v in (*r["start"], *r["shape"])]
    assert len(box) == 2 * sum(ndims[r["array"]] for r in rows)
    layout = (planes([r["array"] for r in rows], 4) + planes([r["offset"] for r in rows], 8) +
              planes([r["length"] for r in rows], 8) +
              planes([sources.index(r["source"]) for r in rows], 4) +
              planes([r["codec"] for r in rows], 1) + planes(box, 8))
    digests = (b"".join(struct.pack("<I", r["crc"]) for r in rows) +
               b"".join(r["hash"] for r in rows))
    return {"count": len(rows), "sources": [list(s) for s in sources],
            "layout": b64(zlib.compress(layout, level)), "digests": b64(digests)}


def seal(doc: dict) -> bytes:
    """The bytes of a root manifest ``doc`` (no checksum member), indented as golden files
    are, ending in its checksum member (section 3.4)."""
    text = json.dumps(doc, indent=1, ensure_ascii=False, allow_nan=False)
    covered = (text[:-2] + ',\n "manifest_checksum":').encode("utf-8")
    return covered + b'"crc32c:%08x"}\n' % crc32c(covered)


def h(data):
    return xxhash.xxh3_128_digest(data)


def tree(nodes):
    """The root of the tree over ``nodes`` (section 11.3), b"" for none."""
    while len(nodes) > 1:
        pairs = [h(b"\x01" + nodes[i] + nodes[i + 1]) for i in range(0, len(nodes) - 1, 2)]
        nodes = pairs + ([nodes[-1]] if len(nodes) % 2 else [])
    return nodes[0] if nodes else b""


def u64(values):
    return b"".join(struct.pack("<Q", v) for v in values)


def table_root(rows):
    """The root of a chunk table of ``rows`` (extension part-roots, section 13.2)."""
    own = sorted(rows, key=lambda r: (r["array"], r["start"]))
    leaves = [h(b"\x05" + struct.pack("<I", r["array"]) +
                h(b"\x00" + struct.pack("<I", len(r["start"])) + u64(r["start"]) +
                  u64(r["shape"]) + r["hash"])) for r in own]
    return h(b"\x06" + u64([len(own)]) + tree(leaves))


def split_merkle(root_rows, part_roots):
    """``merkle_root`` under extension part-roots (section 13.2)."""
    return "xxh3-128:" + h(b"\x07" + u64([len(part_roots)]) + table_root(root_rows) +
                           b"".join(part_roots)).hex()


def merkle(arrays, rows):
    """``merkle_root`` of ``arrays`` [(path, dtype, shape)] and their ``rows`` (section 11.3)."""
    leaves = []
    for i, (path, dtype, shape) in enumerate(arrays):
        own = sorted((r for r in rows if r["array"] == i), key=lambda r: r["start"])
        chunk_leaves = [h(b"\x00" + struct.pack("<I", len(shape)) + u64(r["start"]) +
                          u64(r["shape"]) + r["hash"]) for r in own]
        root = h(b"\x02" + dtype.encode() + b"\x00" + struct.pack("<I", len(shape)) +
                 u64(shape) + u64([len(own)]) + tree(chunk_leaves))
        leaves.append((path.encode(), root))
    top = [h(b"\x03" + u64([len(p)]) + p + r) for p, r in sorted(leaves)]
    return "xxh3-128:" + h(b"\x04" + u64([len(top)]) + tree(top)).hex()


def runs(indices):
    """Sorted, non-adjacent runs [first, count] of a set of array indices."""
    out = []
    for i in sorted(set(indices)):
        if out and out[-1][0] + out[-1][1] == i:
            out[-1][1] += 1
        else:
            out.append([i, 1])
    return out


class Checkpoint:
    """A 1.0 checkpoint being built: declare arrays, add chunks, then :meth:`write`."""

    def __init__(self, world_size=1, step=None, metadata=None, extensions=None, extra=None,
                 alignment=64, part_roots=False):
        self.world_size, self.step, self.alignment = world_size, step, alignment
        self.part_roots = part_roots  # declare extension part-roots (section 13.2)
        self.metadata = metadata or {}
        self.extensions = extensions or {}
        self.extra = extra or {}  # extension members of the root ("<extension>:<field>")
        self.arrays = []          # (path, dtype, shape)
        self.rows = []            # one dict per chunk; "part": None (root) or a part index
        self.data = {r: bytearray() for r in range(world_size)}
        self.last = {}            # rank -> array index of its last chunk
        self.bases = {}           # base -> {file: size}

    def array(self, path, dtype, shape) -> int:
        self.arrays.append((path, dtype, list(shape)))
        return len(self.arrays) - 1

    def chunk(self, index, start, value: np.ndarray, pipeline=(), rank=0, part=None,
              offset=None):
        """Store ``value`` as the box of array ``index`` at ``start``, in ``rank``'s file (at
        ``offset``, or after the previous chunk, a new array at a multiple of the alignment)."""
        dtype = self.arrays[index][1]
        raw = np.ascontiguousarray(value).astype(BITS[dtype]).tobytes()
        stored = encode(raw, pipeline, np.dtype(BITS[dtype]).itemsize)
        data = self.data[rank]
        if offset is None:
            offset = len(data)
            if self.last.get(rank, index) != index:
                offset = -(-offset // self.alignment) * self.alignment
        data.extend(bytes(max(0, offset + len(stored) - len(data))))
        data[offset:offset + len(stored)] = stored
        self.last[rank] = index
        self.rows.append({"array": index, "offset": offset, "length": len(stored),
                          "source": (None, f"data-{rank:05d}.bin"), "pipeline": tuple(pipeline),
                          "start": list(start), "shape": list(value.shape), "crc": crc32c(stored),
                          "hash": xxhash.xxh3_128_digest(raw), "part": part})

    def reference(self, index, start, shape, base_dir: Path, row: dict, part=None):
        """A chunk of array ``index`` that is ``row`` of the committed sibling ``base_dir``."""
        file = row["source"][1]
        self.bases.setdefault(base_dir.name, {})[file] = (base_dir / file).stat().st_size
        self.rows.append(dict(row, array=index, start=list(start), shape=list(shape),
                              source=(base_dir.name, file), part=part))

    def write(self, directory: Path, tree: dict) -> dict:
        """Write the data files, part files and root manifest; return the root document."""
        directory.mkdir(parents=True)
        files = {}
        for rank, data in self.data.items():
            (directory / f"data-{rank:05d}.bin").write_bytes(bytes(data))
            files[f"data-{rank:05d}.bin"] = {"rank": rank, "size": len(data)}
        codecs = list(dict.fromkeys(r["pipeline"] for r in self.rows)) or [()]
        for r in self.rows:
            r["codec"] = codecs.index(r["pipeline"])
        ndims = [len(shape) for _, _, shape in self.arrays]
        parts, roots = [], []
        for p in sorted({r["part"] for r in self.rows if r["part"] is not None}):
            rows = [r for r in self.rows if r["part"] == p]
            name = f"manifest.part-{p:05d}.json"
            body = {"format": "uckpt-part", "format_version": "1.0",
                    "chunks": chunk_table(rows, ndims)}
            data = json.dumps(body, separators=(",", ":")).encode("utf-8") + b"\n"
            (directory / name).write_bytes(data)
            parts.append({"file": name, "size": len(data), "checksum": f"crc32c:{crc32c(data):08x}",
                          "arrays": runs(r["array"] for r in rows)})
            roots.append(table_root(rows))
        root_rows = [r for r in self.rows if r["part"] is None]
        extensions, extra = dict(self.extensions), dict(self.extra)
        merkle_root = merkle(self.arrays, self.rows)
        if self.part_roots:
            extensions["part-roots"] = {"required": True}
            extra["part-roots:roots"] = ["xxh3-128:" + r.hex() for r in roots]
            merkle_root = split_merkle(root_rows, roots)
        doc = {
            "format": "uckpt", "format_version": "1.0", "extensions": extensions,
            "generator": "format10_writer (tests)", "created": "2026-11-27T00:00:00.000000Z",
            "world_size": self.world_size, "step": self.step, "metadata": self.metadata,
            "files": files, "bases": self.bases, "tree": tree,
            "arrays": {"paths": [a[0] for a in self.arrays], "dtypes": [a[1] for a in self.arrays],
                       "shapes": [a[2] for a in self.arrays]},
            "codecs": [list(c) for c in codecs],
            "chunks": chunk_table(root_rows, ndims),
            "parts": parts, **extra,
            "merkle_root": merkle_root,
        }
        (directory / "manifest.json").write_bytes(seal(doc))
        return doc


# --- the checkpoints ---------------------------------------------------------------------------
def leaf(path):
    return {"type": "array", "path": path}


def as_read(dtype, value):
    """What the reference reader gives for an array of ``dtype`` whose bytes are ``value``."""
    value = np.asarray(value, dtype=BITS[dtype])
    if dtype == "bfloat16":
        return (value.astype("<u4") << 16).view("<f4")
    return value


def _example(directory: Path) -> dict:
    """The worked example of docs/format.md: root only, one array in two chunks."""
    ck = Checkpoint(step=7)
    w = np.array([[1.0, -2.0], [0.5, 0.25]], dtype=np.float32)
    b = np.array([0x3F80, 0xBFC0], dtype=np.uint16)  # bfloat16 1.0, -1.5
    tag = np.frombuffer(b"hi", dtype=np.uint8)
    iw, ib, it = ck.array("model/w", "float32", [2, 2]), ck.array("model/b", "bfloat16", [2]), \
        ck.array("tag", "uint8", [2])
    ck.chunk(iw, [0, 0], w[0:1])
    ck.chunk(iw, [1, 0], w[1:2])
    ck.chunk(ib, [0], b)
    ck.chunk(it, [0], tag)
    tree = {"type": "dict", "items": {
        "model": {"type": "dict", "items": {"w": leaf("model/w"), "b": leaf("model/b")}},
        "epoch": {"type": "value", "value": 3}, "lr": {"type": "float", "value": "inf"},
        "tag": {"type": "bytes", "path": "tag"}}}
    ck.write(directory, tree)
    return {"model/w": w, "model/b": as_read("bfloat16", b), "tag": tag}


def _all_types(directory: Path) -> dict:
    """Every dtype of section 10 (edge values), a 0-d array, an empty array, every node type."""
    ck = Checkpoint(step=12, metadata={"purpose": "every dtype"})
    i64 = np.iinfo(np.int64)
    values = {
        "bool": [True, False, True], "int8": [-128, 0, 127], "int16": [-32768, 1, 32767],
        "int32": [-2**31, -1, 2**31 - 1], "int64": [i64.min, 0, i64.max],
        "uint8": [0, 1, 255], "uint16": [0, 2, 65535], "uint32": [0, 3, 2**32 - 1],
        "uint64": [0, 4, 2**64 - 1], "float16": [-0.0, 6e-8, 65504.0],
        "float32": np.array([0x7FC00001, 0x80000000, 0x00000001], "<u4").view("<f4"),
        "float64": [np.inf, -0.0, 5e-324],
        "complex64": [1 + 2j, -0.0 - 1j, np.nan], "complex128": [1e300 + 1j, 0, -1j],
        "bfloat16": [0x3F80, 0x7F80, 0x0001], "float8_e4m3fn": [0x7F, 0x00, 0xFF],
        "float8_e5m2": [0x7C, 0x01, 0x80]}
    items, expected = {}, {}
    for name, v in values.items():
        value = np.array(v, dtype=BITS[name]).reshape(3)
        index = ck.array(f"dtypes/{name}", name, [3])
        ck.chunk(index, [0], value)
        items[name] = leaf(f"dtypes/{name}")
        expected[f"dtypes/{name}"] = as_read(name, value)
    scalar = np.array(2.5, dtype="<f8")
    ck.chunk(ck.array("scalar", "float64", []), [], scalar)
    ck.array("empty", "float32", [0, 4])  # no elements: no rows
    grid = np.arange(24, dtype="<i4").reshape(4, 6)
    ig = ck.array("grid", "int32", [4, 6])
    for r0, c0 in ((2, 3), (0, 0), (0, 3), (2, 0)):  # four 2x3 boxes, out of order
        ck.chunk(ig, [r0, c0], grid[r0:r0 + 2, c0:c0 + 3])
    expected.update(scalar=scalar, empty=np.zeros((0, 4), "<f4"), grid=grid)
    tree = {"type": "dict", "items": {
        "dtypes": {"type": "dict", "items": items},
        "scalar": {"type": "array", "path": "scalar", "numpy_scalar": True},
        "empty": leaf("empty"), "grid": leaf("grid"), "again": leaf("grid"),
        "int_keys": {"type": "dict", "key_type": "int", "items": {"-1": {"type": "value",
                                                                           "value": 2**70}}},
        "seq": {"type": "list", "items": [{"type": "tuple", "items": [
            {"type": "value", "value": None}, {"type": "float", "value": "nan"}]}]},
        "obj": {"type": "object", "adapter": "stateful", "class": "tests.Counter",
                "state": {"type": "dict", "items": {"n": {"type": "value", "value": 1.5}}}}}}
    ck.write(directory, tree)
    return expected


def _codecs(directory: Path) -> dict:
    """Every pipeline of section 5; one array whose two chunks use two pipelines."""
    ck = Checkpoint()
    x = np.linspace(-1.0, 1.0, 512, dtype="<f4")
    weights = (np.round(x * 64) / 64).reshape(64, 8)
    ids = np.arange(100, dtype="<i8") * 3
    noise = np.frombuffer(bytes(range(7, 256, 3)), dtype=np.uint8).copy()
    iw, ii, i_n = ck.array("weights", "float32", [64, 8]), ck.array("ids", "int64", [100]), \
        ck.array("noise", "uint8", [noise.size])
    ck.chunk(iw, [0, 0], weights[:32], pipeline=("bytegroup", "zstd"))
    ck.chunk(iw, [32, 0], weights[32:], pipeline=("zstd",))
    ck.chunk(ii, [0], ids, pipeline=("zstd",))
    ck.chunk(i_n, [0], noise)  # raw
    ck.write(directory, {"type": "dict", "items": {p: leaf(p) for p in ("weights", "ids",
                                                                      "noise")}})
    return {"weights": weights, "ids": ids, "noise": noise}


def _sharded(directory: Path, part_roots: bool = False) -> dict:
    """Two ranks: a 2-D array cut into four boxes over two files, rows in two parts (one per
    rank) and one row in the root's table; chunks packed at multiples of 8. ``part_roots``:
    declaring extension part-roots (section 13.2)."""
    ck = Checkpoint(world_size=2, step=1000, alignment=8, part_roots=part_roots,
                    metadata={"parallelism": "2-way tensor parallel"})
    weight = np.arange(24, dtype="<f4").reshape(4, 6) - 11.5
    bias = np.array([1, -1, 2, -2, 3, -3], dtype="<i2")
    scale = np.array(0.5, dtype="<f4")
    iw, ib, i_s = ck.array("layer/weight", "float32", [4, 6]), \
        ck.array("layer/bias", "int16", [6]), ck.array("layer/scale", "float32", [])
    ck.chunk(iw, [0, 3], weight[0:2, 3:6], rank=1, part=1)
    ck.chunk(iw, [0, 0], weight[0:2, 0:3], rank=0, part=0)
    ck.chunk(iw, [2, 0], weight[2:4, 0:3], rank=0, part=0)
    ck.chunk(iw, [2, 3], weight[2:4, 3:6], rank=1, part=1)
    ck.chunk(ib, [0], bias, rank=1, part=1)
    ck.chunk(i_s, [], scale, rank=0)  # in the root's table
    tree = {"type": "dict", "items": {"layer": {"type": "dict", "items": {
        "weight": leaf("layer/weight"), "bias": leaf("layer/bias"),
        "scale": leaf("layer/scale")}}}}
    ck.write(directory, tree)
    return {"layer/weight": weight, "layer/bias": bias, "layer/scale": scale}


def _chain(directory: Path) -> dict:
    """An incremental pair: ``directory`` refers to rows of its committed sibling
    ``base-<name>`` (only the changed row of ``w`` is its own)."""
    first = np.arange(16, dtype="<f4").reshape(4, 4)
    second = first.copy()
    second[2] += 100
    base_dir = directory.parent / f"base-{directory.name}"
    tree = {"type": "dict", "items": {"w": leaf("w")}}
    base = Checkpoint(step=1)
    i = base.array("w", "float32", [4, 4])
    for r in range(4):
        base.chunk(i, [r, 0], first[r:r + 1])
    base.write(base_dir, tree)
    ck = Checkpoint(step=2)
    i = ck.array("w", "float32", [4, 4])
    for r in range(4):
        if r == 2:
            ck.chunk(i, [r, 0], second[r:r + 1])
        else:
            ck.reference(i, [r, 0], [1, 4], base_dir, base.rows[r])
    ck.write(directory, tree)
    return {"w": second}


def _extension(directory: Path, required: bool) -> dict:
    """A checkpoint declaring extension ``x-test`` (unknown to every reader) with one member."""
    ck = Checkpoint(extensions={"x-test": {"required": required}},
                    extra={"x-test:note": {"anything": [1, 2]}})
    value = np.array([1, 2, 3], dtype="<u2")
    ck.chunk(ck.array("v", "uint16", [3]), [0], value)
    ck.write(directory, {"type": "dict", "items": {"v": leaf("v")}})
    return {"v": value}


def build(kind: str, directory) -> dict:
    """Write the checkpoint ``kind`` (one of :data:`KINDS`) at ``directory`` (a new path;
    ``chain`` also writes its base beside it); return the arrays a reader must give back."""
    directory = Path(directory)
    builders = {"example": _example, "all_types": _all_types, "codecs": _codecs,
                "sharded": _sharded, "chain": _chain,
                "ext_optional": lambda d: _extension(d, False),
                "ext_required": lambda d: _extension(d, True),
                "part_roots": lambda d: _sharded(d, part_roots=True)}
    return builders[kind](directory)
