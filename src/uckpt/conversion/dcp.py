"""PyTorch Distributed Checkpoint (DCP) directories, as a source, read without torch.

A DCP directory holds ``.metadata`` (a pickle of dataclasses from
``torch.distributed.checkpoint``) and data files ``__<rank>_<n>.distcp``. Each
tensor is one or more chunks (one per writing rank), each a whole ``torch.save``
archive at an offset of a data file; each non-tensor value is a ``torch.save``
archive too. ``.metadata`` goes through the restricted unpickler with stand-ins
for exactly the metadata classes (plus dtypes, ``torch.Size``, layouts and
``pathlib`` paths); every chunk through the torch.save reader, whose allowlist
admits tensors only. ``planner_data`` (flat key -> path) restores the nesting
DCP flattened; optimizer ``state`` keys become the parameter ids again
(:mod:`.dcp_optim`).

Chunks whose storage carries DCP transforms (compression extensions) and data
files written in the safetensors serialization are refused.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np

from .. import dtypes
from ..errors import CorruptCheckpointError, UnsupportedObjectError
from .errors import UnsafeInputError
from .dcp_optim import fix_state_keys
from .fileio import RandomAccessFile, require_fits
from .interchange import Leaf, Tree, check_shape, reading
from .torch_pickle import TORCH_DTYPES, OTHER_TORCH_DTYPES, TorchDtype, _refused_dtype, \
    load_archive, normalize, torch_size
from .unpickler import StandIn, restricted_load

METADATA = ".metadata"
_MD = "torch.distributed.checkpoint.metadata."
_MAX_METADATA = 1 << 30


class Record:
    """Stands in for one of DCP's metadata dataclasses: keeps its fields, runs nothing."""

    kind = "record"

    def __new__(cls, *args) -> "Record":  # NEWOBJ calls __new__ only
        self = super().__new__(cls)
        self.fields: Dict[str, Any] = {}
        self.state: Any = args or None
        return self

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict) and \
                (state[0] is None or isinstance(state[0], dict)):
            state = {**(state[0] or {}), **state[1]}  # (dict, slots)
        if isinstance(state, dict):
            self.fields.update(state)
        else:
            self.state = state

    def get(self, name: str, default: Any = None) -> Any:
        return self.fields.get(name, default)

    def graph_children(self) -> List[Any]:
        """What :func:`.limits.check_graph` counts: field names and values, and the state."""
        return [*self.fields, *self.fields.values(), self.state]

    def __eq__(self, other: Any) -> bool:  # MetadataIndex compares fqn and offset only
        return isinstance(other, Record) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def _key(self) -> tuple:
        offset = self.fields.get("offset")
        return (self.kind, self.fields.get("fqn"), tuple(offset) if offset is not None else None)


def _record(name: str) -> type:
    return type(name, (Record,), {"kind": name})


def _path(*parts) -> str:
    return "/".join(str(p) for p in parts)


def _layout(name: Any) -> str:
    return str(name)


def _identity(value: Any) -> Any:
    return value


def allowed() -> Dict[str, Any]:
    out: Dict[str, Any] = {
        _MD + n: _record(n) for n in ("Metadata", "TensorStorageMetadata", "BytesStorageMetadata",
                                      "ChunkStorageMetadata", "TensorProperties", "MetadataIndex",
                                      "StorageMeta")}
    out["torch.distributed.checkpoint.filesystem._StorageInfo"] = _record("_StorageInfo")
    out[_MD + "_MEM_FORMAT_ENCODING"] = StandIn(_identity)
    out["torch.serialization._get_layout"] = StandIn(_layout)
    out["torch.Size"] = StandIn(torch_size)
    out.update({f"torch.{n}": TorchDtype(n) for n in TORCH_DTYPES})
    out.update({f"torch.{n}": _refused_dtype(n) for n in OTHER_TORCH_DTYPES})
    for cls in ("PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath", "Path"):
        out[f"pathlib.{cls}"] = StandIn(_path)
    return out


class _Files:
    """The data files of a DCP directory, each opened once."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.open: Dict[str, RandomAccessFile] = {}

    def get(self, name: Any) -> RandomAccessFile:
        if not isinstance(name, str) or not name or "/" in name or "\\" in name or \
                name.startswith(".") or name in (".", ".."):
            raise UnsafeInputError(f"{self.directory}: {METADATA} names the data file "
                                   f"{name!r}, which is not a file of the checkpoint directory",
                                   path=str(self.directory))
        if name not in self.open:
            self.open[name] = RandomAccessFile(self.directory / name, follow=False)
        return self.open[name]

    def close(self) -> None:
        for f in self.open.values():
            f.close()
        self.open.clear()


def read(path, fmt: str = "dcp") -> Tree:
    directory = Path(path)
    mpath = directory / METADATA
    where = str(mpath)
    raf = RandomAccessFile(mpath, follow=False)
    try:
        require_fits(raf.size, _MAX_METADATA, METADATA, where)
        data = raf.pread(raf.size, 0)
    finally:
        raf.close()
    md = restricted_load(data, allowed(), where)
    if not isinstance(md, Record) or md.kind != "Metadata":
        raise CorruptCheckpointError(f"{where}: not DCP metadata", path=where)
    files = _Files(directory)
    with reading(fmt, files.close) as tree:
        storage: Dict[Tuple[Any, Any], Any] = {}
        for index, info in (md.get("storage_data") or {}).items():
            if not isinstance(index, Record) or not isinstance(info, Record):
                raise CorruptCheckpointError(f"{where}: malformed storage_data", path=where)
            storage[index._key()[1:]] = info
        items: List[Tuple[str, Any]] = []
        for fqn, meta in (md.get("state_dict_metadata") or {}).items():
            if not isinstance(meta, Record):
                raise CorruptCheckpointError(f"{where}: malformed metadata of {fqn!r}",
                                             path=where)
            if meta.kind == "BytesStorageMetadata":
                info = storage.get((fqn, None))
                items.append((fqn, _value(files, info, fqn, where, tree)))
            elif meta.kind == "TensorStorageMetadata":
                items.append((fqn, _tensor(files, storage, meta, fqn, where, tree)))
            else:
                raise CorruptCheckpointError(f"{where}: {fqn!r} has metadata of kind "
                                             f"{meta.kind}", path=where)
        tree.root = fix_state_keys(_nest(items, md.get("planner_data"), tree.notes, where),
                                   tree.notes, where)
    return tree


def _chunk_archive(files: _Files, info: Any, fqn: str, where: str, tree: Tree) -> Any:
    if not isinstance(info, Record):
        raise CorruptCheckpointError(f"{where}: no storage for {fqn!r}", path=where)
    if info.get("transform_descriptors"):
        raise UnsupportedObjectError(f"{where}: {fqn!r} is stored with DCP transforms "
                                     f"{info.get('transform_descriptors')!r}, which uckpt "
                                     "cannot read", path=where)
    raf = files.get(info.get("relative_path"))
    offset, length = info.get("offset"), info.get("length")
    if type(offset) is not int or type(length) is not int or offset < 0 or length < 0:
        raise CorruptCheckpointError(f"{where}: bad offset/length for {fqn!r}", path=where)
    require_fits(offset + length, raf.size, f"the data of {fqn!r}", raf.path)
    raw, _, archive = load_archive(raf, offset, length, f"{raf.path} ({fqn})")
    tree.closers.append(archive.close)
    return raw


def _value(files: _Files, info: Any, fqn: str, where: str, tree: Tree) -> Any:
    return normalize(_chunk_archive(files, info, fqn, where, tree), [fqn], {})


def _tensor(files: _Files, storage: Dict, meta: Record, fqn: str, where: str,
            tree: Tree) -> Leaf:
    props = meta.get("properties")
    state = props.state if isinstance(props, Record) else None
    dtype = state[0] if isinstance(state, tuple) and state else \
        (props.get("dtype") if isinstance(props, Record) else None)
    if not isinstance(dtype, TorchDtype):
        raise CorruptCheckpointError(f"{where}: {fqn!r} has no dtype", path=where)
    shape = check_shape(meta.get("size") or (), dtypes.itemsize(dtype.name), where,
                        f"tensor {fqn!r}")
    chunks = meta.get("chunks") or []
    if not isinstance(chunks, list) or not all(isinstance(c, Record) for c in chunks):
        raise CorruptCheckpointError(f"{where}: the chunks of {fqn!r} are malformed",
                                     path=where)
    parts = []
    for chunk in chunks:
        offsets, sizes = chunk.get("offsets") or (), chunk.get("sizes") or ()
        if not all(isinstance(v, (tuple, list)) and len(v) == len(shape) and
                   all(type(i) is int and i >= 0 for i in v) for v in (offsets, sizes)) or \
                any(o + s > n for o, s, n in zip(offsets, sizes, shape)):
            raise CorruptCheckpointError(f"{where}: a chunk of {fqn!r} lies outside it",
                                         path=where)
        offsets, sizes = tuple(offsets), tuple(sizes)
        leaf = _chunk_archive(files, storage.get((fqn, offsets)), fqn, where, tree)
        if not isinstance(leaf, Leaf) or leaf.dtype != dtype.name or leaf.shape != sizes:
            raise CorruptCheckpointError(f"{where}: a chunk of {fqn!r} does not hold a "
                                         f"{dtype.name} tensor of shape {sizes}", path=where)
        parts.append((offsets, leaf))
    if sum(math.prod(leaf.shape) for _, leaf in parts) != math.prod(shape):
        raise CorruptCheckpointError(f"{where}: the chunks of {fqn!r} do not cover it",
                                     path=where)
    if len(parts) == 1:
        return parts[0][1]

    def read() -> np.ndarray:
        out = np.empty(shape, dtype=dtypes.to_numpy(dtype.name))
        for offsets, leaf in parts:
            out[tuple(slice(o, o + n) for o, n in zip(offsets, leaf.shape))] = leaf.read()
        return out

    return Leaf(dtype.name, shape, read)


def _nest(items: List[Tuple[str, Any]], planner: Any, notes: List[str], where: str) -> Any:
    """DCP's flat keys back to nested containers by ``planner_data`` (key -> path), as
    ``torch.distributed.checkpoint`` unflattens them: a str component is a dict key, an int
    one a list index. (DCP writes every dict key as a str, so int keys come back as str.)"""
    if not isinstance(planner, dict) or not all(
            isinstance(planner.get(k), tuple) and planner[k] and
            all(type(p) in (str, int) for p in planner[k]) for k, _ in items):
        return dict(items)
    root: Dict[str, Any] = {}
    for key, value in items:
        path, node = planner[key], root
        for here, nxt in zip(path, path[1:] + (None,)):
            if isinstance(node, list) != (type(here) is int) or \
                    (type(here) is int and not 0 <= here < len(items)):
                notes.append(f"{where}: the planner path of {key!r} does not fit the others; "
                             "flat DCP keys are kept")
                return dict(items)
            if isinstance(node, list):
                node.extend([None] * (here + 1 - len(node)))
            if nxt is None:
                node[here] = value
            else:
                if (node.get(here) if isinstance(node, dict) else node[here]) is None:
                    node[here] = {} if type(nxt) is str else []
                node = node[here]
    return root
