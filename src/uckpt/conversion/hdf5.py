"""HDF5: Keras 3 ``.weights.h5``, Keras legacy ``.h5`` (``save_weights`` / ``save``) and
generic h5py trees of groups and datasets (h5py is imported only here).

Reading walks the file group by group and checks every link before following
it: external links are refused, soft links only to datasets inside the file
are followed, a hard link back to an ancestor group (a cycle) is refused.
Datasets with external storage, or virtual datasets mapping another file, are
refused; a dataset's declared size is checked against the file (or, when it is
compressed, against what its stored chunks can expand to) before anything is
allocated. Attributes are kept (``Tree.extras``) so Keras' ``layer_names``,
``weight_names`` and ``model_config`` survive a round trip.

Writing makes one group per dict, list or tuple (in order: groups track
creation order), one dataset per array or plain value, sets the attributes
kept from an HDF5 source back, stores bfloat16/float8 as raw bits with a
``uckpt_dtype`` attribute, and puts the structure record in the root
attribute ``uckpt`` (or, when larger than an attribute can be, a ``uint8``
dataset ``__uckpt__``).
"""
from __future__ import annotations

import base64
import os
from typing import Any, Dict, List, Optional

import numpy as np

from .. import dtypes
from ..errors import UnsupportedDtypeError, UnsupportedObjectError
from ..tree import escape, join
from . import rawbits, skeleton
from .errors import UnsafeInputError, missing
from .fileio import MAX_DEFLATE_RATIO, require_fits
from .model import Leaf, Tree, reading
from .npz import NATIVE, marks_for, rawbits_note, value_array
from .progress import Progress

RECORD_ATTR = "uckpt"
RECORD_DATASET = "__uckpt__"
DTYPE_ATTR = "uckpt_dtype"
ATTRS = "hdf5.attrs"
_MAX_ATTR = 60000  # HDF5 attributes in compact storage hold at most 64 KiB


def h5py_module():
    try:
        import h5py
    except ImportError:
        raise missing("h5py", "reading and writing HDF5") from None
    return h5py


# -- attributes as JSON ------------------------------------------------------------------------
def encode_attr(value: Any) -> Optional[Dict[str, Any]]:
    """An attribute value as JSON that :func:`decode_attr` turns back into the same HDF5
    type; None when it has no such form (compound, references)."""
    if isinstance(value, str):
        return {"t": "str", "v": value}
    if isinstance(value, bytes):  # also np.bytes_: a fixed-length string
        return {"t": "bytes", "v": value.decode("latin1")}
    arr = np.asarray(value)
    if arr.dtype.kind == "O":
        items = arr.ravel().tolist()
        if all(isinstance(i, str) for i in items):
            return {"t": "strs", "shape": list(arr.shape), "v": items}
        return None
    if arr.dtype.kind in "biufcS" and arr.dtype.names is None:
        return {"t": "array" if isinstance(value, np.ndarray) else "scalar",
                "dtype": arr.dtype.str, "shape": list(arr.shape),
                "data": base64.b64encode(arr.tobytes()).decode("ascii")}
    return None


def decode_attr(doc: Dict[str, Any], h5py) -> Any:
    kind = doc.get("t")
    if kind == "str":
        return str(doc["v"])
    if kind == "bytes":
        return np.bytes_(str(doc["v"]).encode("latin1"))
    if kind == "strs":
        return np.array(doc["v"], dtype=h5py.string_dtype()).reshape(doc["shape"])
    if kind in ("array", "scalar"):
        arr = np.frombuffer(base64.b64decode(doc["data"]), dtype=np.dtype(doc["dtype"]))
        arr = arr.reshape(doc["shape"]).copy()
        return arr if kind == "array" else arr[()]
    raise ValueError(f"unknown attribute encoding {kind!r}")


# -- reading -----------------------------------------------------------------------------------
class _Reader:
    def __init__(self, h5py, f, path: str, tree: Tree) -> None:
        self.h5py, self.f, self.path, self.tree = h5py, f, path, tree
        self.size = os.path.getsize(path)
        self.stored: Dict[str, Any] = {}  # "/".join(HDF5 names) -> leaf or value

    def refuse(self, name: str, what: str) -> None:
        raise UnsafeInputError(f"{self.path}: {name}: {what}; refused", path=self.path,
                               leaf=name, hint="copy the data into the file itself (h5py: "
                                               "read it and write it as a plain dataset)")

    def attrs(self, obj, parts: List[str]) -> None:
        kept: Dict[str, Any] = {}
        for key in obj.attrs:
            if key in (RECORD_ATTR, DTYPE_ATTR) and (obj.name == "/" or key == DTYPE_ATTR):
                continue
            try:
                enc = encode_attr(obj.attrs[key])
            except (OSError, TypeError, ValueError):
                enc = None
            if enc is None:
                self.tree.notes.append(f"{self.path}: attribute {key!r} of {obj.name} has a "
                                       "type that cannot be kept; dropped")
            else:
                kept[key] = enc
        if kept:
            self.tree.extras.setdefault(join(parts), {})[ATTRS] = kept

    def group(self, group, parts: List[str], names: List[str], ancestors: List[Any]) -> dict:
        self.attrs(group, parts)
        out: Dict[str, Any] = {}
        h5py = self.h5py
        for name in group.keys():
            if not parts and name == RECORD_DATASET:
                continue
            full = f"{group.name.rstrip('/')}/{name}"
            link = group.get(name, getlink=True)
            if isinstance(link, h5py.ExternalLink):
                self.refuse(full, f"is an external link to {link.filename}:{link.path}")
            obj = group.get(name)
            if isinstance(link, h5py.SoftLink):
                if obj is None:
                    self.refuse(full, f"is a dangling soft link to {link.path}")
                if isinstance(obj, h5py.Group):
                    self.refuse(full, f"is a soft link to the group {link.path}")
            child_parts, child_names = parts + [escape(name)], names + [name]
            if isinstance(obj, h5py.Group):
                if any(obj.id == a.id for a in ancestors) or len(ancestors) > 200:
                    self.refuse(full, "links back to a group that contains it (a cycle)")
                out[name] = self.group(obj, child_parts, child_names, ancestors + [obj])
            elif isinstance(obj, h5py.Dataset):
                self.attrs(obj, child_parts)
                out[name] = self.dataset(obj, full)
                self.stored["/".join(child_names)] = out[name]
            else:
                self.tree.notes.append(f"{self.path}: {full} is neither a group nor a "
                                       "dataset; skipped")
        return out

    def dataset(self, ds, full: str) -> Any:
        h5py = self.h5py
        if ds.external:
            self.refuse(full, f"keeps its data in external file(s) "
                              f"{', '.join(str(e[0]) for e in ds.external)}")
        if ds.is_virtual:
            for src in ds.virtual_sources():
                if src.file_name not in (".", self.f.filename):
                    self.refuse(full, f"is a virtual dataset mapping {src.file_name}")
        if ds.shape is None:  # an empty (null) dataspace
            return None
        if h5py.check_string_dtype(ds.dtype) is not None:
            if ds.shape != ():
                raise UnsupportedDtypeError(f"{self.path}: {full} is an array of strings; only "
                                            "single strings can be converted", leaf=full)
            return ds.asstr()[()]
        try:
            stored = dtypes.name_of(ds.dtype)
        except UnsupportedDtypeError as e:
            raise UnsupportedDtypeError(f"{self.path}: {full}: {e.args[0]}", leaf=full) from None
        shape = tuple(ds.shape)
        self.check_size(ds, full, dtypes.nbytes(stored, shape))
        np_dtype = dtypes.to_numpy(stored)

        def read() -> np.ndarray:
            arr = np.empty(shape, dtype=np_dtype)
            if arr.size:
                ds.read_direct(arr)
            return arr

        leaf = Leaf(stored, shape, read)
        mark = ds.attrs.get(DTYPE_ATTR)
        if mark is not None:
            leaf = rawbits.unmark(leaf, mark.decode() if isinstance(mark, bytes) else
                                  str(mark), f"{self.path}: {full}")
        return leaf

    def check_size(self, ds, full: str, declared: int) -> None:
        h5py = self.h5py
        plist = ds.id.get_create_plist()
        if plist.get_nfilters():
            limit = max(ds.id.get_storage_size(), 1) * MAX_DEFLATE_RATIO
            require_fits(declared, limit, f"compressed dataset {full}", self.path)
            return
        offset = ds.id.get_offset() if plist.get_layout() == h5py.h5d.CONTIGUOUS else None
        require_fits(declared, self.size - (offset or 0), f"dataset {full}", self.path)


def read(path, fmt: str = "hdf5") -> Tree:
    h5py = h5py_module()
    path = os.fspath(path)
    f = h5py.File(path, "r")
    with reading(fmt, f.close) as tree:
        reader = _Reader(h5py, f, path, tree)
        raw = reader.group(f, [], [], [f])
        record = _record(f, path)
        tree.root = raw
        if record is not None:
            skeleton.restore(tree, record, list(reader.stored.items()), path)
    return tree


def _record(f, path: str) -> Optional[dict]:
    text = f.attrs.get(RECORD_ATTR)
    if text is None and RECORD_DATASET in f:
        text = np.asarray(f[RECORD_DATASET][()]).tobytes()
    if text is None:
        return None
    return skeleton.loads(text if isinstance(text, (str, bytes)) else str(text), path)


# -- writing -----------------------------------------------------------------------------------
def plan(tree: Tree) -> skeleton.Layout:
    lay = skeleton.layout(tree.root, copies=True)
    for name, _ in lay.arrays + lay.values:
        bad = [p for p in name.split("/") if p in ("", ".")]
        if bad or name == RECORD_DATASET:
            raise UnsupportedObjectError(f"{name!r} cannot be an HDF5 path (empty or '.' "
                                         "component, or a reserved name)", leaf=name)
    rawbits_note(lay, NATIVE, "HDF5")
    return lay


def write(tree: Tree, lay: skeleton.Layout, path, progress: Progress) -> None:
    h5py = h5py_module()
    arrays, values = dict(lay.arrays), dict(lay.values)
    marks = marks_for(lay, NATIVE)
    with h5py.File(path, "w", track_order=True) as f:
        def node(sk: Dict[str, Any], g, name: Optional[str], parts: List[str]) -> None:
            kind = sk["type"]
            here = join(parts)
            if kind == "object":
                return node(sk["state"], g, name, parts)
            obj = None
            if kind in ("dict", "list", "tuple"):
                obj = g if name is None else g.create_group(name, track_order=True)
                items = sk["items"].items() if kind == "dict" else \
                    ((str(i), v) for i, v in enumerate(sk["items"]))
                for k, v in items:
                    node(v, obj, escape(k), parts + [escape(k)])
            elif kind in ("array", "bytes"):
                leaf = arrays[here]
                obj = g.create_dataset(name, data=rawbits.encode(leaf.read(), leaf.dtype, NATIVE))
                if here in marks:
                    obj.attrs[DTYPE_ATTR] = marks[here]
                progress.advance(leaf.nbytes)
            elif here in values:
                value = values[here]
                if isinstance(value, str):
                    obj = g.create_dataset(name, data=value, dtype=h5py.string_dtype())
                elif value_array(value) is not None:
                    obj = g.create_dataset(name, data=value_array(value))
            if obj is not None:
                for key, enc in tree.extras.get(here, {}).get(ATTRS, {}).items():
                    obj.attrs[key] = decode_attr(enc, h5py)

        node(lay.skeleton, f, None, [])
        text = skeleton.dumps(skeleton.record(lay, tree.extras, marks))
        if len(text.encode("utf-8")) <= _MAX_ATTR:
            f.attrs[RECORD_ATTR] = text
        else:
            f.create_dataset(RECORD_DATASET,
                             data=np.frombuffer(text.encode("utf-8"), dtype=np.uint8))

