"""Reading ``torch.save`` files without torch and without running any of their code.

A ``torch.save`` file is a zip archive: ``<prefix>/data.pkl`` (the pickle of the
saved object, tensors referring to storages by persistent id) and one stored
(uncompressed) member ``<prefix>/data/<key>`` per storage. Files written with
``_use_new_zipfile_serialization=False`` (and plain pickles) are a sequence of
pickles followed by the raw storages; both are read here.

The pickle goes through :mod:`.unpickler` with an allowlist of uckpt's own
stand-ins for what tensor checkpoints need: torch's tensor rebuild functions,
typed and untyped storage classes, dtypes, ``torch.Size``, ``OrderedDict`` and
``_codecs.encode``, and plain numeric NumPy arrays (:mod:`.numpy_pickle`). A tensor
becomes a lazy :class:`~.model.Leaf` that reads its bytes from the storage member at its
offset when asked (strided views are gathered from the span they cover). Storage sizes are
checked against the members that hold them before anything is allocated.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from .. import dtypes
from ..errors import CorruptCheckpointError, UnsupportedDtypeError, UnsupportedObjectError
from . import numpy_pickle, skeleton
from .errors import UnsafeInputError
from .fileio import BoundedReader, RandomAccessFile, Window, ZipArchive, require_fits
from ..tree.flatten import MAX_DEPTH, escape, join
from .limits import check_ratio, current
from .interchange import Leaf, Tree, check_plain, check_shape, key_text, reading, where
from .unpickler import GENERIC, OrderedDictStandIn, Sealed, StandIn, restricted_load, short

#: ``torch.<Name>Storage`` -> neutral dtype
TYPED_STORAGES = {
    "FloatStorage": "float32", "DoubleStorage": "float64", "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32",
    "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8",
    "BoolStorage": "bool", "ComplexFloatStorage": "complex64",
    "ComplexDoubleStorage": "complex128",
}
#: torch dtype names that are neutral names too (``torch.float32`` -> ``float32``)
TORCH_DTYPES = ("float16", "float32", "float64", "bfloat16", "int8", "int16", "int32", "int64",
                "uint8", "uint16", "uint32", "uint64", "bool", "complex64", "complex128",
                "float8_e4m3fn", "float8_e5m2")
#: torch dtypes uckpt has no name for: refused as dtypes, not as unknown globals
OTHER_TORCH_DTYPES = ("complex32", "chalf", "qint8", "quint8", "qint32", "quint4x2", "quint2x4",
                      "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2",
                      *(f"uint{i}" for i in range(1, 8)), *(f"int{i}" for i in range(1, 8)),
                      "bits1x8", "bits2x4", "bits4x2", "bits8", "bits16")
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL = 1001
SIDECAR = ".data/uckpt.json"  # the structure record inside an archive uckpt wrote
MAX_PICKLE_BYTES = 1 << 30


class StorageType(Sealed):
    """Stands in for ``torch.FloatStorage`` & co. and ``torch.storage.UntypedStorage``."""

    __slots__ = ("name", "dtype")

    def __init__(self, name: str, dtype: Optional[str]) -> None:
        self.name, self.dtype = name, dtype  # dtype None: untyped (bytes)


class TorchDtype(Sealed):
    """Stands in for ``torch.float32`` & co."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


def torch_size(dims=()) -> tuple:
    """Stands in for ``torch.Size``: a plain tuple."""
    return tuple(int(d) for d in dims)


def _refused_dtype(name: str) -> StandIn:
    def refuse(*_a):
        raise UnsupportedDtypeError(f"torch.{name} tensors cannot be converted",
                                    hint=f"the uckpt format holds: {', '.join(dtypes.NAMES)}")
    return StandIn(refuse)


@dataclass(eq=False)
class Storage(Sealed):
    """A storage of the archive: ``nbytes`` bytes that ``read_into(arr, byte_offset)`` reads."""

    key: str
    nbytes: int
    read_into: Callable[[np.ndarray, int], np.ndarray]


class Tensors:
    """The tensor half of the allowlist: rebuild functions that make lazy leaves."""

    def __init__(self, where_: str, big_endian: bool = False) -> None:
        self.where, self.big_endian = where_, big_endian
        self.cache: Dict[tuple, Leaf] = {}
        self.limits = current()

    def allowed(self) -> Dict[str, Any]:
        out: Dict[str, Any] = dict(GENERIC)
        out.update({f"torch.{n}": StorageType(n, d) for n, d in TYPED_STORAGES.items()})
        out["torch.storage.UntypedStorage"] = StorageType("UntypedStorage", None)
        out.update({f"torch.{n}": TorchDtype(n) for n in TORCH_DTYPES})
        out.update({f"torch.{n}": _refused_dtype(n) for n in OTHER_TORCH_DTYPES})
        out["torch.Size"] = StandIn(torch_size)
        out["torch._utils._rebuild_tensor_v2"] = StandIn(self.rebuild_v2)
        out["torch._utils._rebuild_tensor_v3"] = StandIn(self.rebuild_v3)
        out["torch._utils._rebuild_parameter"] = StandIn(self.rebuild_parameter)
        out["torch._utils._rebuild_parameter_with_state"] = StandIn(self.rebuild_parameter)
        out.update(numpy_pickle.allowed())  # plain numeric arrays (Trainer's rng_state.pth)
        return out

    # the stand-ins, with torch's signatures
    def rebuild_v2(self, storage, storage_offset, size, stride, requires_grad=False,
                   backward_hooks=None, metadata=None) -> Leaf:
        if not isinstance(storage, tuple) or len(storage) != 2:
            raise TypeError("_rebuild_tensor_v2 expects a storage")
        store, dtype = storage
        return self._leaf(store, dtype or "uint8", storage_offset, size, stride, backward_hooks,
                          metadata)

    def rebuild_v3(self, storage, storage_offset, size, stride, requires_grad, backward_hooks,
                   dtype, metadata=None) -> Leaf:
        if not isinstance(storage, tuple) or not isinstance(dtype, TorchDtype):
            raise TypeError("_rebuild_tensor_v3 expects a storage and a dtype")
        return self._leaf(storage[0], dtype.name, storage_offset, size, stride, backward_hooks,
                          metadata)

    def rebuild_parameter(self, data, requires_grad=False, backward_hooks=None, state=None):
        if not isinstance(data, Leaf):
            raise TypeError("_rebuild_parameter expects a tensor")
        return data  # a Parameter's data; requires_grad and hooks are not state

    def _leaf(self, store: Storage, dtype: str, offset, size, stride, hooks, metadata) -> Leaf:
        if not isinstance(store, Storage):
            raise TypeError("a tensor must be rebuilt from a storage")
        if hooks:
            raise UnsupportedObjectError(f"{self.where}: a tensor has backward hooks",
                                         path=self.where)
        if metadata:
            raise UnsupportedObjectError(f"{self.where}: a tensor carries metadata "
                                         f"{sorted(metadata)!r} that uckpt cannot keep",
                                         path=self.where)
        size, stride = tuple(size), tuple(stride)
        if not (type(offset) is int and 0 <= offset < (1 << 63) and
                len(size) == len(stride) and
                all(type(v) is int and 0 <= v < (1 << 63) for v in size + stride)):
            raise CorruptCheckpointError(f"{self.where}: a tensor has a bad layout: offset "
                                         f"{short(offset)}, size {short(size)}, stride "
                                         f"{short(stride)}", path=self.where)
        check_shape(size, dtypes.itemsize(dtype), self.where, "a tensor")
        key = (store.key, dtype, offset, size, stride)
        if key not in self.cache:
            self.cache[key] = self._make(store, dtype, offset, size, stride)
        return self.cache[key]

    def _make(self, store: Storage, dtype: str, offset: int, size: tuple, stride: tuple) -> Leaf:
        item = dtypes.itemsize(dtype)
        count = math.prod(size)
        span = 0 if count == 0 else 1 + sum((n - 1) * s for n, s in zip(size, stride))
        require_fits((offset + span) * item, store.nbytes,
                     f"a {dtype} tensor of shape {size} in storage {store.key!r}", self.where)
        # strides that repeat elements (an expanded tensor) make more than the storage holds
        check_ratio(count * item, span * item, f"a {dtype} tensor of shape {size} with "
                    f"strides {stride} (in storage {store.key!r})", self.where, self.limits)
        np_dtype = dtypes.to_numpy(dtype)
        if self.big_endian:
            np_dtype = np_dtype.newbyteorder(">")
        contiguous = all(s == c for n, s, c in zip(size, stride, _c_strides(size)) if n > 1)

        def read() -> np.ndarray:
            if count == 0:
                arr = np.empty(size, dtype=np_dtype)
            elif contiguous:
                arr = store.read_into(np.empty(size, dtype=np_dtype), offset * item)
            else:
                flat = store.read_into(np.empty(span, dtype=np_dtype), offset * item)
                arr = np.lib.stride_tricks.as_strided(
                    flat, size, tuple(s * item for s in stride)).copy()
            return dtypes.as_little_endian(arr)

        def elements(start: int, n: int) -> np.ndarray:
            if not 0 <= start <= start + n <= count:
                raise CorruptCheckpointError(f"{self.where}: elements [{start}, {start + n}) "
                                             f"lie outside a tensor of {count}", path=self.where)
            arr = np.empty(n, dtype=np_dtype)
            if n:
                arr = store.read_into(arr, (offset + start) * item)
            return dtypes.as_little_endian(arr)

        return Leaf(dtype, size, read, span=elements if contiguous else None)


def _c_strides(size: tuple) -> List[int]:
    out, acc = [], 1
    for n in reversed(size):
        out.append(acc)
        acc *= n
    return out[::-1]


def _storage_args(pid: Any, n: int, where_: str) -> tuple:
    if not (isinstance(pid, tuple) and len(pid) == n and
            isinstance(pid[0], (str, bytes)) and pid[0] in ("storage", b"storage")):
        raise UnsafeInputError(f"{where_}: the pickle uses a persistent id that is not a "
                               f"tensor storage: {short(pid)}", path=where_)
    _, stype, key, _location, numel = pid[:5]
    if isinstance(key, bytes):
        key = key.decode("ascii", "replace")
    if not isinstance(stype, StorageType) or not isinstance(key, str) or \
            type(numel) is not int or not 0 <= numel < (1 << 62):
        raise CorruptCheckpointError(f"{where_}: a storage id is malformed: {short(pid)}",
                                     path=where_)
    return stype, key, numel * (dtypes.itemsize(stype.dtype) if stype.dtype else 1)


# -- the zip format ------------------------------------------------------------------------------
def load_archive(raf: RandomAccessFile, base: int = 0, length: Optional[int] = None,
                 where_: Optional[str] = None, extra: Optional[Dict[str, Any]] = None
                 ) -> Tuple[Any, Optional[dict], ZipArchive]:
    """(raw tree, structure record or None, archive) of a torch.save zip at ``base``;
    ``extra`` adds a format's own stand-ins to the allowlist (DeepSpeed's, see
    :mod:`.deepspeed_zero`)."""
    where_ = where_ or raf.path
    archive = ZipArchive(raf, base, length, where_)
    pkls = [n for n in archive.members if n == "data.pkl" or n.endswith("/data.pkl")]
    if len(pkls) != 1:
        raise CorruptCheckpointError(f"{where_}: not a torch.save archive (expected one "
                                     f"data.pkl, found {len(pkls)})", path=where_)
    prefix = pkls[0][:-len("data.pkl")]
    order = archive.members.get(prefix + "byteorder")
    big = order is not None and archive.read(order.filename, 64).strip() == b"big"
    tensors = Tensors(where_, big)
    storages: Dict[str, Tuple[Storage, Optional[str]]] = {}

    def persistent(pid: Any) -> Tuple[Storage, Optional[str]]:
        stype, key, nbytes = _storage_args(pid, 5, where_)
        if key not in storages:
            info = archive.members.get(f"{prefix}data/{key}")
            if info is None:
                raise CorruptCheckpointError(f"{where_}: storage {key!r} is missing from the "
                                             "archive", path=where_)
            require_fits(nbytes, info.file_size, f"storage {key!r}", where_)
            storages[key] = (Storage(key, nbytes, lambda arr, off, info=info:
                                     archive.read_into(info, off, arr)), stype.dtype)
        return storages[key][0], stype.dtype

    root = restricted_load(archive.read(pkls[0], MAX_PICKLE_BYTES),
                           {**tensors.allowed(), **(extra or {})}, where_, persistent)
    record = None
    if prefix + SIDECAR in archive.members:
        record = skeleton.loads(archive.read(prefix + SIDECAR, MAX_PICKLE_BYTES), where_)
    return root, record, archive


# -- the legacy format (and plain pickles) ---------------------------------------------------
def load_legacy(raf: RandomAccessFile) -> Any:
    """The tree of a pre-zip ``torch.save`` file, or of a plain pickle of containers."""
    where_ = raf.path
    stream = BoundedReader(Window(raf))
    plain = {**GENERIC, **numpy_pickle.allowed()}
    first = restricted_load(stream, plain, where_)
    if type(first) is not int or first != LEGACY_MAGIC:
        stream.seek(0)
        root = restricted_load(stream, plain, where_)
        return root
    if restricted_load(stream, {}, where_) != LEGACY_PROTOCOL:
        raise CorruptCheckpointError(f"{where_}: unknown legacy torch.save protocol",
                                     path=where_)
    info = restricted_load(stream, {}, where_)
    big = isinstance(info, dict) and info.get("little_endian") is False
    tensors = Tensors(where_, big)
    found: Dict[str, List[Any]] = {}  # key -> [nbytes, data offset (set below)]

    def read_into(key: str, view_offset: int) -> Callable[[np.ndarray, int], np.ndarray]:
        def read(arr: np.ndarray, off: int) -> np.ndarray:
            return raf.read_into(arr, found[key][1] + view_offset + off)
        return read

    def persistent(pid: Any) -> Tuple[Storage, Optional[str]]:
        stype, key, nbytes = _storage_args(pid, 6, where_)
        view = pid[5]
        if found.setdefault(key, [nbytes, None])[0] != nbytes:
            raise CorruptCheckpointError(f"{where_}: storage {key!r} is declared with two "
                                         "sizes", path=where_)
        if view is None:
            return Storage(key, nbytes, read_into(key, 0)), stype.dtype
        if not (isinstance(view, tuple) and len(view) == 3 and
                all(type(v) is int and 0 <= v < (1 << 62) for v in view[1:])):
            raise CorruptCheckpointError(f"{where_}: a storage view is malformed: "
                                         f"{short(view)}", path=where_)
        vkey, voffset, vsize = view  # a view of the storage ``key`` (old torch versions)
        item = dtypes.itemsize(stype.dtype) if stype.dtype else 1
        require_fits((voffset + vsize) * item, nbytes, f"storage view {short(vkey)}", where_)
        return Storage(f"{key}:{vkey}", vsize * item, read_into(key, voffset * item)), \
            stype.dtype

    root = restricted_load(stream, tensors.allowed(), where_, persistent)
    keys = restricted_load(stream, {}, where_)
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys) or \
            set(keys) != set(found):
        raise CorruptCheckpointError(f"{where_}: the storage list does not match the tensors",
                                     path=where_)
    offset = stream.tell()
    for key in keys:
        nbytes = found[key][0]
        require_fits(8 + nbytes, raf.size - offset, f"storage {key!r}", where_)
        found[key][1] = offset + 8
        offset += 8 + nbytes
    return root


# -- the tree ----------------------------------------------------------------------------------
def normalize(obj: Any, parts: List[str], extras: Dict[str, Dict[str, Any]], depth: int = 0
              ) -> Any:
    """Stand-in containers to plain ones; an OrderedDict's class and state go to ``extras``."""
    if depth > MAX_DEPTH:
        raise CorruptCheckpointError(f"the pickle nests deeper than {MAX_DEPTH} levels at "
                                     f"{where(parts)!r}")
    obj = numpy_pickle.finish(obj)
    if isinstance(obj, dict):
        out = {k: normalize(v, parts + [escape(key_text(k, parts))], extras, depth + 1)
               for k, v in obj.items()}
        if isinstance(obj, OrderedDictStandIn):
            extra: Dict[str, Any] = {"pickle.class": "collections.OrderedDict"}
            if obj.pickle_state:
                extra["pickle.state"] = _jsonable_or_none(obj.pickle_state)
            extras[join(parts)] = extra
        return out
    if isinstance(obj, (list, tuple)):
        items = [normalize(v, parts + [str(i)], extras, depth + 1) for i, v in enumerate(obj)]
        return tuple(items) if isinstance(obj, tuple) else items
    if isinstance(obj, Leaf):
        return obj
    check_plain(obj, parts)
    return obj


def _jsonable_or_none(state: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    try:
        skeleton.dumps(state)
    except (TypeError, ValueError, UnsupportedObjectError, RecursionError):
        return None
    return state


def read(path, fmt: str = "pickle") -> Tree:
    raf = RandomAccessFile(path)
    with reading(fmt, raf.close) as tree:
        head = raf.pread(min(4, raf.size), 0)
        record = None
        if head.startswith(b"PK"):
            raw, record, archive = load_archive(raf)
            tree.closers.append(archive.close)
        else:
            raw = load_legacy(raf)
        tree.root = normalize(raw, [], tree.extras)
        if record is not None:
            apply_record(tree, record, raf.path)
    return tree


def apply_record(tree: Tree, record: dict, where_: str) -> None:
    """Use a structure record (written by uckpt beside the pickle) to restore what a pickle
    cannot say: NumPy scalars, framework objects, HDF5 attributes."""
    lay = skeleton.layout(tree.root)
    skeleton.restore(tree, record, lay.values + lay.arrays, where_)
