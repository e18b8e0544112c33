"""safetensors: an 8-byte little-endian header length, a JSON header, then the tensors' bytes.

The format is simple and fully specified, so uckpt reads and writes it itself:
reading checks the header strictly (known dtypes, offsets that match shapes, lie
inside the file and do not overlap) and reads each tensor from its offset when
asked, bfloat16 and float8 included (the ``safetensors`` package's NumPy API
has no bfloat16); writing streams tensor by tensor. Names ``a/b`` nest as in
NPZ. The structure record goes to ``__metadata__["uckpt"]``; plain values
(safetensors holds only tensors) live there only. complex128, which the format
lacks, is stored as raw bits and marked.

The source's other ``__metadata__`` entries are kept (``Tree.extras[""]``) and
written back; a written file always says ``"format": "pt"`` unless its source
said otherwise, as transformers' ``from_pretrained`` requires.
"""
from __future__ import annotations

import json
from typing import Any, Dict, List, Tuple

import numpy as np

from .. import dtypes
from ..errors import CorruptCheckpointError, UnsupportedDtypeError
from ..format.strict_json import loads as strict_json_loads
from . import rawbits, skeleton
from .fileio import RandomAccessFile, require_fits
from . import names
from .interchange import Leaf, Tree, check_shape, reading
from .npz import marks_for, rawbits_note
from .errors import UnknownFormatError
from .progress import Progress
from .zipout import write_pieces

CODES = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "U16": "uint16", "I16": "int16",
         "U32": "uint32", "I32": "int32", "U64": "uint64", "I64": "int64", "F16": "float16",
         "BF16": "bfloat16", "F32": "float32", "F64": "float64", "C64": "complex64",
         "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}
NAMES = {v: k for k, v in CODES.items()}
NATIVE = tuple(NAMES)
MAX_HEADER = 100 << 20  # as the safetensors package
RECORD_KEY = "uckpt"
META_EXTRA = "safetensors.metadata"  # Tree.extras[""] key: the source's own __metadata__
DEFAULT_FORMAT = "pt"  # what transformers and the safetensors torch API check for
_NAME_HINT = ("safetensors names nest on '/' and become zip member names and HDF5 paths when "
              "converted; rename the tensor (safetensors.numpy.load_file, rename, save_file)")


def _fail(path: str, msg: str):
    raise CorruptCheckpointError(f"{path}: safetensors header: {msg}", path=path)


def _entries(header: Dict[str, Any], data_len: int, path: str) -> List[Tuple[str, str, tuple,
                                                                          int, int]]:
    out = []
    for name, e in header.items():
        if not isinstance(e, dict) or set(e) != {"dtype", "shape", "data_offsets"}:
            _fail(path, f"entry {name!r} is not {{dtype, shape, data_offsets}}")
        code, shape, offs = e["dtype"], e["shape"], e["data_offsets"]
        if code not in CODES:
            raise UnsupportedDtypeError(f"{path}: {name!r} has dtype {code!r}, which uckpt "
                                        f"cannot hold", leaf=name)
        if not (isinstance(shape, list) and all(type(s) is int and s >= 0 for s in shape)):
            _fail(path, f"entry {name!r} has a bad shape {shape!r}")
        if not (isinstance(offs, list) and len(offs) == 2 and
                all(type(o) is int and o >= 0 for o in offs) and offs[0] <= offs[1]):
            _fail(path, f"entry {name!r} has bad data_offsets {offs!r}")
        dtype = CODES[code]
        names.check(name, path, "tensor", _NAME_HINT)
        check_shape(shape, dtypes.itemsize(dtype), path, f"tensor {name!r}")
        declared = dtypes.nbytes(dtype, shape)
        require_fits(offs[1], data_len, f"tensor {name!r}", path)
        if offs[1] - offs[0] != declared:
            _fail(path, f"{name!r} spans {offs[1] - offs[0]} bytes, its shape needs {declared}")
        out.append((name, dtype, tuple(shape), offs[0], offs[1]))
    spans = sorted((b, e, n) for n, _, _, b, e in out if e > b)
    for (_, e1, n1), (b2, _, n2) in zip(spans, spans[1:]):
        if b2 < e1:
            _fail(path, f"tensors {n1!r} and {n2!r} overlap")
    return out


def read(path, fmt: str = "safetensors") -> Tree:
    raf = RandomAccessFile(path)
    with reading(fmt, raf.close) as tree:
        if raf.size < 8:
            _fail(raf.path, "the file is shorter than 8 bytes")
        head = raf.pread(8, 0)
        if head.lstrip()[:1] in (b"{", b"["):
            raise UnknownFormatError(
                f"{raf.path} is a JSON document, not a safetensors file (a safetensors file "
                "starts with an 8-byte header length)", path=raf.path,
                hint="for a Hugging Face index (model.safetensors.index.json) convert it, or "
                     "its directory, with --from hf")
        n = int.from_bytes(head, "little")
        require_fits(n, min(raf.size - 8, MAX_HEADER), "the header", raf.path)
        try:
            header = strict_json_loads(raf.pread(n, 8))
        except (UnicodeError, ValueError, RecursionError) as e:
            _fail(raf.path, f"not JSON: {e}")
        if not isinstance(header, dict):
            _fail(raf.path, "not a JSON object")
        meta = header.pop("__metadata__", None) or {}
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            _fail(raf.path, "__metadata__ is not a map of strings")
        base = 8 + n
        items: List[Tuple[str, Any]] = []
        for name, dtype, shape, begin, _ in _entries(header, raf.size - base, raf.path):
            np_dtype = dtypes.to_numpy(dtype)
            items.append((name, Leaf(dtype, shape, lambda s=shape, d=np_dtype, o=base + begin:
                                     raf.read_into(np.empty(s, dtype=d), o))))
        record = skeleton.loads(meta[RECORD_KEY], raf.path) if RECORD_KEY in meta else None
        skeleton.settle(tree, record, items, raf.path)
        own = {k: v for k, v in meta.items() if k != RECORD_KEY}
        if own and own != {"format": DEFAULT_FORMAT}:  # that one every written file gets
            tree.extras.setdefault("", {})[META_EXTRA] = own
    return tree


def metadata_for(tree: Tree) -> Dict[str, str]:
    """The ``__metadata__`` a written file gets besides the record: the source's, with
    ``format`` set to ``pt`` when the source had none."""
    meta = dict(tree.extras.get("", {}).get(META_EXTRA, {}))
    meta.setdefault("format", DEFAULT_FORMAT)
    return meta


def record_extras(tree: Tree) -> Dict[str, Dict[str, Any]]:
    """``tree.extras`` without what the header already says."""
    root = {k: v for k, v in tree.extras.get("", {}).items() if k != META_EXTRA}
    out = {k: v for k, v in tree.extras.items() if k != ""}
    if root:
        out[""] = root
    return out


def plan(tree: Tree) -> skeleton.Layout:
    lay = skeleton.layout(tree.root, copies=True)
    if lay.values:
        names = [n for n, _ in lay.values]
        lay.notes.append(f"safetensors holds only tensors: {len(names)} plain value(s) are kept "
                         f"in __metadata__ only: {', '.join(names[:8])}"
                         + (", ..." if len(names) > 8 else ""))
    rawbits_note(lay, NATIVE, "safetensors")
    return lay


def write(tree: Tree, lay: skeleton.Layout, path, progress: Progress) -> None:
    marks = marks_for(lay, NATIVE)
    meta = metadata_for(tree)
    meta[RECORD_KEY] = skeleton.dumps(skeleton.record(lay, record_extras(tree), marks))
    header: Dict[str, Any] = {"__metadata__": meta}
    offset = 0
    for name, leaf in lay.arrays:
        dtype, shape = rawbits.stored_as(leaf.dtype, leaf.shape, NATIVE)
        header[name] = {"dtype": NAMES[dtype], "shape": list(shape),
                        "data_offsets": [offset, offset + leaf.nbytes]}
        offset += leaf.nbytes
    text = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "xb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for _, leaf in lay.arrays:
            stored = rawbits.encode(leaf.read(), leaf.dtype, NATIVE)
            write_pieces(f.write, memoryview(stored.reshape(-1).view(np.uint8)), progress)
            del stored  # written: not held while the next array is read
