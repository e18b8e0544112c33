"""The manifest: the JSON document that describes one checkpoint (docs/format.md).

``Manifest.to_bytes`` writes it; ``Manifest.parse`` reads it back and validates
every field strictly: unknown fields, wrong types, chunks outside their file or
outside their array, and file names that leave the checkpoint directory are all
errors naming the field.
"""
from __future__ import annotations

import json
import math
import re

import numpy as np
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

from .. import dtypes
from ..checksum import FORM as _CHECKSUM
from ..checksum import parse_checksum
from ..errors import FormatVersionError, ManifestError, UnsafePathError

FORMAT_NAME = "uckpt"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
CODECS = ("raw",)
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")  # used with fullmatch
_CREATED = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?Z")
_INT_KEY = re.compile(r"-?(0|[1-9][0-9]*)")
_TOP_FIELDS = ("format", "format_version", "generator", "created", "world_size", "step",
               "metadata", "files", "tree", "arrays")
_CHUNK_FIELDS = ("file", "offset", "length", "start", "shape", "codec", "checksum")


@dataclass(frozen=True)
class Chunk:
    """A box of an array (``start`` and ``shape`` in the global index space) stored in ``file``."""

    file: str
    offset: int
    length: int
    start: Tuple[int, ...]
    shape: Tuple[int, ...]
    codec: str
    checksum: str

    def to_json(self) -> Dict[str, Any]:
        return {"file": self.file, "offset": self.offset, "length": self.length,
                "start": list(self.start), "shape": list(self.shape),
                "codec": self.codec, "checksum": self.checksum}


@dataclass(frozen=True)
class ArrayEntry:
    path: str
    dtype: str
    shape: Tuple[int, ...]
    chunks: Tuple[Chunk, ...]

    @property
    def nbytes(self) -> int:
        return dtypes.nbytes(self.dtype, self.shape)

    def to_json(self) -> Dict[str, Any]:
        return {"dtype": self.dtype, "shape": list(self.shape),
                "chunks": [c.to_json() for c in self.chunks]}


@dataclass(frozen=True)
class FileEntry:
    name: str
    rank: int
    size: int


@dataclass
class Manifest:
    world_size: int
    tree: Dict[str, Any]
    arrays: Dict[str, ArrayEntry]
    files: Dict[str, FileEntry]
    step: Optional[int] = None
    metadata: Dict[str, Any] = field(default_factory=dict)
    generator: str = ""
    created: str = ""
    format_version: int = FORMAT_VERSION

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())

    def to_json(self) -> Dict[str, Any]:
        return {
            "format": FORMAT_NAME,
            "format_version": self.format_version,
            "generator": self.generator,
            "created": self.created,
            "world_size": self.world_size,
            "step": self.step,
            "metadata": self.metadata,
            "files": {f.name: {"rank": f.rank, "size": f.size} for f in self.files.values()},
            "tree": self.tree,
            "arrays": {p: a.to_json() for p, a in self.arrays.items()},
        }

    def to_bytes(self) -> bytes:
        try:
            # compact, so json's C encoder runs (indent selects the slow pure-Python one)
            text = json.dumps(self.to_json(), separators=(",", ":"), ensure_ascii=False,
                              allow_nan=False)
            return (text + "\n").encode("utf-8")
        except ValueError as e:  # NaN/inf in metadata, or a lone surrogate in a string
            raise ManifestError(f"the manifest cannot be written as UTF-8 JSON: {e}",
                                hint="metadata must be JSON (no NaN or infinity) and strings "
                                     "valid Unicode") from None

    @classmethod
    def parse(cls, data: bytes, where: str = MANIFEST_NAME) -> "Manifest":
        try:
            doc = strict_json_loads(data)
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            reason = "nests too deeply" if isinstance(e, RecursionError) else str(e)
            raise ManifestError(f"{where} is not valid UTF-8 JSON: {reason}", path=where) from None
        return _Parser(where).manifest(doc)


def _no_constants(token: str):
    raise ValueError(f"{token} is not a JSON number")


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def strict_json_loads(data: bytes):
    """Standard JSON only: no NaN/Infinity tokens, no duplicate keys."""
    return json.loads(data.decode("utf-8"), parse_constant=_no_constants,
                      object_pairs_hook=_no_duplicates)


_CHUNK_KEYS = frozenset(_CHUNK_FIELDS)


class _Loc:
    """``arrays['p'].chunks[i]``, formatted only when an error needs it."""

    def __init__(self, array_loc: str, index: int) -> None:
        self.array_loc, self.index = array_loc, index

    def __str__(self) -> str:
        return f"{self.array_loc}.chunks[{self.index}]"

    def __add__(self, other: str) -> str:
        return str(self) + other


def _nat_list(obj, ndim: int) -> bool:
    return type(obj) is list and len(obj) == ndim and all(type(v) is int and v >= 0 for v in obj)


def _fast_chunk(obj, dtype: str, shape, files) -> Optional[Chunk]:
    """The chunk, if every rule holds; None sends it to the field-by-field checks."""
    if type(obj) is not dict or obj.keys() != _CHUNK_KEYS:
        return None
    name, offset, length = obj["file"], obj["offset"], obj["length"]
    start, cshape, checksum = obj["start"], obj["shape"], obj["checksum"]
    entry = files.get(name) if type(name) is str else None
    if (entry is None or type(offset) is not int or type(length) is not int or offset < 0
            or length < 0 or offset + length > entry.size or obj["codec"] not in CODECS
            or not _nat_list(start, len(shape)) or not _nat_list(cshape, len(shape))
            or type(checksum) is not str or not _CHECKSUM.fullmatch(checksum)
            or any(s + n > full for s, n, full in zip(start, cshape, shape))
            or length != dtypes.itemsize(dtype) * math.prod(cshape)):
        return None
    return Chunk(name, offset, length, tuple(start), tuple(cshape), obj["codec"], checksum)


class _Parser:
    """Strict validation; every error names the field as a JSON path."""

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, loc: str, msg: str, cls=ManifestError):
        raise cls(f"{self.where}: {loc}: {msg}", path=self.where, field=loc)

    def need(self, obj, loc: str, typ, what: str):
        ok = isinstance(obj, typ) and not (typ in (int, (int,)) and isinstance(obj, bool))
        if not ok:
            self.fail(loc, f"expected {what}, got {json.dumps(obj)[:80]}")
        return obj

    def nat(self, obj, loc: str) -> int:
        if not isinstance(obj, int) or isinstance(obj, bool) or obj < 0:
            self.fail(loc, f"expected a non-negative integer, got {json.dumps(obj)[:80]}")
        return obj

    def fields(self, obj: dict, loc: str, required, optional=()) -> None:
        missing = [k for k in required if k not in obj]
        if missing:
            self.fail(loc, f"missing field(s) {', '.join(missing)}")
        unknown = [k for k in obj if k not in required and k not in optional]
        if unknown:
            self.fail(loc, f"unknown field(s) {', '.join(map(str, unknown))}")

    def manifest(self, doc) -> Manifest:
        self.need(doc, "<top>", dict, "a JSON object")
        if doc.get("format") != FORMAT_NAME:
            self.fail("format", f"expected {FORMAT_NAME!r}, got {doc.get('format')!r}")
        version = doc.get("format_version")
        if not isinstance(version, int) or isinstance(version, bool):
            self.fail("format_version", f"expected an integer, got {version!r}")
        if version != FORMAT_VERSION:
            newer = version > FORMAT_VERSION
            raise FormatVersionError(
                f"{self.where}: format_version {version} is not supported (this uckpt reads "
                f"version {FORMAT_VERSION})", path=self.where,
                hint="upgrade uckpt to read it" if newer else "this version was never released")
        self.fields(doc, "<top>", _TOP_FIELDS)
        self.need(doc["generator"], "generator", str, "a string")
        if not isinstance(doc["created"], str) or not _CREATED.fullmatch(doc["created"]):
            self.fail("created", f"expected a UTC time like 2026-01-31T12:00:00.000000Z, got "
                                 f"{json.dumps(doc['created'])[:80]}")
        world = self.nat(doc["world_size"], "world_size")
        if world < 1:
            self.fail("world_size", "must be at least 1")
        step = doc["step"]
        if step is not None:
            self.nat(step, "step")
        self.need(doc["metadata"], "metadata", dict, "a JSON object")
        files = self.files(doc["files"], world)
        arrays = self.arrays(doc["arrays"], files)
        tree = doc["tree"]
        self.need(tree, "tree", dict, "a node object")
        if tree.get("type") != "dict":
            self.fail("tree", "the root node must be of type 'dict'")
        self.node(tree, "tree", arrays, 0)
        return Manifest(world_size=world, tree=tree, arrays=arrays, files=files, step=step,
                        metadata=doc["metadata"], generator=doc["generator"],
                        created=doc["created"], format_version=version)

    def files(self, obj, world: int) -> Dict[str, FileEntry]:
        self.need(obj, "files", dict, "an object of file name -> {rank, size}")
        out = {}
        for name, entry in obj.items():
            loc = f"files[{name!r}]"
            if not _SAFE_NAME.fullmatch(name) or ".." in name:
                self.fail(loc, f"file name {name!r} is not a plain file name inside the "
                               "checkpoint directory", UnsafePathError)
            self.need(entry, loc, dict, "an object")
            self.fields(entry, loc, ("rank", "size"))
            rank = self.nat(entry["rank"], loc + ".rank")
            if rank >= world:
                self.fail(loc + ".rank", f"rank {rank} is not below world_size {world}")
            if any(f.rank == rank for f in out.values()):
                self.fail(loc + ".rank", f"rank {rank} already has a data file")
            out[name] = FileEntry(name, rank, self.nat(entry["size"], loc + ".size"))
        return out

    def arrays(self, obj, files: Dict[str, FileEntry]) -> Dict[str, ArrayEntry]:
        self.need(obj, "arrays", dict, "an object of path -> array entry")
        out = {}
        for path, entry in obj.items():
            loc = f"arrays[{path!r}]"
            self.need(entry, loc, dict, "an object")
            self.fields(entry, loc, ("dtype", "shape", "chunks"))
            dtype = self.need(entry["dtype"], loc + ".dtype", str, "a dtype name")
            if dtype not in dtypes.NAMES:
                self.fail(loc + ".dtype", f"unknown dtype {dtype!r} (known: {', '.join(dtypes.NAMES)})")
            shape = self.shape(entry["shape"], loc + ".shape")
            chunks = tuple(self.chunk(c, _Loc(loc, i), dtype, shape, files)
                           for i, c in enumerate(self.need(entry["chunks"], loc + ".chunks", list,
                                                           "a list of chunks")))
            self.coverage(chunks, shape, loc)
            out[path] = ArrayEntry(path, dtype, shape, chunks)
        return out

    def shape(self, obj, loc: str) -> Tuple[int, ...]:
        self.need(obj, loc, list, "a list of non-negative integers")
        return tuple(self.nat(s, f"{loc}[{i}]") for i, s in enumerate(obj))

    def chunk(self, obj, loc, dtype, shape, files) -> Chunk:
        fast = _fast_chunk(obj, dtype, shape, files)
        return fast if fast is not None else self.checked_chunk(obj, loc, dtype, shape, files)

    def checked_chunk(self, obj, loc, dtype, shape, files) -> Chunk:
        """Field-by-field validation: names the first problem (the slow path)."""
        self.need(obj, loc, dict, "an object")
        self.fields(obj, loc, _CHUNK_FIELDS)
        name = self.need(obj["file"], loc + ".file", str, "a file name")
        if name not in files:
            if not _SAFE_NAME.fullmatch(name) or ".." in name:
                self.fail(loc + ".file", f"file name {name!r} leaves the checkpoint directory",
                          UnsafePathError)
            self.fail(loc + ".file", f"file {name!r} is not listed in 'files'")
        offset = self.nat(obj["offset"], loc + ".offset")
        length = self.nat(obj["length"], loc + ".length")
        if offset + length > files[name].size:
            self.fail(loc, f"bytes {offset}..{offset + length} lie outside {name!r} "
                           f"({files[name].size} bytes)")
        start = self.shape(obj["start"], loc + ".start")
        cshape = self.shape(obj["shape"], loc + ".shape")
        if len(start) != len(shape) or len(cshape) != len(shape):
            self.fail(loc, f"start/shape must have {len(shape)} dimensions like the array")
        for d, (s, n, full) in enumerate(zip(start, cshape, shape)):
            if s + n > full:
                self.fail(loc, f"dimension {d}: {s}+{n} exceeds the array's extent {full}")
        codec = obj["codec"]
        if codec not in CODECS:
            self.fail(loc + ".codec", f"unknown codec {codec!r} (known: {', '.join(CODECS)})")
        expected = dtypes.itemsize(dtype)
        for n in cshape:
            expected *= n
        if length != expected:
            self.fail(loc + ".length", f"{length} bytes, but a raw {dtype} chunk of shape "
                                       f"{list(cshape)} holds {expected}")
        checksum = self.need(obj["checksum"], loc + ".checksum", str, "a checksum string")
        try:
            parse_checksum(checksum)
        except ValueError as e:
            self.fail(loc + ".checksum", str(e))
        return Chunk(name, offset, length, start, cshape, codec, checksum)

    def coverage(self, chunks, shape, loc) -> None:
        """Chunks must tile the array exactly: equal volume and pairwise disjoint."""
        total = 1
        for s in shape:
            total *= s
        covered = sum(math.prod(c.shape) for c in chunks)
        if covered != total:
            self.fail(loc + ".chunks", f"chunks cover {covered} elements, the array has {total}")
        boxes = [c for c in chunks if all(c.shape)]
        if len(boxes) < 2:
            return
        starts = np.array([c.start for c in boxes], dtype=np.int64).reshape(len(boxes), -1)
        ends = starts + np.array([c.shape for c in boxes], dtype=np.int64).reshape(len(boxes), -1)
        for i0 in range(0, len(boxes), 256):  # blocks keep the pairwise test's memory small
            s, e = starts[i0:i0 + 256, None, :], ends[i0:i0 + 256, None, :]
            hit = np.all((s < ends[None]) & (starts[None] < e), axis=2)
            for k in range(hit.shape[0]):
                hit[k, :i0 + k + 1] = False  # a box with itself, and pairs already seen
            if hit.any():
                i, j = np.argwhere(hit)[0]
                self.fail(loc + ".chunks", f"chunks at {list(boxes[i0 + i].start)} and "
                                           f"{list(boxes[j].start)} overlap")

    def node(self, node, loc: str, arrays, depth: int) -> None:
        if depth > 200:
            self.fail(loc, "tree nests deeper than 200 levels")
        self.need(node, loc, dict, "a node object")
        kind = node.get("type")
        if kind == "value":
            self.fields(node, loc, ("type", "value"))
            v = node["value"]
            if not (v is None or isinstance(v, (bool, int, float, str))):
                self.fail(loc + ".value", "a value node holds null, a boolean, a number or a string")
        elif kind == "float":
            self.fields(node, loc, ("type", "value"))
            if node["value"] not in ("nan", "inf", "-inf"):
                self.fail(loc + ".value", "expected 'nan', 'inf' or '-inf'")
        elif kind in ("array", "bytes"):
            self.fields(node, loc, ("type", "path"), ("numpy_scalar",))
            path = self.need(node["path"], loc + ".path", str, "an array path")
            if path not in arrays:
                self.fail(loc + ".path", f"array {path!r} is not listed in 'arrays'")
            if "numpy_scalar" in node:
                self.need(node["numpy_scalar"], loc + ".numpy_scalar", bool, "a boolean")
                if node["numpy_scalar"] and arrays[path].shape != ():
                    self.fail(loc + ".numpy_scalar", "a NumPy scalar must refer to a 0-d array")
            if kind == "bytes" and (arrays[path].dtype != "uint8" or len(arrays[path].shape) != 1):
                self.fail(loc, "a bytes node must refer to a 1-d uint8 array")
        elif kind == "dict":
            self.fields(node, loc, ("type", "items"), ("key_type",))
            items = self.need(node["items"], loc + ".items", dict, "an object")
            if node.get("key_type", "str") not in ("str", "int"):
                self.fail(loc + ".key_type", "expected 'str' or 'int'")
            for k, v in items.items():
                if node.get("key_type") == "int" and (not _INT_KEY.fullmatch(k) or k == "-0"):
                    self.fail(loc + ".items", f"key {k!r} is not an integer in canonical form")
                self.node(v, f"{loc}.items[{k!r}]", arrays, depth + 1)
        elif kind in ("list", "tuple"):
            self.fields(node, loc, ("type", "items"))
            for i, v in enumerate(self.need(node["items"], loc + ".items", list, "a list")):
                self.node(v, f"{loc}.items[{i}]", arrays, depth + 1)
        elif kind == "object":
            self.fields(node, loc, ("type", "adapter", "class", "state"))
            self.need(node["adapter"], loc + ".adapter", str, "an adapter name")
            self.need(node["class"], loc + ".class", str, "a class name")
            self.node(node["state"], loc + ".state", arrays, depth + 1)
        else:
            self.fail(loc + ".type", f"unknown node type {kind!r}")
