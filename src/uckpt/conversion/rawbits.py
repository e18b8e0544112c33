"""Dtypes a format lacks, stored losslessly as their raw bits and marked.

NPZ and HDF5 have no bfloat16 or float8, safetensors no complex128. Such an
array is stored as unsigned integers of the same item size (complex128: two
``uint64`` per element, on a trailing axis of 2), and its true dtype is marked
(a structure-record entry, and in HDF5 also a ``uckpt_dtype`` attribute), so
uckpt reads it back as what it was while other readers still get every bit.
"""
from __future__ import annotations

from typing import Collection, Tuple

import numpy as np

from .. import dtypes
from ..errors import CorruptCheckpointError, UnsupportedDtypeError
from .interchange import Leaf, contiguous

_BITS = {1: "u1", 2: "<u2", 4: "<u4", 8: "<u8"}


def stored_as(dtype: str, shape: Tuple[int, ...], native: Collection[str]
              ) -> Tuple[str, Tuple[int, ...]]:
    """(neutral dtype, shape) under which an array of ``dtype`` is stored."""
    if dtype in native:
        return dtype, tuple(shape)
    size = dtypes.itemsize(dtype)
    if size in _BITS:
        return dtypes.name_of(_BITS[size]), tuple(shape)
    return "uint64", tuple(shape) + (size // 8,)


def encode(arr: np.ndarray, dtype: str, native: Collection[str]) -> np.ndarray:
    """A view of ``arr`` in its stored form."""
    name, shape = stored_as(dtype, arr.shape, native)
    if name == dtype:
        return arr
    return contiguous(arr).reshape(-1).view(dtypes.to_numpy(name)).reshape(shape)


def decode(arr: np.ndarray, dtype: str, shape: Tuple[int, ...]) -> np.ndarray:
    """The array of ``dtype`` and ``shape`` whose raw bits ``arr`` holds."""
    want = dtypes.to_numpy(dtype)
    if arr.dtype == want:
        return arr
    return contiguous(arr).reshape(-1).view(want).reshape(shape)


def logical(stored_dtype: str, stored_shape: Tuple[int, ...], dtype: str) -> Tuple[int, ...]:
    """The shape of the array whose stored form has ``stored_shape``; raises if the stored
    form cannot hold a ``dtype`` array."""
    size, stored_size = dtypes.itemsize(dtype), dtypes.itemsize(stored_dtype)
    if stored_dtype.startswith(("uint", "int")) and size == stored_size:
        return tuple(stored_shape)
    if stored_dtype == "uint64" and size > 8 and stored_shape and \
            stored_shape[-1] == size // 8:
        return tuple(stored_shape[:-1])
    raise ValueError(f"a {stored_dtype} array of shape {tuple(stored_shape)} cannot hold the "
                     f"bits of a {dtype} array")


def unmark(leaf: Leaf, dtype: str, where: str) -> Leaf:
    """The leaf of marked ``dtype`` whose raw bits ``leaf`` holds."""
    try:
        shape = logical(leaf.dtype, leaf.shape, dtype)
        dtypes.to_numpy(dtype)
    except (ValueError, UnsupportedDtypeError) as e:
        raise CorruptCheckpointError(f"{where}: {e}", path=where) from None
    return Leaf(dtype, shape, lambda: decode(leaf.read(), dtype, shape), leaf.kind)
