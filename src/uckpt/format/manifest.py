"""The manifest: the JSON document that describes one checkpoint (docs/format.md).

``Manifest.to_bytes`` writes it (format version 6: ending in its own
checksum, ``integrity.py``; chunks raw or compressed, each with its content hash, Merkle
roots, references to earlier checkpoints; evenly cut arrays listed compactly, ``grid.py``;
arrays stored whole as rows of one table, ``table.py``);
``Manifest.parse`` reads versions 1 to 6 back,
checks the manifest checksum (version 2 on) before anything else, and validates every
field strictly: unknown fields, wrong types, numbers beyond the format's limits,
chunks outside their file or outside their array or overlapping each other, and
file names that leave the checkpoint directory are all errors naming the field.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re

import numpy as np
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Sequence, Tuple

from .. import dtypes, hashing, knobs, memory
from ..checksum import FORM as _CHECKSUM
from ..checksum import parse_checksum
from ..errors import FormatVersionError, ManifestError, MemoryLimitError, UnsafePathError
from . import grid, integrity, table
from .strict_json import loads as strict_json_loads
from .tiling import find_defect
from .values import MAX_DIMS, MAX_INT
from .values import dims as _dims, key as _key, show as _show

FORMAT_NAME = "uckpt"
FORMAT_VERSION = 6
# 1: version 2 without its checksum; 2: version 3 with raw chunks only; 3: version 4
# without content hashes, Merkle roots and references; 4: version 5 without grid listings;
# 5: version 6 without the table (docs/format.md sections 11, 14, 15, 16)
READ_VERSIONS = (1, 2, 3, 4, 5, 6)
MANIFEST_NAME = "manifest.json"
CODECS = ("raw", "zstd", "zstd+bytegroup")
CODECS_OF = {1: ("raw",), 2: ("raw",), 3: CODECS, 4: CODECS, 5: CODECS, 6: CODECS}  # codecs
#: a compressed chunk decodes to at most this many bytes per stored byte (section 6.3)
MAX_RATIO = 32768
MAX_KEY_DIGITS = 4300  # int dict keys; Python's default limit for int(str)
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")  # used with fullmatch
_CREATED = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?Z")
_INT_KEY = re.compile(r"-?(0|[1-9][0-9]*)")
_TOP_FIELDS = ("format", "format_version", "generator", "created", "world_size", "step",
               "metadata", "files", "tree", "arrays")
_TOP_FIELDS_V2 = _TOP_FIELDS + (integrity.FIELD,)
_TOP_FIELDS_V4 = _TOP_FIELDS + ("bases", "merkle_root", integrity.FIELD)
_CHUNK_FIELDS = ("file", "offset", "length", "start", "shape", "codec", "checksum")
_CHUNK_FIELDS_V4 = _CHUNK_FIELDS + ("hash",)
_HASH = re.compile(hashing.PREFIX + "[0-9a-f]{32}")


@dataclass(frozen=True, slots=True)
class Chunk:
    """A box of an array (``start`` and ``shape`` in the global index space) stored in ``file``."""

    file: str
    offset: int
    length: int
    start: Tuple[int, ...]
    shape: Tuple[int, ...]
    codec: str
    checksum: str
    #: the content hash of the raw bytes (format version 4; "" when read from older ones)
    hash: str = ""
    #: the earlier checkpoint whose data file ``file`` holds the bytes (version 4), or None
    base: Optional[str] = None

    @property
    def compressed(self) -> bool:
        return self.codec != "raw"

    def to_json(self, hashed: bool = True) -> Dict[str, Any]:
        out = {"file": self.file, "offset": self.offset, "length": self.length,
               "start": list(self.start), "shape": list(self.shape),
               "codec": self.codec, "checksum": self.checksum}
        if hashed:
            out["hash"] = self.hash
        if self.base is not None:
            out["base"] = self.base
        return out


@dataclass(frozen=True, slots=True)
class ArrayEntry:
    path: str
    dtype: str
    shape: Tuple[int, ...]
    #: a tuple; read from a grid listing, a ``grid.Slabs``: a sequence equal to the tuple,
    #: whose chunks are made from compact columns each time they are read
    chunks: Tuple[Chunk, ...]
    #: the Merkle root a version-4 manifest recorded ("" for older versions, and for a row
    #: of a version-6 table, which leaves it to be computed: :meth:`recorded_root`)
    root: str = ""

    @property
    def nbytes(self) -> int:
        return dtypes.nbytes(self.dtype, self.shape)

    def recorded_root(self) -> str:
        """The Merkle root the manifest states: ``root``, or for a table row (which states
        its chunk's hash only) the root of that hash."""
        return self.root or hashing.format_hash(self.merkle_root())

    def merkle_root(self, digests: Optional[Sequence[bytes]] = None) -> bytes:
        """The array's Merkle root from its chunks' hashes, or from ``digests`` (one per
        chunk, in order: hashes recomputed from the bytes)."""
        if digests is None:
            digests = hashing.parse_hashes([c.hash for c in self.chunks])
        return hashing.array_root(self.dtype, self.shape,
                                  [(c.start, c.shape, d) for c, d in zip(self.chunks, digests)])

    def to_json(self, hashed: bool = True) -> Dict[str, Any]:
        """``hashed=False``: without the fields of versions 4 and 5 (read from an older
        one); else chunks on a grid of slabs are listed as one ``grid`` (version 5)."""
        cut = grid.grid_cut(self.shape, self.chunks) if hashed else None
        out: Dict[str, Any] = {"dtype": self.dtype, "shape": list(self.shape)}
        if cut is not None:
            out["grid"] = grid.encode(*cut)
        else:
            out["chunks"] = [c.to_json(hashed) for c in self.chunks]
        if hashed:
            out["root"] = hashing.format_hash(self.merkle_root())
        return out


@dataclass(frozen=True, slots=True)
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
    #: the version it was read as (written manifests are always FORMAT_VERSION)
    format_version: int = FORMAT_VERSION
    #: the checksum a version-2 manifest recorded (and matched); None for version 1
    checksum: Optional[str] = None
    #: earlier checkpoints whose data files chunks refer to: name -> file -> size (version 4)
    bases: Dict[str, Dict[str, int]] = field(default_factory=dict)
    #: the checkpoint's Merkle root a version-4 manifest recorded ("" for older versions)
    merkle_root: str = ""

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())

    def unhashed(self) -> Optional[str]:
        """The path of an array with a chunk without a content hash (one read from a
        manifest older than version 4), or None."""
        return next((a.path for a in self.arrays.values() for c in a.chunks if not c.hash), None)

    def to_json(self) -> Dict[str, Any]:
        """The fields of the current format version, less the checksum (``to_bytes`` adds
        it); of the version it was read as when its chunks have no content hashes (read
        from an older version: only ``to_bytes`` needs them)."""
        old = self.unhashed() is not None
        rows = [] if old else [a for a in self.arrays.values() if table.whole(a)]
        if knobs.table_min_arrays <= 0 or len(rows) < knobs.table_min_arrays:
            rows = []
        in_table = {a.path for a in rows}
        arrays = {p: a.to_json(hashed=not old) for p, a in self.arrays.items()
                  if p not in in_table}
        out = {
            "format": FORMAT_NAME,
            "format_version": self.format_version if old else FORMAT_VERSION,
            "generator": self.generator,
            "created": self.created,
            "world_size": self.world_size,
            "step": self.step,
            "metadata": self.metadata,
            "files": {f.name: {"rank": f.rank, "size": f.size} for f in self.files.values()},
            "tree": self.tree,
            "arrays": arrays,
        }
        if rows:
            out["table"] = table.encode(rows)
        if not old:
            roots = {p: hashing.parse_hash(a["root"]) for p, a in arrays.items()}
            roots.update((a.path, a.merkle_root()) for a in rows)
            out["bases"] = self.bases
            out["merkle_root"] = hashing.format_hash(hashing.checkpoint_root(
                {p: roots[p] for p in self.arrays}))
        return out

    def to_bytes(self) -> bytes:
        """The manifest file: compact UTF-8 JSON ending in its checksum member and a newline."""
        unhashed = self.unhashed()
        if unhashed is not None:
            raise ManifestError(
                f"leaf {unhashed!r} has a chunk without a content hash: a manifest read from "
                f"format version {self.format_version} cannot be written as version "
                f"{FORMAT_VERSION} without reading its data", leaf=unhashed,
                hint="load the checkpoint and save it again, or use uckpt.consolidate")
        try:
            # compact, so json's C encoder runs (indent selects the slow pure-Python one)
            text = json.dumps(self.to_json(), separators=(",", ":"), ensure_ascii=False,
                              allow_nan=False)
            return integrity.seal(text[:-1].encode("utf-8"))  # without the closing brace
        except ValueError as e:  # NaN/inf in metadata, or a lone surrogate in a string
            raise ManifestError(f"the manifest cannot be written as UTF-8 JSON: {e}",
                                hint="metadata must be JSON (no NaN or infinity) and strings "
                                     "valid Unicode") from None

    @classmethod
    def parse(cls, data: bytes, where: str = MANIFEST_NAME) -> "Manifest":
        """Check and read a manifest of any version this uckpt reads (raises ManifestError)."""
        checksum = integrity.check(data, where)  # first: damage is told as damage
        memory.check_manifest(data, where)
        try:
            try:
                doc = strict_json_loads(data)
            except ValueError as e:  # UnicodeDecodeError is one
                raise ManifestError(f"{where} is not valid UTF-8 JSON: {e}",
                                    path=where) from None
            return _Parser(where).manifest(doc, checksum, data)
        except MemoryError:
            raise MemoryLimitError(
                f"{where}: out of memory parsing a manifest of {len(data)} bytes", path=where,
                hint="read it in a process allowed more memory (ulimit -v, the cgroup's "
                     "memory.max)") from None


_CHUNK_KEYS = frozenset(_CHUNK_FIELDS)
_CHUNK_KEYS_V4 = frozenset(_CHUNK_FIELDS_V4)
_CHUNK_KEYS_BASE = _CHUNK_KEYS_V4 | {"base"}


_FIELD_SETS: Dict[tuple, Tuple[frozenset, frozenset]] = {}  # (required, optional) -> sets
_ARRAY_NODE_KEYS = frozenset(("type", "path"))
_MAX_LOC = 400  # characters of a field's location in an error message
MAX_TREE_DEPTH = 200  # levels of nested nodes in a manifest's tree


class _Item:
    """``parent.items[key]`` (``parent.state`` for key None) of the tree, formatted only
    when an error needs it."""

    __slots__ = ("parent", "key")

    def __init__(self, parent, key) -> None:
        self.parent, self.key = parent, key

    def __str__(self) -> str:
        if self.key is None:
            return f"{self.parent}.state"
        key = _key(self.key) if isinstance(self.key, str) else self.key
        return f"{self.parent}.items[{key}]"

    def __add__(self, other: str) -> str:
        return str(self) + other


class _Loc:
    """``arrays['p'].chunks[i]``, formatted only when an error needs it."""

    def __init__(self, array_loc: str, index: int) -> None:
        self.array_loc, self.index = array_loc, index

    def __str__(self) -> str:
        return f"{self.array_loc}.chunks[{self.index}]"

    def __add__(self, other: str) -> str:
        return str(self) + other


_ARRAY_KEYS = frozenset(("dtype", "shape", "chunks"))
_ARRAY_KEYS_V4 = _ARRAY_KEYS | {"root"}
_GRID_ARRAY_FIELDS = ("dtype", "shape", "grid", "root")


def _fast_array_head(entry, v4: bool) -> Optional[Tuple[str, Tuple[int, ...], str]]:
    """``(dtype, shape, root)`` of an array entry (root "" before version 4), if its fields,
    dtype, shape and root are all valid; None sends it to the field-by-field checks (which
    name the problem)."""
    if type(entry) is not dict or entry.keys() != (_ARRAY_KEYS_V4 if v4 else _ARRAY_KEYS):
        return None
    dtype, shape = entry["dtype"], entry["shape"]
    root = entry["root"] if v4 else ""
    if type(dtype) is not str or dtype not in dtypes.NAMES or type(shape) is not list \
            or len(shape) > MAX_DIMS or type(entry["chunks"]) is not list:
        return None
    if v4 and (type(root) is not str or not _HASH.fullmatch(root)):
        return None
    for n in shape:
        if type(n) is not int or n < 0 or n > MAX_INT:
            return None
    return dtype, tuple(shape), root


def _fast_chunk(obj, itemsize: int, shape, files, codecs, v4: bool,
                bases: Dict[str, Dict[str, int]]) -> Optional[Chunk]:
    """The chunk, if every rule holds; None sends it to the field-by-field checks. Every
    number is then within int64: the file's size and the array's shape were checked."""
    if type(obj) is not dict:
        return None
    keys = obj.keys()
    base = None
    if keys != (_CHUNK_KEYS_V4 if v4 else _CHUNK_KEYS):
        if not v4 or keys != _CHUNK_KEYS_BASE:
            return None
        base = obj["base"]  # a reference to a base's file (version 4)
        sizes = bases.get(base) if type(base) is str else None
        if sizes is None:
            return None
    content = obj["hash"] if v4 else ""
    if v4 and (type(content) is not str or not _HASH.fullmatch(content)):
        return None
    name, offset, length = obj["file"], obj["offset"], obj["length"]
    start, cshape, checksum = obj["start"], obj["shape"], obj["checksum"]
    if type(name) is not str:
        return None
    size = files[name].size if base is None and name in files else \
        sizes.get(name) if base is not None else None
    if (size is None or type(offset) is not int or type(length) is not int or offset < 0
            or length < 0 or offset + length > size or obj["codec"] not in codecs
            or type(start) is not list or type(cshape) is not list
            or len(start) != len(shape) or len(cshape) != len(shape)
            or type(checksum) is not str or not _CHECKSUM.fullmatch(checksum)):
        return None
    n = itemsize
    for s, c, full in zip(start, cshape, shape):
        if type(s) is not int or type(c) is not int or s < 0 or c < 0 or s + c > full:
            return None
        n *= c
    if obj["codec"] == "raw":
        if length != n:
            return None
    elif not 0 < n <= MAX_RATIO * length:  # compressed (docs/format.md section 6.3)
        return None
    return _chunk(name, offset, length, tuple(start), tuple(cshape), obj["codec"], checksum,
                  content, base)


def _fast_array(entry, files, codecs, v4: bool, bases: Dict[str, Dict[str, int]]
                ) -> Optional[Tuple[str, Tuple[int, ...], Tuple[Chunk, ...], str]]:
    """``(dtype, shape, chunks, root)`` of a chunk-listed array entry, if every rule but
    the tiling of several chunks holds; None sends it to the field-by-field checks."""
    head = _fast_array_head(entry, v4)
    if head is None:
        return None
    dtype, shape, root = head
    itemsize = size = dtypes.itemsize(dtype)
    for n in shape:
        size *= n if n > 1 else 1
    if size > MAX_INT:
        return None
    chunks = []
    for obj in entry["chunks"]:
        chunk = _fast_chunk(obj, itemsize, shape, files, codecs, v4, bases)
        if chunk is None:
            return None
        chunks.append(chunk)
    return dtype, shape, tuple(chunks), root


def _one_whole_chunk(chunks, shape) -> bool:
    """Whether ``chunks`` is one chunk of the whole array (it covers it: no tiling check)."""
    return len(chunks) == 1 and chunks[0].shape == shape and not any(chunks[0].start)


def _slot_setters(cls) -> tuple:
    """The slot descriptors' setters of ``cls``'s fields, in order (they set a field of a
    frozen instance without its ``__setattr__``)."""
    return tuple(getattr(cls, f.name).__set__ for f in dataclasses.fields(cls))


_CHUNK_SET = _slot_setters(Chunk)
_ENTRY_SET = _slot_setters(ArrayEntry)
_new_object = object.__new__


def _chunk(file, offset, length, start, shape, codec, checksum, hash, base) -> Chunk:
    """A checked Chunk, without the frozen ``__init__`` (which sets each field through
    ``object.__setattr__``: a third of the time a manifest of many small arrays takes to
    read)."""
    obj = _new_object(Chunk)
    f, o, n, st, sh, c, ck, h, b = _CHUNK_SET
    f(obj, file), o(obj, offset), n(obj, length), st(obj, start), sh(obj, shape)
    c(obj, codec), ck(obj, checksum), h(obj, hash), b(obj, base)
    return obj


def _entry(path, dtype, shape, chunks, root) -> ArrayEntry:
    """A checked ArrayEntry (as :func:`_chunk`)."""
    obj = _new_object(ArrayEntry)
    p, d, s, c, r = _ENTRY_SET
    p(obj, path), d(obj, dtype), s(obj, shape), c(obj, chunks), r(obj, root)
    return obj


def _row_entry(path: str, dtype: str, shape: Tuple[int, ...], chunk: Chunk) -> ArrayEntry:
    """The entry of a checked table row (no recorded root: ``ArrayEntry.recorded_root``)."""
    return _entry(path, dtype, shape, (chunk,), "")


class _Parser:
    """Strict validation; every error names the field as a JSON path."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.version = FORMAT_VERSION
        self.codecs = CODECS  # those of the manifest's version, once known

    def fail(self, loc: str, msg: str, cls=ManifestError):
        loc = str(loc)  # (a _Loc or _Item: formatted now)
        if len(loc) > _MAX_LOC:  # (a location MAX_TREE_DEPTH levels deep: its ends say where)
            loc = f"{loc[:_MAX_LOC // 2]}...{loc[-_MAX_LOC // 2:]}"
        raise cls(f"{self.where}: {loc}: {msg}", path=self.where, field=loc)

    def need(self, obj, loc: str, typ, what: str):
        ok = isinstance(obj, typ) and not (typ in (int, (int,)) and isinstance(obj, bool))
        if not ok:
            self.fail(loc, f"expected {what}, got {_show(obj)}")
        return obj

    def nat(self, obj, loc: str) -> int:
        """A non-negative integer that fits a signed 64-bit integer."""
        if not isinstance(obj, int) or isinstance(obj, bool) or obj < 0:
            self.fail(loc, f"expected a non-negative integer, got {_show(obj)}")
        if obj > MAX_INT:
            self.fail(loc, f"{_show(obj)} exceeds 2**63-1, the largest number the format "
                           "allows here")
        return obj

    def fields(self, obj: dict, loc: str, required, optional=()) -> None:
        sets = _FIELD_SETS.get((required, optional))
        if sets is None:
            sets = _FIELD_SETS[(required, optional)] = (frozenset(required),
                                                        frozenset(required + optional))
        if sets[0] <= obj.keys() <= sets[1]:
            return  # (the common case, checked in C)
        missing = [k for k in required if k not in obj]
        if missing:
            self.fail(loc, f"missing field(s) {', '.join(missing)}")
        unknown = [k for k in obj if k not in required and k not in optional]
        if unknown:
            self.fail(loc, f"unknown field(s) {', '.join(map(_key, unknown[:10]))}")

    def manifest(self, doc, checksum: Optional[str], data: bytes) -> Manifest:
        """``checksum``: what the file's checksum member recorded (already verified), or
        None when the file does not end in one."""
        self.need(doc, "<top>", dict, "a JSON object")
        if doc.get("format") != FORMAT_NAME:
            self.fail("format", f"expected {FORMAT_NAME!r}, got {_show(doc.get('format'))}")
        version = doc.get("format_version")
        if not isinstance(version, int) or isinstance(version, bool):
            self.fail("format_version", f"expected an integer, got {_show(version)}")
        if version not in READ_VERSIONS:
            newer = version > FORMAT_VERSION
            raise FormatVersionError(
                f"{self.where}: format_version {_show(version)} is not supported (this uckpt "
                f"reads versions {', '.join(map(str, READ_VERSIONS))})", path=self.where,
                hint="upgrade uckpt to read it" if newer else "this version was never released")
        if version >= 2:
            if checksum is None:
                raise integrity.missing(self.where, data)
            last = next(reversed(doc), None)
            if last != integrity.FIELD or doc[last] != checksum:
                self.fail(integrity.FIELD, "must be the last member of the top-level object "
                                           "and hold the checksum that ends the file")
        self.version = version
        self.fields(doc, "<top>", _TOP_FIELDS_V4 if version >= 4 else
                    _TOP_FIELDS_V2 if version >= 2 else _TOP_FIELDS,
                    ("table",) if version >= 6 else ())
        self.codecs = CODECS_OF[version]
        self.need(doc["generator"], "generator", str, "a string")
        if not isinstance(doc["created"], str) or not _CREATED.fullmatch(doc["created"]):
            self.fail("created", f"expected a UTC time like 2026-01-31T12:00:00.000000Z, got "
                                 f"{_show(doc['created'])}")
        world = self.nat(doc["world_size"], "world_size")
        if world < 1:
            self.fail("world_size", "must be at least 1")
        step = doc["step"]
        if step is not None:
            self.nat(step, "step")
        self.need(doc["metadata"], "metadata", dict, "a JSON object")
        files = self.files(doc["files"], world)
        bases = self.bases(doc["bases"]) if version >= 4 else {}
        merkle = self.hash_text(doc["merkle_root"], "merkle_root") if version >= 4 else ""
        arrays = self.arrays(doc["arrays"], files, bases)
        if "table" in doc:
            table.decode(self, doc["table"], arrays, files, bases, _chunk, _row_entry,
                         MAX_RATIO)
            del doc["table"]  # (its JSON lists and text, decoded: freed before the tree's check)
        self.bases_used(bases, arrays)
        tree = doc["tree"]
        self.need(tree, "tree", dict, "a node object")
        if tree.get("type") != "dict":
            self.fail("tree", "the root node must be of type 'dict'")
        self.node(tree, "tree", arrays, 0)
        return Manifest(world_size=world, tree=tree, arrays=arrays, files=files, step=step,
                        metadata=doc["metadata"], generator=doc["generator"],
                        created=doc["created"], format_version=version,
                        checksum=checksum if version >= 2 else None, bases=bases,
                        merkle_root=merkle)

    def files(self, obj, world: int) -> Dict[str, FileEntry]:
        self.need(obj, "files", dict, "an object of file name -> {rank, size}")
        out = {}
        for name, entry in obj.items():
            loc = f"files[{_key(name)}]"
            if not _SAFE_NAME.fullmatch(name) or ".." in name:
                self.fail(loc, f"file name {_key(name)} is not a plain file name inside the "
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

    def hash_text(self, obj, loc: str) -> str:
        if not isinstance(obj, str) or not _HASH.fullmatch(obj):
            self.fail(loc, f"expected {hashing.PREFIX!r} + 32 lowercase hex digits, got "
                           f"{_show(obj)}")
        return obj

    def plain_name(self, name: str, loc: str, what: str) -> None:
        if not _SAFE_NAME.fullmatch(name) or ".." in name:
            self.fail(loc, f"{what} {_key(name)} is not a plain name inside the parent "
                           "directory" if what == "base" else
                      f"{what} {_key(name)} is not a plain file name inside the checkpoint "
                      "directory", UnsafePathError)

    def bases(self, obj) -> Dict[str, Dict[str, int]]:
        """Version 4: earlier checkpoints referred to, name -> file -> size."""
        self.need(obj, "bases", dict, "an object of checkpoint name -> {file name: size}")
        out: Dict[str, Dict[str, int]] = {}
        for base, sizes in obj.items():
            loc = f"bases[{_key(base)}]"
            self.plain_name(base, loc, "base")
            self.need(sizes, loc, dict, "an object of file name -> size")
            if not sizes:
                self.fail(loc, "a base must list the files chunks refer to")
            for name, size in sizes.items():
                self.plain_name(name, f"{loc}[{_key(name)}]", "file name")
                self.nat(size, f"{loc}[{_key(name)}]")
            out[base] = dict(sizes)
        return out

    def bases_used(self, bases: Dict[str, Dict[str, int]], arrays) -> None:
        """Every base, and every file of one, is referred to by some chunk (rule 23)."""
        if not bases:
            return
        used = {(c.base, c.file) for a in arrays.values() for c in a.chunks if c.base}
        for base, sizes in bases.items():
            for name in sizes:
                if (base, name) not in used:
                    self.fail(f"bases[{_key(base)}][{_key(name)}]",
                              "no chunk refers to this file of the base")

    def arrays(self, obj, files: Dict[str, FileEntry],
               bases: Dict[str, Dict[str, int]]) -> Dict[str, ArrayEntry]:
        self.need(obj, "arrays", dict, "an object of path -> array entry")
        out = {}
        v4 = self.version >= 4
        grids = self.version >= 5
        for path, entry in obj.items():
            fast = None if grids and type(entry) is dict and "grid" in entry else \
                _fast_array(entry, files, self.codecs, v4, bases)
            if fast is not None:
                dtype, shape, chunks, root = fast
                if not _one_whole_chunk(chunks, shape):
                    self.coverage(chunks, shape, f"arrays[{_key(path)}]")
                out[path] = _entry(path, dtype, shape, chunks, root)
            else:
                out[path] = self.checked_array(path, entry, files, bases)
        return out

    def checked_array(self, path: str, entry, files: Dict[str, FileEntry],
                      bases: Dict[str, Dict[str, int]]) -> ArrayEntry:
        """An array entry checked field by field (a grid, or a problem to name)."""
        loc = f"arrays[{_key(path)}]"
        v4 = self.version >= 4
        if self.version >= 5 and type(entry) is dict and "grid" in entry:
            return self.grid_array(path, entry, loc, files, bases)
        head = _fast_array_head(entry, v4)
        if head is not None:
            dtype, shape, root = head
        else:
            self.need(entry, loc, dict, "an object")
            if "grid" in entry:  # (version 5 went to grid_array)
                self.fail(loc + ".grid", f"a grid listing is a field of format version 5; "
                                         f"this manifest is version {self.version}")
            self.fields(entry, loc, ("dtype", "shape", "chunks", "root") if v4 else
                        ("dtype", "shape", "chunks"))
            root = self.hash_text(entry["root"], loc + ".root") if v4 else ""
            dtype, shape = self.dtype_shape(entry, loc)
        itemsize = self.array_size(dtype, shape, loc)
        chunks = tuple(_fast_chunk(c, itemsize, shape, files, self.codecs, v4, bases) or
                       self.checked_chunk(c, _Loc(loc, i), dtype, shape, files, bases)
                       for i, c in enumerate(self.need(entry["chunks"], loc + ".chunks", list,
                                                       "a list of chunks")))
        if not _one_whole_chunk(chunks, shape):
            self.coverage(chunks, shape, loc)
        return ArrayEntry(path, dtype, shape, chunks, root)

    def dtype_shape(self, entry: dict, loc: str) -> Tuple[str, Tuple[int, ...]]:
        dtype = self.need(entry["dtype"], loc + ".dtype", str, "a dtype name")
        if dtype not in dtypes.NAMES:
            self.fail(loc + ".dtype", f"unknown dtype {_key(dtype)} (known: "
                                      f"{', '.join(dtypes.NAMES)})")
        return dtype, self.shape(entry["shape"], loc + ".shape")

    def array_size(self, dtype: str, shape: Tuple[int, ...], loc: str) -> int:
        """The dtype's itemsize, once the array's byte size is known to fit the format."""
        itemsize = size = dtypes.itemsize(dtype)
        for n in shape:
            size *= max(n, 1)
        if size > MAX_INT:  # NumPy counts a 0 as 1 here, and refuses such a shape
            self.fail(loc + ".shape", f"{dtype} array of shape {_dims(shape)} is too large: "
                                      f"its byte size (each 0 counted as 1) is "
                                      f"{_show(size)}, more than 2**63-1")
        return itemsize

    def grid_array(self, path: str, entry: dict, loc: str, files: Dict[str, FileEntry],
                   bases: Dict[str, Dict[str, int]]) -> ArrayEntry:
        """Version 5: an array listed by its ``grid`` (docs/format.md section 15)."""
        if "chunks" in entry:
            self.fail(loc, "an array entry has 'chunks' or 'grid', not both")
        self.fields(entry, loc, _GRID_ARRAY_FIELDS)
        root = self.hash_text(entry["root"], loc + ".root")
        dtype, shape = self.dtype_shape(entry, loc)
        itemsize = self.array_size(dtype, shape, loc)
        chunks = grid.decode(self, entry["grid"], loc, itemsize, shape, files, bases, Chunk,
                             MAX_RATIO)
        return ArrayEntry(path, dtype, shape, chunks, root)

    def shape(self, obj, loc: str) -> Tuple[int, ...]:
        self.need(obj, loc, list, "a list of non-negative integers")
        if len(obj) > MAX_DIMS:
            self.fail(loc, f"{len(obj)} dimensions; the format allows at most {MAX_DIMS} "
                           "(NumPy's limit)")
        return tuple(self.nat(s, f"{loc}[{i}]") for i, s in enumerate(obj))

    def checked_chunk(self, obj, loc, dtype, shape, files, bases) -> Chunk:
        """Field-by-field validation: names the first problem (the slow path)."""
        v4 = self.version >= 4
        self.need(obj, loc, dict, "an object")
        self.fields(obj, loc, _CHUNK_FIELDS_V4 if v4 else _CHUNK_FIELDS, ("base",) if v4 else ())
        base = None
        sizes = {n: f.size for n, f in files.items()}
        listed = "'files'"
        if "base" in obj:
            base = self.need(obj["base"], loc + ".base", str, "a base checkpoint name")
            if base not in bases:
                self.fail(loc + ".base", f"base {_key(base)} is not listed in 'bases'")
            sizes, listed = bases[base], f"'bases'[{_key(base)}]"
        name = self.need(obj["file"], loc + ".file", str, "a file name")
        if name not in sizes:
            if not _SAFE_NAME.fullmatch(name) or ".." in name:
                self.fail(loc + ".file", f"file name {_key(name)} leaves the checkpoint "
                                         "directory", UnsafePathError)
            self.fail(loc + ".file", f"file {_key(name)} is not listed in {listed}")
        offset = self.nat(obj["offset"], loc + ".offset")
        length = self.nat(obj["length"], loc + ".length")
        if offset + length > sizes[name]:
            self.fail(loc, f"bytes {offset}..{offset + length} lie outside {name!r} "
                           f"({sizes[name]} bytes)")
        start = self.shape(obj["start"], loc + ".start")
        cshape = self.shape(obj["shape"], loc + ".shape")
        if len(start) != len(shape) or len(cshape) != len(shape):
            self.fail(loc, f"start/shape must have {len(shape)} dimensions like the array")
        for d, (s, n, full) in enumerate(zip(start, cshape, shape)):
            if s + n > full:
                self.fail(loc, f"dimension {d}: {s}+{n} exceeds the array's extent {full}")
        codec = obj["codec"]
        if codec not in self.codecs:
            leaf = loc.array_loc if isinstance(loc, _Loc) else loc
            newer = " (a newer format version's; upgrade uckpt)" if codec not in CODECS else ""
            self.fail(loc + ".codec", f"unknown codec {_show(codec)} for leaf {leaf}"
                                      f"{newer} (known here: {', '.join(self.codecs)})")
        expected = dtypes.itemsize(dtype)
        for n in cshape:
            expected *= n
        if codec == "raw" and length != expected:
            self.fail(loc + ".length", f"{length} bytes, but a raw {dtype} chunk of shape "
                                       f"{list(cshape)} holds {expected}")
        if codec != "raw" and not 0 < expected <= MAX_RATIO * length:
            self.fail(loc + ".length", f"a {codec} chunk of {length} bytes cannot hold the "
                                       f"{expected} bytes of a {dtype} box of shape "
                                       f"{list(cshape)} (a compressed chunk has elements and "
                                       f"at most {MAX_RATIO} raw bytes per stored byte)")
        checksum = self.need(obj["checksum"], loc + ".checksum", str, "a checksum string")
        try:
            parse_checksum(checksum)
        except ValueError as e:
            self.fail(loc + ".checksum", str(e))
        content = self.hash_text(obj["hash"], loc + ".hash") if v4 else ""
        return Chunk(name, offset, length, start, cshape, codec, checksum, content, base)

    def coverage(self, chunks, shape, loc) -> None:
        """Chunks must tile the array exactly: equal element counts, and no overlap (checked
        in O(n log n) for the layouts writers make, tiling.py)."""
        total = math.prod(shape)
        covered = sum(math.prod(c.shape) for c in chunks)
        if covered != total:
            self.fail(loc + ".chunks", f"chunks cover {covered} elements, the array has {total}")
        where = [k for k, c in enumerate(chunks) if all(c.shape)]  # chunks with elements
        boxes = [chunks[k] for k in where]
        if len(boxes) < 2:
            return
        # every number fits int64: extents and offsets were checked against the array's shape
        starts = np.array([c.start for c in boxes], dtype=np.int64).reshape(len(boxes), -1)
        ends = starts + np.array([c.shape for c in boxes], dtype=np.int64).reshape(len(boxes), -1)
        defect = find_defect(starts, ends, shape)
        if defect is None:
            return
        element = f"element {list(defect.index)}"
        if defect.boxes:
            i, j = (where[b] for b in defect.boxes)
            self.fail(loc + ".chunks", f"chunks [{i}] (start {list(chunks[i].start)}) and [{j}] "
                                       f"(start {list(chunks[j].start)}) overlap: both hold "
                                       f"{element}")
        self.fail(loc + ".chunks", f"chunks overlap: {element} is in none of them, although "
                                   "their element counts add up to the array's")

    def node(self, node, loc: str, arrays, depth: int) -> None:
        if depth > MAX_TREE_DEPTH:
            self.fail(loc, f"tree nests deeper than {MAX_TREE_DEPTH} levels")
        if type(node) is not dict:
            self.need(node, loc, dict, "a node object")
        kind = node.get("type")
        if kind == "value":
            self.fields(node, loc, ("type", "value"))
            v = node["value"]
            if not (v is None or isinstance(v, (bool, int, float, str))):
                self.fail(loc + ".value",
                          "a value node holds null, a boolean, a number or a string")
        elif kind == "float":
            self.fields(node, loc, ("type", "value"))
            if node["value"] not in ("nan", "inf", "-inf"):
                self.fail(loc + ".value", "expected 'nan', 'inf' or '-inf'")
        elif kind in ("array", "bytes"):
            self.fields(node, loc, ("type", "path"), ("numpy_scalar",))
            path = node["path"]
            if type(path) is not str:
                self.need(path, loc + ".path", str, "an array path")
            if path not in arrays:
                self.fail(loc + ".path", f"array {_key(path)} is not listed in 'arrays'")
            if "numpy_scalar" in node:
                self.need(node["numpy_scalar"], loc + ".numpy_scalar", bool, "a boolean")
                if node["numpy_scalar"] and arrays[path].shape != ():
                    self.fail(loc + ".numpy_scalar", "a NumPy scalar must refer to a 0-d array")
            if kind == "bytes" and (arrays[path].dtype != "uint8" or len(arrays[path].shape) != 1):
                self.fail(loc, "a bytes node must refer to a 1-d uint8 array")
        elif kind == "dict":
            self.fields(node, loc, ("type", "items"), ("key_type",))
            items = node["items"]
            if type(items) is not dict:
                self.need(items, loc + ".items", dict, "an object")
            if node.get("key_type", "str") not in ("str", "int"):
                self.fail(loc + ".key_type", "expected 'str' or 'int'")
            int_keys = node.get("key_type") == "int"
            for k, v in items.items():
                if not int_keys and depth < MAX_TREE_DEPTH and type(v) is dict and \
                        v.keys() == _ARRAY_NODE_KEYS and \
                        v["type"] == "array" and type(v["path"]) is str and v["path"] in arrays:
                    # a plain array leaf, valid (the common case, checked inline); it keeps
                    # the entry's path string and one "array", not copies of its own
                    v["type"], v["path"] = "array", arrays[v["path"]].path
                    continue
                if int_keys:
                    if len(k) > MAX_KEY_DIGITS + k.startswith("-"):
                        self.fail(loc + ".items", f"an int key of {len(k)} characters; the "
                                                  f"format allows at most {MAX_KEY_DIGITS} digits")
                    if not _INT_KEY.fullmatch(k) or k == "-0":
                        self.fail(loc + ".items", f"key {_key(k)} is not an integer in "
                                                  "canonical form")
                self.node(v, _Item(loc, k), arrays, depth + 1)
        elif kind in ("list", "tuple"):
            self.fields(node, loc, ("type", "items"))
            items = node["items"]
            if type(items) is not list:
                self.need(items, loc + ".items", list, "a list")
            for i, v in enumerate(items):
                self.node(v, _Item(loc, i), arrays, depth + 1)
        elif kind == "object":
            self.fields(node, loc, ("type", "adapter", "class", "state"))
            if type(node["adapter"]) is not str:
                self.need(node["adapter"], loc + ".adapter", str, "an adapter name")
            if type(node["class"]) is not str:
                self.need(node["class"], loc + ".class", str, "a class name")
            self.node(node["state"], _Item(loc, None), arrays, depth + 1)
        else:
            self.fail(loc + ".type", f"unknown node type {_show(kind)}")
