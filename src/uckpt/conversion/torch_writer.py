"""Writing ``torch.save``-compatible files without torch.

The archive has the layout ``torch.save`` writes (``archive/data.pkl``,
``archive/byteorder``, ``archive/version``, one stored, 64-byte aligned member
``archive/data/<key>`` per tensor) and a pickle emitted opcode by opcode, using
only what ``torch.load(weights_only=True)`` accepts: plain containers and
scalars, ``collections.OrderedDict``, ``_codecs.encode`` for bytes, and tensors
as ``torch._utils._rebuild_tensor_v2`` of a typed storage (``torch.FloatStorage``
& co.) or ``_rebuild_tensor_v3`` of an untyped storage and a dtype for dtypes
without a typed storage class (``uint16``, float8). The structure record goes
to ``archive/.data/uckpt.json``, which torch ignores.
"""
from __future__ import annotations

import io
import struct
from typing import Any, Dict, List, Optional

from ..tree.flatten import escape, join
from . import skeleton
from .interchange import Leaf, Obj, Tree, where
from .progress import Progress
from .torch_pickle import SIDECAR, TYPED_STORAGES
from .zipout import ZipOut

PREFIX = "archive/"
_STORAGE_OF = {d: n for n, d in TYPED_STORAGES.items()}
_BATCH = 1000  # items per SETITEMS / APPENDS, as pickle does
#: uckpt object nodes that a torch.save file holds as what they are: tensors
TENSOR_CLASSES = ("torch.Tensor", "torch.nn.parameter.Parameter")


def _global(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


class Emitter:
    """Pickle protocol 2 opcodes for a tree; tensors refer to storages by persistent id."""

    def __init__(self, extras: Dict[str, Dict[str, Any]]) -> None:
        self.out = io.BytesIO()
        self.extras = extras
        self.storages: List[Leaf] = []
        self.keys: Dict[int, str] = {}

    def dump(self, root: Any) -> bytes:
        self.out.write(b"\x80\x02")
        self.value(root, [])
        self.out.write(b".")
        return self.out.getvalue()

    def value(self, obj: Any, parts: Optional[List[str]]) -> None:
        """Emit ``obj``; ``parts`` is its path (None inside an OrderedDict's state, which
        has no path in the tree and no extras)."""
        w = self.out.write
        if obj is None:
            w(b"N")
        elif obj is True or obj is False:
            w(b"\x88" if obj else b"\x89")
        elif isinstance(obj, int):
            self.int(obj)
        elif isinstance(obj, float):
            w(b"G" + struct.pack(">d", obj))
        elif isinstance(obj, str):
            self.str(obj)
        elif isinstance(obj, bytes):
            w(_global("_codecs", "encode"))
            self.str(obj.decode("latin1"))
            self.str("latin1")
            w(b"\x86R")  # TUPLE2, REDUCE
        elif isinstance(obj, Leaf):
            self.tensor(obj)
        elif isinstance(obj, Obj):
            self.value(obj.state, parts)
        elif isinstance(obj, dict):
            self.dict(obj, parts)
        elif isinstance(obj, list):
            w(b"]")
            self.batched([(None, v, _child(parts, str(i))) for i, v in enumerate(obj)], b"e")
        elif isinstance(obj, tuple):
            if not obj:
                w(b")")
                return
            w(b"(")
            for i, v in enumerate(obj):
                self.value(v, _child(parts, str(i)))
            w(b"t")
        else:  # the layout of the plan has refused anything else already
            raise TypeError(f"cannot pickle {type(obj).__name__} at {where(parts or [])!r}")

    def int(self, v: int) -> None:
        if -(1 << 31) <= v < (1 << 31):
            self.out.write(b"J" + struct.pack("<i", v))
            return
        data = v.to_bytes((v + (v < 0)).bit_length() // 8 + 1, "little", signed=True)
        if len(data) > 255:
            raise ValueError(f"integer {v} is too large for torch.load")
        self.out.write(b"\x8a" + bytes([len(data)]) + data)  # LONG1

    def str(self, s: str) -> None:
        data = s.encode("utf-8", "surrogatepass")
        self.out.write(b"X" + struct.pack("<I", len(data)) + data)

    def ints(self, values) -> None:
        if not values:
            self.out.write(b")")
            return
        self.out.write(b"(")
        for v in values:
            self.int(v)
        self.out.write(b"t")

    def batched(self, items: List[tuple], op: bytes) -> None:
        for start in range(0, len(items), _BATCH):
            self.out.write(b"(")
            for key, v, parts in items[start:start + _BATCH]:
                if op == b"u":
                    self.value(key, parts)
                self.value(v, parts)
            self.out.write(op)

    def dict(self, obj: dict, parts: Optional[List[str]]) -> None:
        extra = self.extras.get(join(parts), {}) if parts is not None else {}
        ordered = extra.get("pickle.class") == "collections.OrderedDict"
        if ordered:
            self.out.write(_global("collections", "OrderedDict") + b")R")
        else:
            self.out.write(b"}")
        self.batched([(k, v, _child(parts, escape(str(k)))) for k, v in obj.items()], b"u")
        state = extra.get("pickle.state")
        if ordered and isinstance(state, dict) and state:
            self.value(state, None)
            self.out.write(b"b")  # BUILD: the OrderedDict's attributes (state_dict()._metadata)

    def tensor(self, leaf: Leaf) -> None:
        w = self.out.write
        key = self.keys.get(id(leaf))
        if key is None:
            key = self.keys[id(leaf)] = str(len(self.storages))
            self.storages.append(leaf)
        typed = _STORAGE_OF.get(leaf.dtype)
        w(_global("torch._utils", "_rebuild_tensor_v2" if typed else "_rebuild_tensor_v3"))
        w(b"((")  # the arguments; the persistent id
        self.str("storage")
        w(_global("torch", typed) if typed else _global("torch.storage", "UntypedStorage"))
        self.str(key)
        self.str("cpu")
        count = 1
        for n in leaf.shape:
            count *= n
        self.int(count if typed else leaf.nbytes)
        w(b"tQ")  # TUPLE, BINPERSID
        self.int(0)
        self.ints(leaf.shape)
        strides, acc = [], 1
        for n in reversed(leaf.shape):
            strides.append(acc)
            acc *= n
        self.ints(strides[::-1])
        w(b"\x89" + _global("collections", "OrderedDict") + b")R")  # requires_grad, hooks
        if not typed:
            w(_global("torch", leaf.dtype))
        w(b"tR")


def _child(parts: Optional[List[str]], name: str) -> Optional[List[str]]:
    return None if parts is None else parts + [name]


def plan(tree: Tree) -> skeleton.Layout:
    lay = skeleton.layout(tree.root)
    objects = [(p, c) for p, c in lay.objects if c not in TENSOR_CLASSES]
    if objects:
        lay.notes.append("framework objects are written as their state (a torch.save file "
                         "holds no uckpt object nodes; the structure record keeps them): " +
                         ", ".join(f"{p} ({c})" for p, c in objects[:10]) +
                         (", ..." if len(objects) > 10 else ""))
    return lay


def write(tree: Tree, lay: skeleton.Layout, path, progress: Progress) -> None:
    emitter = Emitter(tree.extras)
    data = emitter.dump(tree.root)
    write_archive(path, data, emitter.storages, progress, skeleton.dumps(
        skeleton.record(lay, tree.extras)).encode("utf-8"))


def write_archive(path, data: bytes, storages: List[Leaf], progress: Progress,
                  sidecar: Optional[bytes] = None) -> None:
    """A ``torch.save`` zip at ``path``: the pickle ``data``, one member per storage (in
    the order the pickle numbered them), and the structure record ``sidecar`` if given."""
    out = ZipOut(path)
    try:
        out.add_bytes(PREFIX + "data.pkl", data)
        out.add_bytes(PREFIX + "byteorder", b"little")
        for key, leaf in enumerate(storages):
            out.add_array(f"{PREFIX}data/{key}", leaf.read(), progress)
        out.add_bytes(PREFIX + "version", b"3\n")
        if sidecar is not None:
            out.add_bytes(PREFIX + SIDECAR, sidecar)
    finally:
        out.close()

