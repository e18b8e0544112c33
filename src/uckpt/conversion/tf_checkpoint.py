"""TensorFlow's own checkpoint format (``tf.train.Checkpoint``, ``tf.train.CheckpointManager``,
tf_keras ``save_weights`` in TF format), read and written with TensorFlow's own code.

Reading: the files are found and checked by :mod:`.tf_prefix`; the tensors are read one
at a time with ``tf.train.load_checkpoint`` (TensorFlow's ``CheckpointReader``). Keys map
to uckpt paths as :mod:`.tf_names` says; a scalar string tensor is a ``bytes`` value, a
string tensor of other shapes a nested list of ``bytes``. The serialized object graph
(``_CHECKPOINTABLE_OBJECT_GRAPH``) is not a tensor of the tree: it is kept, base64, in
``Tree.extras[""]["tf.checkpoint"]`` (in a uckpt target's manifest metadata), with the
shapes of string tensors and whether the keys were object-based.

Writing: every array and plain value becomes a tensor under the key its path maps to
(:func:`.tf_names.to_key`), written with ``tf.raw_ops.SaveV2`` in parts of at most
:data:`GROUP_BYTES` (so a conversion holds one part, not the checkpoint) that
``tf.raw_ops.MergeV2Checkpoints`` merges into one prefix, as TensorFlow's sharded save
does. The object graph is the kept one when its keys are exactly the keys written (a
round trip TF -> uckpt -> TF), else one built from the keys (a node per path component,
slots attached to their optimizer), so ``tf.train.Checkpoint(...).restore`` matches
object by object either way.

TensorFlow is imported only here, when a checkpoint of this format is read or written;
without it, both are refused with :class:`~.errors.MissingDependencyError`.
"""
from __future__ import annotations

import base64
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from .. import dtypes
from ..errors import CorruptCheckpointError, UnsupportedDtypeError, UnsupportedObjectError
from . import skeleton, tf_names, tf_prefix
from .errors import importable
from .interchange import Leaf, Obj, Tree, check_shape, nest, reading
from .progress import Progress

RECORD = "tf.checkpoint"  # Tree.extras[""] key: object_graph, names, strings
INSTALL_HINT = "pip install tensorflow-cpu"
#: tensors are written in parts of at most this many bytes (a larger tensor: a part alone)
GROUP_BYTES = 64 << 20
check_target = tf_prefix.check_target
write_output = tf_prefix.write_atomically


def tensorflow() -> Any:
    """The ``tensorflow`` module, or :class:`MissingDependencyError` with an install hint."""
    return importable("tensorflow", "reading or writing a TensorFlow checkpoint needs "
                      "TensorFlow", INSTALL_HINT)


# -- reading -----------------------------------------------------------------------------------
def _read_error(prefix: Path, key: str, e: Exception) -> CorruptCheckpointError:
    shard = tf_prefix.tf_error_path(prefix)
    where = shard or f"{prefix}.data-*"
    return CorruptCheckpointError(f"{where}: reading {key!r} failed: {e} (the data shard is "
                                  "truncated or damaged)", path=where, leaf=key,
                                  hint="use an earlier checkpoint, or save this one again")


def _tensor(reader: Any, prefix: Path, key: str) -> Any:
    try:
        return reader.get_tensor(key)
    except Exception as e:  # TensorFlow raises IndexError, RuntimeError, OpError, ...
        raise _read_error(prefix, key, e) from None


def _leaf(reader: Any, prefix: Path, key: str, dtype: str, shape: Tuple[int, ...]) -> Leaf:
    def read() -> np.ndarray:
        return np.asarray(_tensor(reader, prefix, key))
    return Leaf(dtype, shape, read)


def _strings(value: Any) -> Any:
    """A string tensor's value as ``bytes`` (a scalar) or nested lists of ``bytes``."""
    arr = np.asarray(value, dtype=object)
    return arr.item() if arr.ndim == 0 else arr.tolist()


def read(path, fmt: str = "tf") -> Tree:
    prefix = tf_prefix.locate(path)
    tf = tensorflow()
    try:
        reader = tf.train.load_checkpoint(str(prefix))
        kinds, shapes = reader.get_variable_to_dtype_map(), reader.get_variable_to_shape_map()
    except Exception as e:  # DataLossError and the like, from TensorFlow's C++ reader
        raise CorruptCheckpointError(f"{tf_prefix.index_of(prefix)}: TensorFlow cannot read "
                                     f"the index: {e}", path=str(tf_prefix.index_of(prefix))
                                     ) from None
    stored = sum(shard.stat().st_size for shard in tf_prefix.check(prefix))
    with reading(fmt) as tree:
        record: Dict[str, Any] = {}
        keys = sorted(kinds)
        if tf_names.GRAPH_KEY in kinds:
            graph = _tensor(reader, prefix, tf_names.GRAPH_KEY)
            record["object_graph"] = base64.b64encode(bytes(graph)).decode("ascii")
            keys.remove(tf_names.GRAPH_KEY)
        object_based = all(tf_names.is_object_key(k) for k in keys)
        record["names"] = "object" if object_based else "name"
        strings: Dict[str, List[int]] = {}
        items: List[Tuple[str, Any]] = []
        for key in keys:
            name = kinds[key].name
            shape = tuple(int(n) for n in shapes[key])
            if name == "string":
                value = _strings(_tensor(reader, prefix, key))
                if shape:
                    strings[key] = list(shape)
            elif name in dtypes.NAMES:
                check_shape(shape, dtypes.itemsize(name), str(prefix), f"tensor {key!r}")
                if dtypes.nbytes(name, shape) > stored:  # never allocated: TF would try
                    raise CorruptCheckpointError(
                        f"{prefix}: tensor {key!r} declares {dtypes.nbytes(name, shape)} "
                        f"bytes, but its data shards hold only {stored}", path=str(prefix),
                        leaf=key, hint="the index is damaged; use an earlier checkpoint")
                value = _leaf(reader, prefix, key, name, shape)
            else:
                raise UnsupportedDtypeError(f"{prefix}: tensor {key!r} has dtype {name!r}, "
                                            "which uckpt cannot hold", path=str(prefix),
                                            leaf=key)
            parts = tf_names.to_path(key) if object_based else key.split("/")
            items.append(("/".join(parts), value))
        if strings:
            record["strings"] = strings
        tree.root = nest(items, tree.notes, str(prefix))
        tree.extras[""] = {RECORD: record}
    return tree


# -- writing -----------------------------------------------------------------------------------
def _record(tree: Tree) -> Dict[str, Any]:
    record = tree.extras.get("", {}).get(RECORD)
    return record if isinstance(record, dict) else {}


def _is_strings(node: Any) -> bool:
    """Whether ``node`` is a string tensor's nested lists of ``bytes``."""
    return all(_is_strings(x) if isinstance(x, list) else isinstance(x, bytes) for x in node)


def _walk(node: Any, parts: List[str], strings: Dict[str, Any], by_name: bool
          ) -> Iterator[Tuple[List[str], Any]]:
    """(raw path components, node) of every array, plain value and string tensor."""
    if isinstance(node, Obj):
        yield from _walk(node.state, parts, strings, by_name)
    elif isinstance(node, (dict, list, tuple)) and not node and \
            _key(parts, by_name) not in strings:
        yield parts, None  # an empty container: no tensor can stand for it
    elif isinstance(node, dict):
        for k, v in node.items():
            yield from _walk(v, parts + [str(k)], strings, by_name)
    elif isinstance(node, (list, tuple)) and not (
            isinstance(node, list) and parts and _is_strings(node) and
            (node or _key(parts, by_name) in strings)):
        for i, v in enumerate(node):
            yield from _walk(v, parts + [str(i)], strings, by_name)
    else:
        yield parts, node


def _key(parts: List[str], by_name: bool) -> str:
    return "/".join(parts) if by_name else tf_names.to_key(parts)


def _entries(tree: Tree, notes: List[str]) -> List[Tuple[str, Any]]:
    """(checkpoint key, leaf or value) of everything the checkpoint will hold."""
    record = _record(tree)
    by_name = record.get("names") == "name"
    out: List[Tuple[str, Any]] = []
    skipped = []
    root = tree.root.state if isinstance(tree.root, Obj) else tree.root
    if not isinstance(root, dict):
        raise UnsupportedObjectError(
            f"a TensorFlow checkpoint names its tensors; the tree's root is a "
            f"{type(root).__name__}, not a mapping", hint="convert a checkpoint whose "
            "root is a dict (or choose one with --select)")
    for parts, node in _walk(root, [], record.get("strings", {}), by_name) if root else ():
        if node is None:
            skipped.append("/".join(parts))
            continue
        if isinstance(node, str):
            notes.append(f"{'/'.join(parts)!r}: a str is written as a TensorFlow string "
                         "tensor (UTF-8), which reads back as bytes")
        out.append((_key(parts, by_name), node))
    if skipped:
        notes.append("a TensorFlow checkpoint holds no None and no empty container: left out "
                     + ", ".join(skipped[:8]) + (", ..." if len(skipped) > 8 else ""))
    return out


def plan(tree: Tree) -> skeleton.Layout:
    tensorflow()  # refused before any work when TensorFlow is missing
    lay = skeleton.layout(tree.root, copies=True)
    _entries(tree, lay.notes)
    return lay


def _tensor_of(tf: Any, key: str, node: Any, strings: Dict[str, Any]) -> Any:
    if isinstance(node, Leaf):
        return tf.constant(node.read())
    if isinstance(node, (bytes, str)):
        return tf.constant(node, dtype=tf.string)
    if isinstance(node, list):
        shape = strings.get(key)
        arr = np.array(node, dtype=object)
        return tf.constant(arr.reshape(shape) if shape is not None else arr, dtype=tf.string)
    if isinstance(node, bool):
        return tf.constant(node, dtype=tf.bool)
    if isinstance(node, int):
        if not -(1 << 63) <= node < (1 << 63):
            raise UnsupportedObjectError(f"{key!r}: the int {node} does not fit an int64 tensor",
                                         leaf=key)
        return tf.constant(node, dtype=tf.int64)
    if isinstance(node, float):
        return tf.constant(node, dtype=tf.float64)
    raise UnsupportedObjectError(f"{key!r}: a {type(node).__name__} cannot be a TensorFlow "
                                 "tensor", leaf=key)


def _nbytes(node: Any) -> int:
    return node.nbytes if isinstance(node, Leaf) else 64


def _groups(entries: List[Tuple[str, Any]]) -> List[List[Tuple[str, Any]]]:
    out: List[List[Tuple[str, Any]]] = [[]]
    size = 0
    for key, node in entries:
        if out[-1] and size + _nbytes(node) > GROUP_BYTES:
            out.append([])
            size = 0
        out[-1].append((key, node))
        size += _nbytes(node)
    return out


def object_graph(tf: Any, record: Dict[str, Any], keys: List[str],
                 notes: Optional[List[str]] = None) -> Optional[bytes]:
    """The serialized object graph to write with ``keys``: the kept one when its keys are
    exactly ``keys``, else one built from them; None for a name-based checkpoint."""
    from tensorflow.core.protobuf import trackable_object_graph_pb2 as pb

    if record.get("names") == "name":
        return None
    kept = record.get("object_graph")
    if isinstance(kept, str):
        graph = pb.TrackableObjectGraph()
        graph.ParseFromString(base64.b64decode(kept))
        named = {a.checkpoint_key for n in graph.nodes for a in n.attributes}
        if named == set(keys):
            return base64.b64decode(kept)
        if notes is not None:
            notes.append("the kept TensorFlow object graph does not name the tensors written "
                         "(a part was selected or renamed): a new one is built from the keys")
    return _built_graph(pb, keys)


def _built_graph(pb: Any, keys: List[str]) -> bytes:
    """A ``TrackableObjectGraph`` with a node per path component of ``keys``, each
    attribute on its node, each slot variable attached to its optimizer."""
    graph = pb.TrackableObjectGraph()
    graph.nodes.add()
    ids: Dict[Tuple[str, ...], int] = {(): 0}

    def node_of(parts: Tuple[str, ...]) -> int:
        if parts not in ids:
            parent = node_of(parts[:-1])
            ids[parts] = len(graph.nodes)
            graph.nodes.add()
            graph.nodes[parent].children.add(node_id=ids[parts], local_name=parts[-1])
        return ids[parts]

    slots = []
    for key in keys:
        parts = key.split("/")
        obj = parts[:-2]
        if tf_names.SLOT in obj and 0 < obj.index(tf_names.SLOT) <= len(obj) - 3:
            i = obj.index(tf_names.SLOT)
            node = len(graph.nodes)
            graph.nodes.add()
            slots.append((node_of(tuple(obj[i + 1:-1])), node_of(tuple(obj[:i])), obj[-1], node))
        else:
            node = node_of(tuple(obj))
        graph.nodes[node].attributes.add(name=parts[-1], full_name="/".join(obj),
                                         checkpoint_key=key)
    for optimizer, variable, name, node in slots:
        graph.nodes[optimizer].slot_variables.add(original_variable_node_id=variable,
                                                  slot_name=name, slot_variable_node_id=node)
    data: bytes = graph.SerializeToString()
    return data


def write(tree: Tree, lay: skeleton.Layout, prefix: Path, progress: Progress) -> None:
    """Write the checkpoint at ``prefix`` (a new prefix in an empty directory)."""
    tf = tensorflow()
    record = _record(tree)
    entries = _entries(tree, [])
    graph = object_graph(tf, record, [k for k, _ in entries])
    strings = record.get("strings", {})
    parts = []
    for i, group in enumerate(_groups(entries)):
        names = [k for k, _ in group]
        tensors = [_tensor_of(tf, k, v, strings) for k, v in group]
        if graph is not None and i == 0:
            names.append(tf_names.GRAPH_KEY)
            tensors.append(tf.constant(graph, dtype=tf.string))
        part = f"{prefix}_part-{i:05d}"
        tf.raw_ops.SaveV2(prefix=part, tensor_names=names, shape_and_slices=[""] * len(names),
                          tensors=tensors)
        parts.append(part)
        progress.advance(sum(v.nbytes for _, v in group if isinstance(v, Leaf)))
        del tensors
    tf.raw_ops.MergeV2Checkpoints(checkpoint_prefixes=parts, destination_prefix=str(prefix),
                                  delete_old_dirs=False)
