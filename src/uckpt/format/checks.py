"""Checks that the 1.0 parser and the legacy one share: every error names its member.

:class:`Checker` holds the rules of the members format 1.0 kept from the pre-release
versions (docs/format.md): the top-level scalars, ``files``, ``bases``, shapes and
dtypes, the tiling of an array by its chunks, and the tree of nodes.
"""
from __future__ import annotations

import math
import re
from typing import Any, Dict, NoReturn, Optional, Sequence, Tuple, Type

import numpy as np

from .. import dtypes
from ..codecs import hashing
from ..errors import ManifestError, UnsafePathError
from .model import Chunk, FileEntry
from .tiling import find_defect
from .values import MAX_DIMS, MAX_INT
from .values import dims as _dims, key as _key, show as _show

SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")  # used with fullmatch
CREATED = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?Z")
HASH = re.compile(hashing.PREFIX + "[0-9a-f]{32}")
_INT_KEY = re.compile(r"-?(0|[1-9][0-9]*)")
MAX_KEY_DIGITS = 4300  # int dict keys; Python's default limit for int(str)
MAX_TREE_DEPTH = 200  # levels of nested nodes in a manifest's tree
_MAX_LOC = 400  # characters of a member's location in an error message
_ARRAY_NODE_KEYS = frozenset(("type", "path"))
_Sets = Tuple[frozenset[str], frozenset[str]]
_FIELD_SETS: Dict[Tuple[Tuple[str, ...], Tuple[str, ...]], _Sets] = {}


def plain_name(name: str) -> bool:
    """Whether ``name`` is a plain file name inside its directory (section 3.3)."""
    return SAFE_NAME.fullmatch(name) is not None and ".." not in name


class Item:
    """``parent.items[key]`` (``parent.state`` for key None) of the tree, formatted only
    when an error needs it."""

    __slots__ = ("parent", "key")

    def __init__(self, parent: object, key: object) -> None:
        self.parent, self.key = parent, key

    def __str__(self) -> str:
        parts: list[str] = []
        item: object = self
        while isinstance(item, Item):  # (a loop: a tree may nest MAX_TREE_DEPTH levels)
            key = item.key
            parts.append(".state" if key is None else
                         f".items[{_key(key) if isinstance(key, str) else key}]")
            item = item.parent
        return str(item) + "".join(reversed(parts))

    def __add__(self, other: str) -> str:
        return str(self) + other


class Checker:
    """Strict validation of a manifest file ``where``; every error names the member as a
    JSON path."""

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, loc: object, msg: str, cls: Type[ManifestError] = ManifestError) -> NoReturn:
        text = str(loc)  # (an Item or a lazy location: formatted now)
        if len(text) > _MAX_LOC:  # (a location MAX_TREE_DEPTH levels deep: its ends say where)
            text = f"{text[:_MAX_LOC // 2]}...{text[-_MAX_LOC // 2:]}"
        raise cls(f"{self.where}: {text}: {msg}", path=self.where, field=text)

    def need(self, obj: Any, loc: object, typ: Any, what: str) -> Any:
        ok = isinstance(obj, typ) and not (typ in (int, (int,)) and isinstance(obj, bool))
        if not ok:
            self.fail(loc, f"expected {what}, got {_show(obj)}")
        return obj

    def nat(self, obj: Any, loc: object) -> int:
        """A non-negative integer that fits a signed 64-bit integer."""
        if not isinstance(obj, int) or isinstance(obj, bool) or obj < 0:
            self.fail(loc, f"expected a non-negative integer, got {_show(obj)}")
        if obj > MAX_INT:
            self.fail(loc, f"{_show(obj)} exceeds 2**63-1, the largest number the format "
                           "allows here")
        return obj

    def fields(self, obj: Dict[str, Any], loc: object, required: Tuple[str, ...],
               optional: Tuple[str, ...] = ()) -> None:
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

    def head(self, doc: Dict[str, Any]) -> Tuple[int, Optional[int]]:
        """Check ``generator``, ``created``, ``world_size``, ``step`` and ``metadata``;
        return ``(world_size, step)``."""
        self.need(doc["generator"], "generator", str, "a string")
        if not isinstance(doc["created"], str) or not CREATED.fullmatch(doc["created"]):
            self.fail("created", f"expected a UTC time like 2026-01-31T12:00:00.000000Z, got "
                                 f"{_show(doc['created'])}")
        world = self.nat(doc["world_size"], "world_size")
        if world < 1:
            self.fail("world_size", "must be at least 1")
        step = doc["step"]
        if step is not None:
            self.nat(step, "step")
        self.need(doc["metadata"], "metadata", dict, "a JSON object")
        return world, step

    def files(self, obj: Any, world: int) -> Dict[str, FileEntry]:
        self.need(obj, "files", dict, "an object of file name -> {rank, size}")
        out: Dict[str, FileEntry] = {}
        for name, entry in obj.items():
            loc = f"files[{_key(name)}]"
            if not plain_name(name):
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

    def hash_text(self, obj: Any, loc: str) -> str:
        if not isinstance(obj, str) or not HASH.fullmatch(obj):
            self.fail(loc, f"expected {hashing.PREFIX!r} + 32 lowercase hex digits, got "
                           f"{_show(obj)}")
        return obj

    def plain_name(self, name: str, loc: str, what: str) -> None:
        if not plain_name(name):
            self.fail(loc, f"{what} {_key(name)} is not a plain name inside the parent "
                           "directory" if what == "base" else
                      f"{what} {_key(name)} is not a plain file name inside the checkpoint "
                      "directory", UnsafePathError)

    def bases(self, obj: Any) -> Dict[str, Dict[str, int]]:
        """Earlier checkpoints referred to, name -> file -> size."""
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

    def bases_used(self, bases: Dict[str, Dict[str, int]], used: set[Tuple[Any, str]]) -> None:
        """Every base, and every file of one, is referred to by some chunk (``used``:
        the ``(base, file)`` pairs chunks refer to)."""
        for base, sizes in bases.items():
            for name in sizes:
                if (base, name) not in used:
                    self.fail(f"bases[{_key(base)}][{_key(name)}]",
                              "no chunk refers to this file of the base")

    def dtype_shape(self, entry: Dict[str, Any], loc: str) -> Tuple[str, Tuple[int, ...]]:
        return self.dtype(entry["dtype"], loc + ".dtype"), self.shape(entry["shape"],
                                                                      loc + ".shape")

    def dtype(self, obj: Any, loc: str) -> str:
        dtype = self.need(obj, loc, str, "a dtype name")
        if dtype not in dtypes.NAMES:
            self.fail(loc, f"unknown dtype {_key(dtype)} (known: {', '.join(dtypes.NAMES)})")
        return str(dtype)

    def array_size(self, dtype: str, shape: Tuple[int, ...], loc: str) -> int:
        """The dtype's itemsize, once the array's byte size is known to fit the format."""
        itemsize = size = dtypes.itemsize(dtype)
        for n in shape:
            size *= max(n, 1)
        if size > MAX_INT:  # NumPy counts a 0 as 1 here, and refuses such a shape
            self.fail(loc, f"{dtype} array of shape {_dims(shape)} is too large: its byte "
                           f"size (each 0 counted as 1) is {_show(size)}, more than 2**63-1")
        return itemsize

    def shape(self, obj: Any, loc: str) -> Tuple[int, ...]:
        self.need(obj, loc, list, "a list of non-negative integers")
        if len(obj) > MAX_DIMS:
            self.fail(loc, f"{len(obj)} dimensions; the format allows at most {MAX_DIMS} "
                           "(NumPy's limit)")
        return tuple(self.nat(s, f"{loc}[{i}]") for i, s in enumerate(obj))

    def coverage(self, chunks: Sequence[Chunk], shape: Tuple[int, ...], loc: str,
                 names: Any = None) -> None:
        """Chunks must tile the array exactly (:meth:`tiling` of their boxes)."""
        dims = (len(chunks), len(shape))
        starts = np.array([c.start for c in chunks], dtype=np.int64).reshape(dims)
        ends = starts + np.array([c.shape for c in chunks], dtype=np.int64).reshape(dims)
        self.tiling(starts, ends, shape, loc, names)

    def tiling(self, starts: np.ndarray, ends: np.ndarray, shape: Tuple[int, ...], loc: str,
               names: Any = None) -> None:
        """The boxes ``starts``..``ends`` (int64, one row a chunk; every value already
        checked against ``shape``) must tile the array exactly: equal element counts, and
        no overlap (checked in O(n log n) for the layouts writers make, tiling.py).
        ``names(k)``: how an error names chunk ``k`` (default ``chunks [k]``)."""
        total = math.prod(shape)
        extents = ends - starts
        covered = _elements(extents)
        if covered != total:
            self.fail(loc, f"chunks cover {covered} elements, the array has {total}")
        where = np.flatnonzero(extents.all(axis=1))  # chunks with elements
        if len(where) < 2:
            return
        defect = find_defect(starts[where], ends[where], shape)
        if defect is None:
            return
        element = f"element {list(defect.index)}"
        name = names or (lambda k: f"[{k}]")
        if defect.boxes:
            i, j = (int(where[b]) for b in defect.boxes)
            self.fail(loc, f"chunks {name(i)} (start {starts[i].tolist()}) and {name(j)} "
                           f"(start {starts[j].tolist()}) overlap: both hold {element}")
        self.fail(loc, f"chunks overlap: {element} is in none of them, although their "
                       "element counts add up to the array's")

    def tree(self, tree: Any, arrays: Dict[str, Any]) -> None:
        """Check the tree of nodes (its array nodes refer to ``arrays``)."""
        self.need(tree, "tree", dict, "a node object")
        if tree.get("type") != "dict":
            self.fail("tree", "the root node must be of type 'dict'")
        self.node(tree, "tree", arrays, 0)

    def node(self, node: Any, loc: object, arrays: Dict[str, Any], depth: int) -> None:
        if depth > MAX_TREE_DEPTH:
            self.fail(loc, f"tree nests deeper than {MAX_TREE_DEPTH} levels")
        if type(node) is not dict:
            self.need(node, loc, dict, "a node object")
        kind = node.get("type")
        if kind == "value":
            self.fields(node, loc, ("type", "value"))
            v = node["value"]
            if not (v is None or isinstance(v, (bool, int, float, str))):
                self.fail(f"{loc}.value",
                          "a value node holds null, a boolean, a number or a string")
        elif kind == "float":
            self.fields(node, loc, ("type", "value"))
            if node["value"] not in ("nan", "inf", "-inf"):
                self.fail(f"{loc}.value", "expected 'nan', 'inf' or '-inf'")
        elif kind in ("array", "bytes"):
            self.fields(node, loc, ("type", "path"), ("numpy_scalar",))
            path = node["path"]
            if type(path) is not str:
                self.need(path, f"{loc}.path", str, "an array path")
            if path not in arrays:
                self.fail(f"{loc}.path", f"array {_key(path)} is not listed in 'arrays'")
            if "numpy_scalar" in node:
                self.need(node["numpy_scalar"], f"{loc}.numpy_scalar", bool, "a boolean")
                if node["numpy_scalar"] and arrays[path].shape != ():
                    self.fail(f"{loc}.numpy_scalar", "a NumPy scalar must refer to a 0-d array")
            if kind == "bytes" and (arrays[path].dtype != "uint8" or len(arrays[path].shape) != 1):
                self.fail(loc, "a bytes node must refer to a 1-d uint8 array")
        elif kind == "dict":
            self.dict_node(node, loc, arrays, depth)
        elif kind in ("list", "tuple"):
            self.fields(node, loc, ("type", "items"))
            items = node["items"]
            if type(items) is not list:
                self.need(items, f"{loc}.items", list, "a list")
            for i, v in enumerate(items):
                self.node(v, Item(loc, i), arrays, depth + 1)
        elif kind == "object":
            self.fields(node, loc, ("type", "adapter", "class", "state"))
            if type(node["adapter"]) is not str:
                self.need(node["adapter"], f"{loc}.adapter", str, "an adapter name")
            if type(node["class"]) is not str:
                self.need(node["class"], f"{loc}.class", str, "a class name")
            self.node(node["state"], Item(loc, None), arrays, depth + 1)
        else:
            self.fail(f"{loc}.type", f"unknown node type {_show(kind)}")

    def dict_node(self, node: Dict[str, Any], loc: object, arrays: Dict[str, Any],
                  depth: int) -> None:
        self.fields(node, loc, ("type", "items"), ("key_type",))
        items = node["items"]
        if type(items) is not dict:
            self.need(items, f"{loc}.items", dict, "an object")
        if node.get("key_type", "str") not in ("str", "int"):
            self.fail(f"{loc}.key_type", "expected 'str' or 'int'")
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
                    self.fail(f"{loc}.items", f"an int key of {len(k)} characters; the "
                                              f"format allows at most {MAX_KEY_DIGITS} digits")
                if not _INT_KEY.fullmatch(k) or k == "-0":
                    self.fail(f"{loc}.items", f"key {_key(k)} is not an integer in "
                                              "canonical form")
            self.node(v, Item(loc, k), arrays, depth + 1)


def _elements(extents: np.ndarray) -> int:
    """The elements of boxes of ``extents`` (n x d, each at least 0), added up exactly;
    vectorised while every box's count stays below 2**62."""
    if not extents.size or float(np.prod(extents.astype(np.float64), axis=1).max()) >= 2.0**62:
        return sum(math.prod(e) for e in extents.tolist())
    counts = np.prod(extents, axis=1).astype(np.uint64)  # (each below 2**62: exact)
    mask = np.uint64(0xFFFFFFFF)  # halves: n below 2**32 sums of values below 2**32 fit
    return (int((counts >> np.uint64(32)).sum()) << 32) + int((counts & mask).sum())
