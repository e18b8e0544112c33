"""State trees <-> the manifest's skeleton plus a table of array leaves.

``flatten`` walks a state mapping, asks adapters to turn framework objects into
trees, and returns a JSON-able *skeleton* (see docs/format.md, "tree") and the
array leaves by path. ``decode`` goes back from a skeleton to a Python tree,
with a caller-supplied function producing each array leaf (the loaded array, or
an :class:`~uckpt.adapter.ArraySpec` when only the layout is wanted).

Paths join the components from the root with ``/``; a ``/`` or ``~`` inside a
key is escaped as ``~1`` / ``~0`` (as in JSON Pointer, RFC 6901).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List

import numpy as np

from .. import dtypes
from ..adapter import DeviceArray
from ..errors import UckptError, UnsupportedDtypeError, UnsupportedObjectError
from .shard import PerRank, Shard

MAX_DEPTH = 200


def escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def unescape(part: str) -> str:
    return part.replace("~1", "/").replace("~0", "~")


def join(path_keys: List[str]) -> str:
    return "/".join(path_keys)


def _where(path_keys: List[str]) -> str:
    return join(path_keys) or "<root>"


@dataclass
class FlatState:
    skeleton: Dict[str, Any]
    arrays: Dict[str, Any] = field(default_factory=dict)  # ndarray, or DeviceArray until staged
    #: sharded leaves (:class:`~uckpt.tree.shard.Shard`): path -> (start, global shape) of the
    #: local array in ``arrays``; every other array is whole
    placements: Dict[str, Any] = field(default_factory=dict)
    #: where :class:`~uckpt.tree.shard.PerRank` subtrees are (escaped path keys)
    per_rank: List[List[str]] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())


def flatten(state: Mapping, rank: int = 0) -> FlatState:
    """Flatten a state mapping; arrays that share memory and layout are stored once.

    ``rank`` is where :class:`~uckpt.tree.shard.PerRank` values go: the subtree is an
    int-keyed dict holding this rank's value under ``rank``."""
    if not isinstance(state, Mapping):
        raise UnsupportedObjectError(
            f"state must be a mapping of names to objects, got {type(state).__name__}",
            hint='pass e.g. {"model": model, "optimizer": optimizer, "epoch": 3}')
    return _Flattener(rank).run(state)


class _Flattener:
    def __init__(self, rank: int = 0) -> None:
        self.rank = rank
        self.per_rank: List[List[str]] = []  # where PerRank dicts are (escaped path keys)
        self.arrays: Dict[str, np.ndarray] = {}
        self.seen: Dict[tuple, str] = {}  # (address, shape, strides, dtype) -> path

        self.placements: Dict[str, Any] = {}

    def run(self, state: Mapping) -> FlatState:
        return FlatState(self.node(state, [], 0), self.arrays, placements=self.placements,
                    per_rank=self.per_rank)

    def node(self, obj: Any, path_keys: List[str], depth: int) -> Dict[str, Any]:
        if depth > MAX_DEPTH:
            raise UnsupportedObjectError(
                f"state nests deeper than {MAX_DEPTH} levels at {_where(path_keys)!r}",
                hint="an adapter may be returning the object itself", leaf=join(path_keys))
        if isinstance(obj, np.generic):  # before float: np.float64 subclasses float
            return dict(self.array(np.asarray(obj), path_keys), numpy_scalar=True)
        if obj is None or isinstance(obj, (bool, str)):
            return {"type": "value", "value": obj}
        if isinstance(obj, int):
            return {"type": "value", "value": int(obj)}
        if isinstance(obj, float):
            if math.isfinite(obj):
                return {"type": "value", "value": float(obj)}
            return {"type": "float", "value": "nan" if math.isnan(obj) else
                    ("inf" if obj > 0 else "-inf")}
        if isinstance(obj, (np.ndarray, DeviceArray)):
            return self.array(obj, path_keys)
        if isinstance(obj, PerRank):
            self.per_rank.append(list(path_keys))
            sub = self.node(obj.value, path_keys + [str(self.rank)], depth + 1)
            return {"type": "dict", "key_type": "int", "items": {str(self.rank): sub}}
        if isinstance(obj, Shard):
            return self.array(obj.array, path_keys, (obj.offsets, obj.global_shape))
        if isinstance(obj, (bytes, bytearray)):
            node = self.array(np.frombuffer(bytes(obj), dtype=np.uint8), path_keys)
            return dict(node, type="bytes")
        if isinstance(obj, Mapping):
            return self.mapping(obj, path_keys, depth)
        if isinstance(obj, (list, tuple)):
            items = [self.node(v, path_keys + [str(i)], depth + 1) for i, v in enumerate(obj)]
            return {"type": "tuple" if isinstance(obj, tuple) else "list", "items": items}
        from ..registry import find_adapter

        adapter = find_adapter(obj)
        if adapter is not None:
            cls = type(obj)
            return {"type": "object", "adapter": adapter.name,
                    "class": f"{cls.__module__}.{cls.__qualname__}",
                    "state": self.node(self.extract(adapter, obj, path_keys), path_keys, depth + 1)}
        if hasattr(obj, "__dlpack__") or hasattr(obj, "__array_interface__"):
            try:
                arr = np.from_dlpack(obj) if hasattr(obj, "__dlpack__") else np.asarray(obj)
            except (TypeError, BufferError, RuntimeError):
                arr = None
            if arr is not None:
                return self.array(arr, path_keys)
        from ..registry import no_adapter_error

        raise no_adapter_error(obj, join(path_keys), saving=True)

    @staticmethod
    def extract(adapter: Any, obj: Any, path_keys: List[str]) -> Any:
        try:
            return adapter.extract(obj)
        except UckptError as e:  # the adapter does not know where its object sits
            e.at_path(join(path_keys))  # names the path in e itself
            raise

    def mapping(self, obj: Mapping, path_keys: List[str], depth: int) -> Dict[str, Any]:
        keys = list(obj.keys())
        if all(isinstance(k, str) for k in keys):
            key_type = "str"
        elif all(isinstance(k, int) and not isinstance(k, bool) for k in keys):
            key_type = "int"
        else:
            bad = next((k for k in keys if not isinstance(k, (str, int)) or isinstance(k, bool)),
                       None)
            if bad is None:  # str and int keys mixed: "0" and 0 would be one key on disk
                raise UnsupportedObjectError(
                    f"dict at {_where(path_keys)!r} mixes str and int keys", leaf=join(path_keys),
                    hint="keys must be all str or all int")
            raise UnsupportedObjectError(
                f"dict at {_where(path_keys)!r} has key {bad!r} of type {type(bad).__name__}",
                hint="keys must be all str or all int", leaf=join(path_keys))
        items = {}
        for k in keys:
            name = str(k)
            items[name] = self.node(obj[k], path_keys + [escape(name)], depth + 1)
        node: Dict[str, Any] = {"type": "dict", "items": items}
        if key_type == "int":
            node["key_type"] = "int"
        return node

    def array(self, arr, path_keys: List[str], box=None) -> Dict[str, Any]:
        path = join(path_keys)
        try:
            dtypes.name_of(arr.dtype)
        except UnsupportedDtypeError as e:
            raise UnsupportedDtypeError(f"leaf {path!r}: {e.args[0]}", leaf=path) from None
        if arr.nbytes:
            key: tuple[Any, ...]
            if isinstance(arr, DeviceArray):
                key = ("device", arr.key, arr.shape, arr.dtype)
            else:
                key = (arr.__array_interface__["data"][0], arr.shape, arr.strides, arr.dtype)
            key += (box,)
            if key in self.seen:  # tied / shared: store once, refer twice
                return {"type": "array", "path": self.seen[key]}
            self.seen[key] = path
        if path in self.arrays:
            raise UnsupportedObjectError(f"two leaves map to the same path {path!r}", leaf=path)
        self.arrays[path] = arr
        if box is not None:
            self.placements[path] = box
        return {"type": "array", "path": path}


def decode(node: Dict[str, Any], leaf: Callable[[Dict[str, Any]], Any]) -> Any:
    """Turn a skeleton node back into a Python tree; ``leaf(node)`` makes array leaves."""
    kind = node["type"]
    if kind == "value":
        return node["value"]
    if kind == "float":
        return float(node["value"])
    if kind in ("array", "bytes"):
        return leaf(node)
    if kind == "dict":
        items = node["items"]
        if node.get("key_type") == "int":
            return {int(k): decode(v, leaf) for k, v in items.items()}
        # (array leaves inline: half the nodes of a model's tree, one call fewer each)
        return {k: leaf(v) if v["type"] == "array" else decode(v, leaf)
                for k, v in items.items()}
    if kind == "list":
        return [decode(v, leaf) for v in node["items"]]
    if kind == "tuple":
        return tuple(decode(v, leaf) for v in node["items"])
    if kind == "object":
        return decode(node["state"], leaf)
    raise ValueError(f"unknown node type {kind!r}")  # manifest validation prevents this


def array_leaf_value(node: Dict[str, Any], arr: Any) -> Any:
    """Apply a leaf node's flags (bytes, NumPy scalar) to a loaded array."""
    if node["type"] == "bytes":
        return np.asarray(arr).tobytes()
    if node.get("numpy_scalar"):
        return np.asarray(arr)[()]
    return arr
