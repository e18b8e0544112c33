"""Orbax checkpoints (``StandardCheckpointer``, ``PyTreeCheckpointer``, ``CheckpointManager``
steps), read and written with TensorStore, the storage layer Orbax itself writes with.

Reading: :mod:`.orbax_dir` finds the item and parses its ``_METADATA``; each leaf is a
zarr array, in the item's OCDBT database (``use_ocdbt``, Orbax's default) or in a
directory of its own, named by its pytree keys joined with ``.``. Dict keys become
uckpt dict keys, sequence keys list indices; arrays keep their dtype (bfloat16 through
``ml_dtypes``) and are read one at a time when asked for; ``scalar`` leaves (numbers)
are NumPy scalars of their stored dtype. ``_METADATA``'s flags and custom metadata and the text of
``_CHECKPOINT_METADATA`` are kept in ``Tree.extras[""]["orbax.metadata"]``.

Writing: every array (and every NumPy scalar, int, float or bool, as an Orbax ``scalar``) becomes a
zarr v2 array (one chunk, zstd) in a new OCDBT database (or a directory per leaf when the
kept metadata says ``use_ocdbt: false``), written one leaf at a time, then ``_METADATA``
naming them, so ``ocp.StandardCheckpointer().restore(path)`` gives the same tree.

TensorStore is imported only here; without it (it comes with ``orbax-checkpoint``),
both are refused with :class:`~.errors.MissingDependencyError`.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

import numpy as np

from .. import dtypes
from ..errors import CorruptCheckpointError, UnsupportedObjectError
from . import orbax_dir, skeleton
from .errors import importable
from .interchange import Leaf, Obj, Tree, reading
from .progress import Progress

RECORD = "orbax.metadata"  # Tree.extras[""] key
INSTALL_HINT = "pip install orbax-checkpoint"
ARRAYS = ("np.ndarray", "jax.Array")
SCALAR = "scalar"
_KEPT = ("use_ocdbt", "use_zarr3", "store_array_data_equal_to_fill_value", "custom_metadata")


def tensorstore() -> Any:
    """The ``tensorstore`` module, or :class:`MissingDependencyError` with an install hint."""
    return importable("tensorstore", "reading or writing an Orbax checkpoint needs "
                      "tensorstore (installed with orbax-checkpoint)", INSTALL_HINT)


def _spec(item: Path, name: str, ocdbt: bool, every_chunk: bool = False) -> Dict[str, Any]:
    """TensorStore's spec of leaf ``name``; ``every_chunk``: a missing chunk is an error,
    not the fill value (Orbax stores every chunk: ``store_array_data_equal_to_fill_value``)."""
    if ocdbt:
        kv: Dict[str, Any] = {"driver": "ocdbt", "base": f"file://{item}/", "path": name}
    else:
        kv = {"driver": "file", "path": f"{item}/{name}/"}
    spec: Dict[str, Any] = {"driver": "zarr", "kvstore": kv}
    if every_chunk:
        spec["fill_missing_data_reads"] = False
    return spec


# -- reading -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Reading:
    context: Any  # a tensorstore.Context shared by the leaves (one OCDBT cache)
    every_chunk: bool


def _corrupt(item: Path, name: str, e: Exception) -> CorruptCheckpointError:
    return CorruptCheckpointError(f"{item}: reading leaf {name!r} failed: {e}", path=str(item),
                                  leaf=name, hint="the checkpoint's files are missing or "
                                  "damaged; use an earlier checkpoint")


def _open(ts: Any, item: Path, name: str, ocdbt: bool, ctx: Any) -> Any:
    try:
        return ts.open(_spec(item, name, ocdbt, every_chunk=ctx.every_chunk), open=True,
                       read=True, context=ctx.context).result()
    except Exception as e:  # tensorstore raises ValueError with its status text
        raise _corrupt(item, name, e) from None


def _leaf(ts: Any, item: Path, name: str, ocdbt: bool, ctx: Any) -> Leaf:
    store = _open(ts, item, name, ocdbt, ctx)
    dtype = dtypes.name_of(store.dtype.numpy_dtype)

    def read() -> np.ndarray:
        try:
            return np.asarray(_open(ts, item, name, ocdbt, ctx).read().result())
        except CorruptCheckpointError:
            raise
        except Exception as e:
            raise _corrupt(item, name, e) from None
    return Leaf(dtype, tuple(int(n) for n in store.shape), read)


def _nest(items: List[Tuple[List[Tuple[str, int]], Any]]) -> Any:
    """Pytree keys (key, key type) to nested dicts and lists (sequence keys 0..n-1)."""
    root: Dict[Any, Any] = {}
    kinds: Dict[int, int] = {}
    for keys, value in items:
        node = root
        for (key, kind), nxt in zip(keys, keys[1:] + [None]):
            kinds[id(node)] = kind
            k: Any = int(key) if kind == orbax_dir.SEQUENCE else key
            if nxt is None:
                node[k] = value
            else:
                node = node.setdefault(k, {})

    def fix(node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        out = {k: fix(v) for k, v in node.items()}
        if node and kinds.get(id(node)) == orbax_dir.SEQUENCE and \
                sorted(out) == list(range(len(out))):
            return [out[i] for i in range(len(out))]
        return out
    return fix(root)


def read(path: Union[str, "os.PathLike[str]"], fmt: str = "orbax") -> Tree:
    item = orbax_dir.locate(path)
    doc = orbax_dir.metadata(item)
    ts = tensorstore()
    ocdbt = bool(doc.get("use_ocdbt", True))
    # a chunk missing where the writer stored every chunk is lost data, not zeros
    ctx = _Reading(ts.Context(), bool(doc.get("store_array_data_equal_to_fill_value")))
    with reading(fmt) as tree:
        items: List[Tuple[List[Tuple[str, int]], Any]] = []
        for entry in doc["tree_metadata"].values():
            keys = [(k["key"], k["key_type"]) for k in entry["key_metadata"]]
            name = ".".join(k for k, _ in keys)
            kind = entry["value_metadata"].get("value_type")
            if entry["value_metadata"].get("skip_deserialize"):
                tree.notes.append(f"{item}: leaf {name!r} is marked skip_deserialize: left out")
                continue
            if kind in ARRAYS or kind == SCALAR:
                value: Any = _leaf(ts, item, name, ocdbt, ctx)
                if kind == SCALAR:
                    value.kind = "scalar"
            else:
                raise UnsupportedObjectError(f"{item}: leaf {name!r} is an Orbax {kind!r}, "
                                             "which uckpt does not read", path=str(item),
                                             leaf=name, hint="save it as an array")
            items.append((keys, value))
        tree.root = _nest(items)
        record = {k: doc[k] for k in _KEPT if k in doc}
        text = orbax_dir.checkpoint_metadata(item)
        if text is not None:
            record["checkpoint_metadata"] = text
        tree.extras[""] = {RECORD: record}
    return tree


# -- writing -----------------------------------------------------------------------------------
def _record(tree: Tree) -> Dict[str, Any]:
    record = tree.extras.get("", {}).get(RECORD)
    return record if isinstance(record, dict) else {}


def _walk(node: Any, keys: List[Tuple[str, int]]) -> Iterator[Tuple[List[Tuple[str, int]], Any]]:
    if isinstance(node, Obj):
        yield from _walk(node.state, keys)
    elif isinstance(node, dict) and node:
        for k, v in node.items():
            yield from _walk(v, keys + [(str(k), orbax_dir.DICT)])
    elif isinstance(node, (list, tuple)) and node:
        for i, v in enumerate(node):
            yield from _walk(v, keys + [(str(i), orbax_dir.SEQUENCE)])
    else:
        yield keys, node


def _entries(tree: Tree, notes: List[str]) -> List[Tuple[List[Tuple[str, int]], Any]]:
    """(pytree keys, leaf or number) of everything the checkpoint will hold."""
    if not isinstance(tree.root, (dict, list, tuple, Obj)):
        raise UnsupportedObjectError(f"an Orbax checkpoint holds a pytree; the tree's root is "
                                     f"a {type(tree.root).__name__}",
                                     hint="convert a checkpoint whose root is a dict")
    out, skipped = [], []
    for keys, node in _walk(tree.root, []):
        if isinstance(node, (Leaf, bool, int, float)) and keys:
            out.append((keys, node))
        else:
            skipped.append(".".join(k for k, _ in keys) or "<root>")
    if skipped:
        notes.append("an Orbax checkpoint written by uckpt holds arrays and numbers only: left "
                     "out " + ", ".join(skipped[:8]) + (", ..." if len(skipped) > 8 else ""))
    return out


def plan(tree: Tree) -> skeleton.Layout:
    tensorstore()  # refused before any work when it is missing
    lay = skeleton.layout(tree.root, copies=True)
    _entries(tree, lay.notes)
    return lay


def _scalar(node: Any) -> bool:
    return not isinstance(node, Leaf) or node.kind == "scalar"


def _array(node: Any) -> np.ndarray:
    if isinstance(node, Leaf):
        return node.read()
    if isinstance(node, bool):
        return np.asarray(node, dtype=np.bool_)
    if isinstance(node, int):
        if not -(1 << 63) <= node < (1 << 63):
            raise UnsupportedObjectError(f"the int {node} does not fit an int64 array")
        return np.asarray(node, dtype=np.int64)
    return np.asarray(node, dtype=np.float64)


def write(tree: Tree, lay: skeleton.Layout, path: Path, progress: Progress) -> None:
    """Write the checkpoint into ``path`` (a new empty directory)."""
    ts = tensorstore()
    record = _record(tree)
    ocdbt = bool(record.get("use_ocdbt", True))
    ctx = ts.Context()
    meta: Dict[str, Any] = {}
    for keys, node in _entries(tree, []):
        arr = _array(node)
        name = ".".join(k for k, _ in keys)
        spec = _spec(path, name, ocdbt)
        spec["metadata"] = {"shape": list(arr.shape), "chunks": list(arr.shape),
                            "compressor": {"id": "zstd", "level": 1}}
        store = ts.open(spec, create=True, dtype=ts.dtype(arr.dtype.name),
                        context=ctx).result()
        store.write(arr).result()
        meta[str(tuple(k for k, _ in keys))] = {
            "key_metadata": [{"key": k, "key_type": t} for k, t in keys],
            "value_metadata": {"value_type": SCALAR if _scalar(node) else "np.ndarray",
                               "skip_deserialize": False}}
        progress.advance(node.nbytes if isinstance(node, Leaf) else 0)
        del arr
    doc = {"tree_metadata": meta, "use_ocdbt": ocdbt, "use_zarr3": False,
           "store_array_data_equal_to_fill_value": True,
           "custom_metadata": record.get("custom_metadata")}
    (path / orbax_dir.METADATA).write_text(json.dumps(doc), encoding="utf-8")
    text: Optional[str] = record.get("checkpoint_metadata")
    if isinstance(text, str):
        (path / orbax_dir.CHECKPOINT_METADATA).write_text(text, encoding="utf-8")
