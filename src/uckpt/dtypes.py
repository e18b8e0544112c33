"""Neutral dtype names, the only way dtypes appear in the format.

Arrays are stored little-endian, C order. ``bfloat16`` (and the float8 types)
are represented in NumPy with the ``ml_dtypes`` package, imported only when such
an array is met.
"""
from __future__ import annotations

import numpy as np

from .errors import UnsupportedDtypeError

# name -> (numpy type string or ml_dtypes attribute, item size)
_NUMPY = {
    "bool": "?",
    "int8": "i1", "int16": "<i2", "int32": "<i4", "int64": "<i8",
    "uint8": "u1", "uint16": "<u2", "uint32": "<u4", "uint64": "<u8",
    "float16": "<f2", "float32": "<f4", "float64": "<f8",
    "complex64": "<c8", "complex128": "<c16",
}
_ML = ("bfloat16", "float8_e4m3fn", "float8_e5m2")

NAMES = tuple(_NUMPY) + _ML


def _ml_dtypes():
    import ml_dtypes  # small, NumPy-only; imported only for these dtypes

    return ml_dtypes


_TO_NUMPY: dict = {}


def to_numpy(name: str) -> np.dtype:
    """The NumPy dtype (little-endian) for a neutral dtype name."""
    dt = _TO_NUMPY.get(name)
    if dt is None:
        dt = _TO_NUMPY[name] = _to_numpy(name)
    return dt


def _to_numpy(name: str) -> np.dtype:
    if name in _NUMPY:
        return np.dtype(_NUMPY[name])
    if name in _ML:
        return np.dtype(getattr(_ml_dtypes(), name))
    raise UnsupportedDtypeError(
        f"unknown dtype {name!r}", hint=f"the uckpt format knows: {', '.join(NAMES)}")


_NAME_OF: dict = {}  # np.dtype -> its name (loads ask once per array: make it a lookup)


def name_of(dtype) -> str:
    """The neutral name of a NumPy dtype; raises for dtypes the format cannot hold."""
    if isinstance(dtype, np.dtype):
        name = _NAME_OF.get(dtype)
        if name is None:
            name = _NAME_OF[dtype] = _name_of(dtype)
        return name
    return _name_of(np.dtype(dtype))


def _name_of(dt: np.dtype) -> str:
    if dt.name in _ML and dt.names is None:  # ml_dtypes types report kind 'V' or 'f'
        return dt.name
    if dt.kind in "biufc" and dt.names is None and dt.subdtype is None:
        name = {"b": "bool", "i": "int", "u": "uint", "f": "float", "c": "complex"}[dt.kind]
        if dt.kind != "b":
            name += str(dt.itemsize * 8)
        if name in _NUMPY:
            return name
    raise UnsupportedDtypeError(
        f"dtype {dt} cannot be stored",
        hint=f"the uckpt format holds: {', '.join(NAMES)}; convert object, string and "
             "structured arrays to one of these first")


_ITEMSIZE: dict[str, int] = {}


def itemsize(name: str) -> int:
    size = _ITEMSIZE.get(name)
    if size is None:
        size = _ITEMSIZE[name] = to_numpy(name).itemsize
    return size


def nbytes(name: str, shape) -> int:
    """Bytes of an array of this neutral dtype and shape."""
    n = itemsize(name)
    for s in shape:
        n *= s
    return n


def as_little_endian(arr: np.ndarray) -> np.ndarray:
    """A little-endian view or copy of ``arr`` (a no-op on little-endian arrays)."""
    if arr.dtype.byteorder == ">":
        return arr.astype(arr.dtype.newbyteorder("<"))
    return arr
