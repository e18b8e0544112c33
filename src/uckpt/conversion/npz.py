"""NPZ: ``np.savez`` archives, Chainer's ``save_npz`` files and trainer snapshots.

Reading never unpickles: every member's ``.npy`` header is parsed (NumPy's own
literal parser), object arrays are refused (``allow_pickle=False``), and each
array is read from its member when asked, straight from the file when the
member is stored, streamed when it is compressed (``savez_compressed``, Chainer's
default). Names ``a/b/c`` become nested dicts, as Chainer means them.

Writing stores each array as ``<name>.npy`` (uncompressed, 64-byte aligned),
plain values (``lr``, strings, ...) as 0-d arrays so ``np.load`` and Chainer
see them, and the structure record as ``__uckpt__.npy``: a ``uint8`` array
of UTF-8 JSON (not an object array). bfloat16 and float8 arrays are stored as
their raw bits and marked in the record (see :mod:`.rawbits`).
"""
from __future__ import annotations

import io
import math
import tokenize
import zipfile
from typing import Any, Dict, List, Tuple

import numpy as np

from .. import dtypes
from ..errors import CorruptCheckpointError, UnsupportedDtypeError
from . import rawbits, skeleton
from .errors import UnknownFormatError, UnsafeInputError
from . import names
from .fileio import RandomAccessFile, ZipArchive
from .interchange import Leaf, Tree, check_shape, reading
from .options import WriteOptions
from .progress import Progress
from .zipout import ZipOut

RECORD = "__uckpt__"
NATIVE = tuple(n for n in dtypes.NAMES if n not in ("bfloat16", "float8_e4m3fn", "float8_e5m2"))
_MAX_HEADER = 10000  # NumPy's own limit: a header is parsed by ast.literal_eval
_NAME_HINT = ("NPZ names nest on '/' and become zip member names and HDF5 paths when "
              "converted; rename the member (e.g. np.load it and np.savez it again)")


# -- reading -----------------------------------------------------------------------------------
def _header(archive: ZipArchive, info: zipfile.ZipInfo, key: str) -> Tuple[np.dtype, tuple,
                                                                             bool, int]:
    """(dtype, shape, fortran_order, header length) of a member's .npy header (at most
    ``_MAX_HEADER`` + 16 bytes of the member are read, or inflated, for it)."""
    first = archive.read_into(info, 0, np.empty(min(info.file_size, _MAX_HEADER + 16),
                                                 dtype=np.uint8))
    head = io.BytesIO(first.tobytes())
    try:
        version = np.lib.format.read_magic(head)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(head, _MAX_HEADER)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(head, _MAX_HEADER)
    except (ValueError, SyntaxError, TypeError, EOFError, OverflowError, MemoryError,
            RecursionError, tokenize.TokenError) as e:
        raise CorruptCheckpointError(f"{archive.where}: {key!r} has no valid .npy header: {e}",
                                     path=archive.where) from None
    shape = check_shape(shape, dtype.itemsize, archive.where, f"array {key!r}")
    return dtype, shape, bool(fortran), head.tell()


def _entry(archive: ZipArchive, info: zipfile.ZipInfo, key: str) -> Any:
    """A Leaf for an array member; the value itself for a 0-d string."""
    dtype, shape, fortran, start = _header(archive, info, key)
    where = f"{archive.where}: {key!r}"
    if dtype.hasobject:
        raise UnsafeInputError(
            f"{where} is an object array, which only unpickling can read; refused "
            "(NPZ files are read with allow_pickle=False)", path=archive.where, leaf=key,
            hint="save plain numeric arrays; a Chainer value of None is saved as an object array")
    count = math.prod(shape)
    np_dtype = dtype
    if info.file_size != start + count * dtype.itemsize:
        # checked before anything is inflated: a member holds its header and array, no more
        raise CorruptCheckpointError(
            f"{archive.where}: array {key!r} declares {count * dtype.itemsize} bytes (a "
            f"{dtype.str} array of shape {shape}), but its zip member holds "
            f"{info.file_size - start} after the {start}-byte .npy header",
            path=archive.where, leaf=key,
            hint="the archive is damaged or was crafted; nothing was inflated past the header")
    if dtype.kind in "US":
        if shape != ():
            raise UnsupportedDtypeError(f"{where} is an array of strings; only single strings "
                                        "can be converted", leaf=key)
        arr = archive.read_into(info, start, np.empty((), dtype=dtype))
        return str(arr[()]) if dtype.kind == "U" else bytes(arr[()])
    try:
        name = dtypes.name_of(dtype)
    except UnsupportedDtypeError as e:
        raise UnsupportedDtypeError(f"{where}: {e.args[0]}", leaf=key) from None
    read_shape = shape[::-1] if fortran else shape

    def read() -> np.ndarray:
        arr = archive.read_into(info, start, np.empty(read_shape, dtype=np_dtype))
        return dtypes.as_little_endian(arr.T if fortran else arr)

    return Leaf(name, shape, read)


def marked(leaf: Leaf, dtype: str, where: str) -> Leaf:
    """The leaf a raw-bits array stands for (its marked dtype)."""
    try:
        shape = rawbits.logical(leaf.dtype, leaf.shape, dtype)
        dtypes.to_numpy(dtype)
    except (ValueError, UnsupportedDtypeError) as e:
        raise skeleton.SkeletonError(f"{where}: {e}") from None
    return Leaf(dtype, shape, lambda: rawbits.decode(leaf.read(), dtype, shape), leaf.kind)


def read(path, fmt: str = "npz") -> Tree:
    raf = RandomAccessFile(path)
    with reading(fmt, raf.close) as tree:
        archive = ZipArchive(raf)
        tree.closers.append(archive.close)
        items: List[Tuple[str, Any]] = []
        record = None
        for name, info in archive.members.items():
            if not name.endswith(".npy"):
                tree.notes.append(f"{raf.path}: member {name!r} is not an array; skipped")
                continue
            key = name[:-4]
            names.check(key, raf.path, "zip member", _NAME_HINT, shown=name)
            if key == RECORD:
                record = skeleton.loads(_record_bytes(archive, info), raf.path)
                continue
            items.append((key, _entry(archive, info, key)))
        if archive.members and record is None and not items:
            raise _not_npz(raf.path, list(archive.members))
        skeleton.settle(tree, record, items, raf.path)
    return tree


def _not_npz(where: str, members: List[str]) -> UnknownFormatError:
    """The error for a zip archive none of whose members is an array (``--from npz`` on a
    ``torch.save`` file or a ``.keras`` archive): read as NPZ it would hold nothing."""
    return UnknownFormatError(
        f"{where} is a zip archive but not an NPZ: none of its {len(members)} members is a "
        f".npy array (the first is {members[0]!r})", path=where,
        hint="leave out --from (src_format=) to detect its format; a torch.save file is "
             "read with --from pickle, a .keras archive with --from keras")


def _record_bytes(archive: ZipArchive, info: zipfile.ZipInfo) -> bytes:
    leaf = _entry(archive, info, RECORD)
    if not isinstance(leaf, Leaf) or leaf.dtype != "uint8" or len(leaf.shape) != 1:
        raise skeleton.SkeletonError(f"{archive.where}: {RECORD} is not a uint8 array")
    return leaf.read().tobytes()


# -- writing -----------------------------------------------------------------------------------
def npy_header(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    d = np.lib.format.header_data_from_array_1_0(arr)
    try:
        np.lib.format.write_array_header_1_0(buf, d)
    except ValueError:
        buf = io.BytesIO()
        np.lib.format.write_array_header_2_0(buf, d)
    return buf.getvalue()


def value_array(value: Any) -> Any:
    """The 0-d array that shows a plain value to other readers; None if it has none."""
    if isinstance(value, int) and not isinstance(value, bool) and \
            not -(1 << 63) <= value < (1 << 63):
        return None
    return np.asarray(value)


def marks_for(lay: skeleton.Layout, native) -> Dict[str, str]:
    return {name: leaf.dtype for name, leaf in lay.arrays if leaf.dtype not in native}


def plan(tree: Tree) -> skeleton.Layout:
    lay = skeleton.layout(tree.root, copies=True)
    names.check_output([name for name, _ in lay.arrays + lay.values], "an NPZ file",
                       "a zip member name")
    if any(name == RECORD for name, _ in lay.arrays + lay.values):
        raise UnsupportedDtypeError(f"the name {RECORD!r} is reserved for uckpt's structure "
                                    "record in NPZ files")
    rawbits_note(lay, NATIVE, "NPZ")
    return lay


def rawbits_note(lay: skeleton.Layout, native, fmt: str) -> None:
    marks = marks_for(lay, native)
    if marks:
        kinds = sorted(set(marks.values()))
        lay.notes.append(f"{fmt} has no {', '.join(kinds)}: {len(marks)} array(s) stored as "
                         "raw bits and marked, so uckpt reads them back exactly (other readers "
                         f"see unsigned integers): {', '.join(list(marks)[:5])}")


def write(tree: Tree, lay: skeleton.Layout, path, progress: Progress,
          options: WriteOptions = WriteOptions()) -> None:
    """With ``options.compress``, members are deflated, as ``np.savez_compressed`` and
    Chainer's ``save_npz(compression=True)`` write them."""
    out = ZipOut(path, deflate=options.codec("npz") == "deflate")
    try:
        for name, leaf in lay.arrays:
            stored = rawbits.encode(leaf.read(), leaf.dtype, NATIVE)
            out.add_array(name + ".npy", stored, progress, npy_header(stored))
            del stored  # written: not held while the next array is read
        for name, value in lay.values:
            arr = value_array(value)
            if arr is not None:
                out.add_array(name + ".npy", arr, None, npy_header(arr))
        doc = skeleton.record(lay, tree.extras, marks_for(lay, NATIVE))
        data = np.frombuffer(skeleton.dumps(doc).encode("utf-8"), dtype=np.uint8)
        out.add_array(RECORD + ".npy", data, None, npy_header(data))
    finally:
        out.close()
