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

import os
from contextlib import ExitStack, contextmanager
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from .. import dtypes
from ..errors import CorruptCheckpointError, UckptError, UnsupportedDtypeError, \
    UnsupportedObjectError
from ..tree.flatten import MAX_DEPTH, escape, join
from . import limits, names, rawbits, skeleton
from .errors import LimitExceededError, UnsafeInputError, missing
from .fileio import open_regular, require_fits
from .hdf5_values import decode_attr, h5_file, read_values
from .limits import check_ratio
from .interchange import Leaf, Tree, check_shape, reading
from .npz import NATIVE, marks_for, rawbits_note, value_array
from .options import WriteOptions
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


# -- reading -----------------------------------------------------------------------------------
class _Pending:
    """A dataset whose value waits for the child's reading (a string; an array that may
    carry a ``uckpt_dtype`` mark), and every place in the tree that holds it."""

    def __init__(self, full: str, stored: str, value: Any) -> None:
        self.full, self.stored, self.value = full, stored, value
        self.places: List[Tuple[dict, str]] = []


class _Reader:
    """Walks the file's groups and datasets in this process (no attribute or string value
    is read here: :mod:`.hdf5_values` reads those in a child of bounded memory)."""

    def __init__(self, h5py, f, path: str, tree: Tree) -> None:
        self.h5py, self.f, self.path, self.tree = h5py, f, path, tree
        self.size = os.path.getsize(path)
        self.limits = limits.current()
        self.count = limits.budget_counter(self.size, path, self.limits, "the HDF5 tree")
        self.stored: Dict[str, Any] = {}  # "/".join(HDF5 names) -> leaf or value
        self.seen: Dict[Any, Tuple[Any, int, str]] = {}  # object -> (node, nodes in it, path)
        self.nodes = 0
        self.with_attrs: Dict[str, List[str]] = {}  # HDF5 path -> tree path parts
        self.strings: List[str] = []
        self.pending: List[_Pending] = []

    def refuse(self, name: str, what: str) -> None:
        raise UnsafeInputError(f"{self.path}: {name}: {what}; refused", path=self.path,
                               leaf=name, hint="copy the data into the file itself (h5py: "
                                               "read it and write it as a plain dataset)")

    def attrs(self, obj, full: str, parts: List[str]) -> None:
        """Note an object whose attributes are to be read (counting them reads no value)."""
        if len(obj.attrs):
            self.with_attrs.setdefault(full, parts)

    def group(self, group, parts: List[str], names: List[str], ancestors: List[Any]) -> dict:
        """The dict of ``group``. A group or dataset hard-linked at several places is read
        once and counted, with everything under it, at each place against ``max_nodes``."""
        if len(ancestors) > MAX_DEPTH:
            raise LimitExceededError(f"{self.path}: {group.name} nests deeper than "
                                     f"{MAX_DEPTH} levels", path=self.path, limit="max_depth")
        self.attrs(group, group.name if not parts else "/" + "/".join(names), parts)
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
            if not isinstance(obj, (h5py.Group, h5py.Dataset)):
                self.tree.notes.append(f"{self.path}: {full} is neither a group nor a "
                                       "dataset; skipped")
                continue
            if isinstance(obj, h5py.Group) and any(obj.id == a.id for a in ancestors):
                self.refuse(full, "links back to a group that contains it (a cycle)")
            self.add(2)  # the key and its value
            if obj.id in self.seen:  # a hard link to what was read already
                out[name], inside, first = self.seen[obj.id]
                if isinstance(out[name], _Pending):
                    out[name].places.append((out, name))
                self.add(inside)
                if inside:
                    self.tree.notes.append(f"{self.path}: {full} is the group {first} again (a "
                                           f"hard link); its attributes are kept at {first} only")
                continue
            start = self.nodes
            child_parts, child_names = parts + [escape(name)], names + [name]
            if isinstance(obj, h5py.Group):
                out[name] = self.group(obj, child_parts, child_names, ancestors + [obj])
            else:
                self.attrs(obj, full, child_parts)
                value = self.dataset(obj, full)
                stored = "/".join(child_names)
                if full in self.with_attrs or (self.strings and self.strings[-1] == full):
                    value = _Pending(full, stored, value)
                    value.places.append((out, name))
                    self.pending.append(value)
                out[name] = self.stored[stored] = value
            self.seen[obj.id] = (out[name], self.nodes - start, full)
        return out

    def add(self, n: int) -> None:
        self.nodes += n
        self.count(n)

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
            self.check_size(ds, full, ds.dtype.itemsize)  # a fixed-length string's size
            self.strings.append(full)
            return None  # read by the child (see finish)
        try:
            stored = dtypes.name_of(ds.dtype)
        except UnsupportedDtypeError as e:
            raise UnsupportedDtypeError(f"{self.path}: {full}: {e.args[0]}", leaf=full) from None
        shape = check_shape(ds.shape, dtypes.itemsize(stored), self.path, f"dataset {full}")
        self.check_size(ds, full, dtypes.nbytes(stored, shape))
        np_dtype = dtypes.to_numpy(stored)

        def read() -> np.ndarray:
            arr = np.empty(shape, dtype=np_dtype)
            if arr.size:
                with h5py_errors(self.path, full):
                    ds.read_direct(arr)
            return arr

        return Leaf(stored, shape, read)

    def finish(self) -> Dict[str, Any]:
        """Read the attributes and strings in a child; put them in place (and arrays marked
        with ``uckpt_dtype`` as their dtypes). Returns the root's attributes, encoded."""
        values = read_values(self.path, list(self.with_attrs), self.strings)
        attrs, strings = values["attrs"], values["strings"]
        for p in self.pending:
            value = strings.get(p.full, p.value)
            mark = attrs.get(p.full, {}).get(DTYPE_ATTR)
            if mark is not None and isinstance(value, Leaf):
                value = rawbits.unmark(value, str((mark or {}).get("v")),
                                       f"{self.path}: {p.full}")
            for container, key in p.places:
                container[key] = value
            self.stored[p.stored] = value
        for full, parts in self.with_attrs.items():
            kept: Dict[str, Any] = {}
            for key, enc in attrs.get(full, {}).items():
                if key == DTYPE_ATTR or (key == RECORD_ATTR and full == "/"):
                    continue
                if enc is None:
                    self.tree.notes.append(f"{self.path}: attribute {key!r} of {full} has a "
                                           "type that cannot be kept; dropped")
                else:
                    kept[key] = enc
            if kept:
                self.tree.extras.setdefault(join(parts), {})[ATTRS] = kept
        return attrs.get("/", {})

    def check_size(self, ds, full: str, declared: int) -> None:
        h5py = self.h5py
        plist = ds.id.get_create_plist()
        if plist.get_nfilters():
            check_ratio(declared, ds.id.get_storage_size(), f"compressed dataset {full}",
                        self.path, self.limits)
            return
        offset = ds.id.get_offset() if plist.get_layout() == h5py.h5d.CONTIGUOUS else None
        require_fits(declared, self.size - (offset or 0), f"dataset {full}", self.path)


@contextmanager
def h5py_errors(path: str, what: str = "") -> Iterator[None]:
    """HDF5's own errors on a damaged file (h5py raises OSError, KeyError, ValueError,
    RuntimeError, ...) as :class:`~uckpt.errors.CorruptCheckpointError`."""
    try:
        yield
    except UckptError:
        raise
    except (OSError, KeyError, ValueError, RuntimeError, TypeError, IndexError,
            AttributeError, OverflowError, UnicodeError, MemoryError) as e:
        where = f"{path}: {what}" if what else path
        raise CorruptCheckpointError(f"{where}: HDF5 cannot read it: {type(e).__name__}: {e}",
                                     path=path, hint="the file is damaged, or not HDF5") from None


def read(path, fmt: str = "hdf5") -> Tree:
    h5py = h5py_module()
    path = os.fspath(path)
    os.close(open_regular(path))  # no FIFO, device or directory reaches HDF5
    opened = ExitStack()
    with h5py_errors(path):
        f = opened.enter_context(h5_file(h5py, path))
    with reading(fmt, opened.close) as tree, h5py_errors(path):
        reader = _Reader(h5py, f, path, tree)
        raw = reader.group(f, [], [], [f])
        record = _record(reader, reader.finish().get(RECORD_ATTR))
        tree.root = raw
        if record is not None:
            skeleton.restore(tree, record, list(reader.stored.items()), path)
    return tree


def _record(reader: _Reader, attr: Optional[Dict[str, Any]]) -> Optional[dict]:
    """The structure record: the root attribute (as the child read it), else the dataset."""
    f, path = reader.f, reader.path
    text: Any = None
    if attr is not None:
        text = attr.get("v")
        if not isinstance(text, str):
            raise skeleton.SkeletonError(f"{path}: the structure record is not text")
        text = text.encode("latin1") if attr.get("t") == "bytes" else text
    elif RECORD_DATASET in f:
        ds = f[RECORD_DATASET]
        if not isinstance(ds, reader.h5py.Dataset) or ds.dtype != np.uint8 or \
                len(ds.shape or ()) != 1:
            raise skeleton.SkeletonError(f"{path}: /{RECORD_DATASET} is not a uint8 array")
        reader.check_size(ds, "/" + RECORD_DATASET, ds.shape[0])
        text = np.asarray(ds[()]).tobytes()
    return None if text is None else skeleton.loads(text, path)


# -- writing -----------------------------------------------------------------------------------
def plan(tree: Tree) -> skeleton.Layout:
    lay = skeleton.layout(tree.root, copies=True)
    names.check_output([name for name, _ in lay.arrays + lay.values], "an HDF5 file",
                       "an HDF5 path")
    if any(name == RECORD_DATASET for name, _ in lay.arrays + lay.values):
        raise UnsupportedObjectError(f"{RECORD_DATASET!r} cannot be an HDF5 path: the name is "
                                     "reserved for uckpt's structure record",
                                     leaf=RECORD_DATASET)
    rawbits_note(lay, NATIVE, "HDF5")
    with_nul = [name for name, value in lay.values if not _storable(value)]
    if with_nul:
        lay.notes.append(f"HDF5 strings cannot hold NUL characters: {len(with_nul)} value(s) are "
                         "kept in the structure record only: "
                         + ", ".join(map(repr, with_nul[:8])) + (", ..." if len(with_nul) > 8
                                                                 else ""))
    return lay


def _storable(value: Any) -> bool:
    """Whether a plain value can also be shown as an HDF5 dataset (a string without NUL)."""
    return not (isinstance(value, str) and "\0" in value)


def write(tree: Tree, lay: skeleton.Layout, path, progress: Progress,
          options: WriteOptions = WriteOptions()) -> None:
    """With ``options.compress``: every non-empty array of at least one dimension is a
    chunked dataset with the gzip (level 4, h5py's default) or lzf filter."""
    h5py = h5py_module()
    codec = options.codec("hdf5")
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
                data = rawbits.encode(leaf.read(), leaf.dtype, NATIVE)
                filters = {"compression": codec} if codec and data.ndim and data.size else {}
                obj = g.create_dataset(name, data=data, **filters)
                if here in marks:
                    obj.attrs[DTYPE_ATTR] = marks[here]
                progress.advance(leaf.nbytes)
            elif here in values and _storable(values[here]):
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

