"""The structure record: how a tree is laid out in a format of named arrays, and back.

Formats that hold only named arrays (NPZ, HDF5, safetensors) or only what
``torch.save`` knows (Pickle) keep, beside the arrays, one JSON document (the
*structure record*, see docs/convert.md) so a round trip rebuilds the exact tree:

    {"uckpt_convert": 1,
     "tree": <a uckpt tree node, docs/format.md section 8>,
     "dtypes": {"<array name>": "bfloat16", ...},   # arrays stored as raw bits
     "extras": {"<path>": {...}, ...},              # HDF5 attributes, OrderedDict state, ...
     "wrapped_root": false}                         # true: the root was not a dict

The tree is the same JSON that uckpt's manifest uses: lists, tuples, int dict
keys, plain values (``lr``, ``betas``, strings, ``None``), NumPy scalars and
framework objects all survive formats that cannot express them.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from ..errors import CorruptCheckpointError, UnsupportedObjectError
from ..format.strict_json import loads as strict_json_loads
from ..tree.flatten import MAX_DEPTH, escape, join
from . import rawbits
from .interchange import Leaf, Obj, check_plain, key_text, nest, where

VERSION = 1
ROOT_KEY = "root"  # a root that is not a dict is stored under this key
_INT_KEY = re.compile(r"-?(0|[1-9][0-9]*)")


@dataclass
class Layout:
    """A tree as named arrays plus the skeleton that puts them back in place."""

    skeleton: Dict[str, Any]
    arrays: List[Tuple[str, Leaf]] = field(default_factory=list)  # name -> array to store
    values: List[Tuple[str, Any]] = field(default_factory=list)   # name -> plain value
    notes: List[str] = field(default_factory=list)
    objects: List[Tuple[str, str]] = field(default_factory=list)  # (path, class) of Obj nodes
    copies: Dict[str, str] = field(default_factory=dict)  # name -> name of the array it repeats
    wrapped_root: bool = False

    @property
    def nbytes(self) -> int:
        return sum(leaf.nbytes for _, leaf in self.arrays)


def layout(root: Any, *, copies: bool = False) -> Layout:
    """Lay ``root`` out as named arrays. A leaf met again (tied weights) refers to its first
    name; with ``copies`` it is also stored again under its own name (for readers of formats
    that have no way to say "the same array"), and ``Layout.copies`` says so."""
    wrapped = not isinstance(root, dict)
    if wrapped:
        root = {ROOT_KEY: root}
    out = Layout(skeleton={})
    out.skeleton = _node(root, [], 0, out, {}, copies)
    out.wrapped_root = wrapped
    return out


def _node(obj: Any, parts: List[str], depth: int, out: Layout, seen: Dict[int, str],
          copies: bool) -> Dict[str, Any]:
    if depth > MAX_DEPTH:
        raise UnsupportedObjectError(f"the tree nests deeper than {MAX_DEPTH} levels at "
                                     f"{where(parts)!r}")
    name = join(parts)
    if isinstance(obj, Leaf):
        first = seen.setdefault(id(obj), name)
        node: Dict[str, Any] = {"type": "array", "path": first}
        if first == name or copies:
            out.arrays.append((name, obj))
        if first != name and copies:
            out.copies[name] = first
        if obj.kind == "scalar":
            node["numpy_scalar"] = True
        return node
    if isinstance(obj, bytes):
        out.arrays.append((name, Leaf.of(np.frombuffer(obj, dtype=np.uint8))))
        return {"type": "bytes", "path": name}
    if isinstance(obj, float) and not math.isfinite(obj):
        out.values.append((name, obj))
        return {"type": "float", "value": "nan" if math.isnan(obj) else
                ("inf" if obj > 0 else "-inf")}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        check_plain(obj, parts)
        if obj is not None:
            out.values.append((name, obj))
        return {"type": "value", "value": obj}
    if isinstance(obj, Obj):
        out.objects.append((where(parts), obj.cls))
        return {"type": "object", "adapter": obj.adapter, "class": obj.cls,
                "state": _node(obj.state, parts, depth + 1, out, seen, copies)}
    if isinstance(obj, dict):
        keys = _keys(obj, parts, out)
        items = {k: _node(v, parts + [escape(k)], depth + 1, out, seen, copies)
                 for k, v in zip(keys, obj.values())}
        node = {"type": "dict", "items": items}
        if obj and all(type(k) is int for k in obj):
            node["key_type"] = "int"
        return node
    if isinstance(obj, (list, tuple)):
        return {"type": "tuple" if isinstance(obj, tuple) else "list",
                "items": [_node(v, parts + [str(i)], depth + 1, out, seen, copies)
                          for i, v in enumerate(obj)]}
    check_plain(obj, parts)  # raises: nothing else can be stored
    raise AssertionError("unreachable")


def _keys(obj: dict, parts: List[str], out: Layout) -> List[str]:
    """Keys as the skeleton writes them: all str, or all int (canonical decimal)."""
    keys = list(obj)
    names = [key_text(k, parts) for k in keys]
    if all(type(k) is str for k in keys) or all(type(k) is int for k in keys):
        return names
    if len(set(names)) != len(names):
        raise UnsupportedObjectError(
            f"dict at {where(parts)!r} has keys that are equal as text ({keys!r:.200})",
            hint="keys must be all str or all int", leaf=join(parts))
    out.notes.append(f"dict at {where(parts)!r} has keys of types "
                     f"{sorted({type(k).__name__ for k in keys})}: written as str")
    return names


# -- reading the skeleton back -----------------------------------------------------------------
class SkeletonError(CorruptCheckpointError):
    """The structure record is malformed."""


def build(node: Any, leaf_of: Callable[[str], Leaf], where_: str, depth: int = 0) -> Any:
    """The tree a skeleton describes; ``leaf_of(name)`` gives the stored array of a name."""
    def bad(msg: str):
        raise SkeletonError(f"{where_}: structure record: {msg}")

    if depth > MAX_DEPTH:
        bad(f"nests deeper than {MAX_DEPTH} levels")
    if not isinstance(node, dict) or not isinstance(node.get("type"), str):
        bad(f"a node is not an object with a type: {json.dumps(node)[:80]}")
    kind = node["type"]
    if kind == "value":
        value = node.get("value")
        if not (value is None or isinstance(value, (bool, int, float, str))):
            bad(f"value node holds {json.dumps(value)[:80]}")
        return value
    if kind == "float":
        if node.get("value") not in ("nan", "inf", "-inf"):
            bad(f"float node holds {node.get('value')!r}")
        return float(node["value"])
    if kind in ("array", "bytes"):
        name = node.get("path")
        if not isinstance(name, str):
            bad(f"{kind} node without a path")
        leaf = leaf_of(name)
        if kind == "bytes":
            if leaf.dtype != "uint8" or len(leaf.shape) != 1:
                bad(f"bytes node {name!r} refers to a {leaf.dtype} array of shape {leaf.shape}")
            return leaf.read().tobytes()
        if node.get("numpy_scalar"):
            if leaf.shape != ():
                bad(f"numpy_scalar on {name!r} of shape {leaf.shape}")
            return Leaf(leaf.dtype, leaf.shape, leaf.reader, "scalar")
        return leaf
    if kind == "dict":
        items = node.get("items")
        if not isinstance(items, dict):
            bad("dict node without items")
        if node.get("key_type", "str") == "int":
            if not all(_INT_KEY.fullmatch(k) and len(k) < 4300 for k in items):
                bad("int-keyed dict with a key that is not a decimal integer (of fewer than "
                    "4,300 digits)")
            return {int(k): build(v, leaf_of, where_, depth + 1) for k, v in items.items()}
        return {k: build(v, leaf_of, where_, depth + 1) for k, v in items.items()}
    if kind in ("list", "tuple"):
        items = node.get("items")
        if not isinstance(items, list):
            bad(f"{kind} node without items")
        built = [build(v, leaf_of, where_, depth + 1) for v in items]
        return tuple(built) if kind == "tuple" else built
    if kind == "object":
        if not isinstance(node.get("adapter"), str) or not isinstance(node.get("class"), str):
            bad("object node without adapter and class")
        return Obj(node["adapter"], node["class"], build(node.get("state"), leaf_of, where_,
                                                         depth + 1))
    bad(f"unknown node type {kind!r}")


def array_names(node: Any, out: Optional[set] = None, depth: int = 0) -> set:
    """Names of the arrays a skeleton refers to (a malformed one raises in :func:`build`)."""
    out = set() if out is None else out
    if depth > MAX_DEPTH or not isinstance(node, dict):
        return out
    if node.get("type") in ("array", "bytes") and isinstance(node.get("path"), str):
        out.add(node["path"])
    for child in _child_nodes(node):
        array_names(child, out, depth + 1)
    return out


def value_names(node: Any, parts: Optional[List[str]] = None, out: Optional[set] = None,
                depth: int = 0) -> set:
    """Names under which a format may also show the skeleton's plain values as arrays."""
    parts = [] if parts is None else parts
    out = set() if out is None else out
    if depth > MAX_DEPTH or not isinstance(node, dict):
        return out
    kind = node.get("type")
    if kind in ("value", "float"):
        out.add(join(parts))
    elif kind == "object":
        value_names(node.get("state"), parts, out, depth + 1)
    elif kind == "dict" and isinstance(node.get("items"), dict):
        for k, v in node["items"].items():
            value_names(v, parts + [escape(k)], out, depth + 1)
    elif kind in ("list", "tuple") and isinstance(node.get("items"), list):
        for i, v in enumerate(node["items"]):
            value_names(v, parts + [str(i)], out, depth + 1)
    return out


def _child_nodes(node: Dict[str, Any]) -> List[Any]:
    kind = node.get("type")
    if kind == "object":
        return [node.get("state")]
    items = node.get("items")
    if isinstance(items, dict):
        return list(items.values())
    if isinstance(items, list):
        return items
    return []


# -- the record as a document --------------------------------------------------------------------
def record(lay: Layout, extras: Dict[str, Dict[str, Any]],
           marks: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    return {"uckpt_convert": VERSION, "tree": lay.skeleton, "dtypes": dict(marks or {}),
            "copies": lay.copies, "extras": extras, "wrapped_root": lay.wrapped_root}


def dumps(doc: Dict[str, Any]) -> str:
    """The record as compact JSON text, which is valid Unicode (raises
    :class:`~uckpt.errors.UnsupportedObjectError` for text with an unpaired surrogate)."""
    text = json.dumps(doc, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise UnsupportedObjectError(f"the structure record would hold text that is not valid "
                                     f"Unicode: {text[max(0, e.start - 40):e.end + 40]!r}",
                                     hint="an attribute, a key or a value of the source holds "
                                          "an unpaired surrogate") from None
    return text


def loads(data, where_: str) -> Dict[str, Any]:
    """Parse and check a structure record (strict JSON; raises :class:`SkeletonError`)."""
    try:
        doc = strict_json_loads(data if isinstance(data, bytes) else data.encode("utf-8"))
    except (UnicodeError, ValueError, RecursionError) as e:
        raise SkeletonError(f"{where_}: the structure record is not valid JSON: {e}") from None
    try:
        dumps(doc)
    except (UnsupportedObjectError, ValueError, TypeError, RecursionError):
        raise SkeletonError(f"{where_}: the structure record holds text that is not valid "
                            "Unicode") from None
    if not isinstance(doc, dict) or doc.get("uckpt_convert") != VERSION:
        raise SkeletonError(f"{where_}: the structure record is not of version {VERSION}")
    if not isinstance(doc.get("tree"), dict) or not all(
            isinstance(doc.get(k, {}), dict) for k in ("dtypes", "extras", "copies")):
        raise SkeletonError(f"{where_}: the structure record lacks a tree, or its dtypes, "
                            "extras or copies are not objects")
    if not all(isinstance(v, str) for v in doc.get("dtypes", {}).values()):
        raise SkeletonError(f"{where_}: the structure record's dtypes are not names")
    return doc


def unwrap(root: Any, doc: Dict[str, Any]) -> Any:
    if doc.get("wrapped_root") and isinstance(root, dict) and ROOT_KEY in root:
        return root[ROOT_KEY]
    return root


NO_MATCH = object()  # what :func:`rebuild` returns when a record does not fit its file


def rebuild(doc: Dict[str, Any], stored: Dict[str, Any], where_: str,
            notes: List[str]) -> Any:
    """The tree of a record (which may be None: a pickle of None), or ``NO_MATCH`` (with a
    note) when the file's entries no longer match it (another tool changed the file): the
    caller then uses the file's own layout.

    ``stored`` maps the names of the file's entries to leaves (or, for entries that hold
    one of the record's plain values, to anything).
    """
    want = array_names(doc["tree"])
    extra = set(stored) - want - value_names(doc["tree"]) - set(doc.get("copies", {}))
    missing = {n for n in want if not isinstance(stored.get(n), Leaf)}
    if missing or extra:
        diff = sorted(missing)[:3] + sorted(extra)[:3]
        notes.append(f"{where_}: the structure record does not match the entries of the file "
                     f"(e.g. {', '.join(map(repr, diff))}); using the file's own layout")
        return NO_MATCH
    return unwrap(build(doc["tree"], stored.__getitem__, where_), doc)


def restore(tree, record: Dict[str, Any], items: List[Tuple[str, Any]], where_: str
            ) -> Tuple[List[Tuple[str, Any]], bool]:
    """Apply a structure record to a file's entries (name, leaf or value): arrays stored as
    raw bits get their marked dtypes back, and when the record matches the entries, its tree
    and extras replace ``tree.root`` and ``tree.extras``. Returns the entries, unmarked, and
    whether the record matched them."""
    marks = record.get("dtypes", {})
    items = [(k, rawbits.unmark(v, marks[k], where_)
              if k in marks and isinstance(v, Leaf) and v.dtype != marks[k] else v)
             for k, v in items]
    root = rebuild(record, dict(items), where_, tree.notes)
    if root is NO_MATCH:
        return items, False
    tree.root = root
    tree.extras = dict(record.get("extras", {}))
    return items, True


def settle(tree, record: Optional[Dict[str, Any]], items: List[Tuple[str, Any]],
           where_: str) -> None:
    """The tree of a format of named entries (NPZ, safetensors): the record's when there is
    one that matches, else the names nested on ``/``."""
    if record is not None:
        items, matched = restore(tree, record, items, where_)
        if matched:
            return
    tree.root = nest(items, tree.notes, where_)
