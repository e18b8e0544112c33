"""Plain numeric NumPy arrays and scalars inside a pickle, read as data.

A pickled ``ndarray`` is ``numpy.core.multiarray._reconstruct(ndarray, (0,), b'b')``
followed by a BUILD with ``(version, shape, dtype, fortran_order, raw bytes)``, its dtype
``numpy.dtype('<f8', False, True)`` and a BUILD with the byte order (pickle protocol 5
writes ``numpy.core.numeric._frombuffer(bytes, dtype, shape, order)`` instead); a NumPy
scalar is ``numpy.core.multiarray.scalar(dtype, raw bytes)``. Transformers' Trainer saves
``np.random.get_state()`` (a ``uint32`` array) this way in ``rng_state.pth``.

Each of those names (under ``numpy.core`` and NumPy 2's ``numpy._core``) stands for a
function written here that admits only what it recognises: dtypes of booleans, integers,
floats and complex numbers (no object, string, structured or sub-array dtypes, no
``ndarray`` subclass), shapes that match the raw bytes exactly. The result is a
:class:`~.model.Leaf` over the bytes; nothing of NumPy's own unpickling is called.
"""
from __future__ import annotations

import math
import re
from typing import Any, Dict

import numpy as np

from .. import dtypes
from ..errors import UnsupportedDtypeError
from .interchange import Leaf, check_shape
from .unpickler import Sealed, StandIn

_SPEC = re.compile(r"[<>|=]?(b1|\?|[iu][1248]|f[248]|c(8|16))")
_KINDS = "biufc"


class NumpyDtype:
    """Stands in for ``numpy.dtype``: only a plain numeric dtype, its byte order set by BUILD."""

    __slots__ = ("dtype",)

    def __init__(self, spec: Any, align: Any = False, copy: Any = True) -> None:
        if not isinstance(spec, str) or not _SPEC.fullmatch(spec):
            raise UnsupportedDtypeError(f"the pickle holds a NumPy dtype {spec!r:.40}; only "
                                        "booleans, integers, floats and complex numbers are read")
        self.dtype = np.dtype(spec)

    def __setstate__(self, state: Any) -> None:
        if not (isinstance(state, tuple) and len(state) >= 8 and state[0] in (3, 4) and
                state[1] in ("<", ">", "|", "=") and state[2:5] == (None, None, None)):
            raise UnsupportedDtypeError("the pickle gives a NumPy dtype a state of a "
                                        "structured or sub-array dtype; refused")
        order = "=" if state[1] == "|" else state[1]
        self.dtype = self.dtype.newbyteorder(order)


class NumpyArrayType(Sealed):
    """Stands in for ``numpy.ndarray`` (the class ``_reconstruct`` is given)."""


NDARRAY = NumpyArrayType()


class NumpyArray:
    """What ``_reconstruct`` makes: an empty array until BUILD gives it shape, dtype, bytes."""

    __slots__ = ("leaf",)

    def __init__(self) -> None:
        self.leaf = None

    def __setstate__(self, state: Any) -> None:
        if self.leaf is not None or not (isinstance(state, tuple) and len(state) == 5 and
                                         state[0] == 1):
            raise TypeError("a NumPy array's pickled state is (1, shape, dtype, fortran, data)")
        _, shape, dtype, fortran, data = state
        self.leaf = make_leaf(data, dtype, shape, "F" if fortran else "C")


def make_leaf(data: Any, dtype: Any, shape: Any, order: str, kind: str = "array") -> Leaf:
    if not isinstance(dtype, NumpyDtype):
        raise TypeError("a NumPy array needs a numpy.dtype")
    if isinstance(data, list):
        raise UnsupportedDtypeError("the pickle holds a NumPy object array, which only "
                                    "unpickling its objects could read; refused")
    if not isinstance(data, (bytes, bytearray)):
        raise TypeError(f"a NumPy array's data is bytes, not {type(data).__name__}")
    dt = dtype.dtype
    shape = check_shape(list(shape) if isinstance(shape, tuple) else shape, dt.itemsize,
                        "the pickle", "a NumPy array")
    if len(data) != math.prod(shape) * dt.itemsize:
        raise TypeError(f"a NumPy array of shape {shape} and dtype {dt.str} needs "
                        f"{math.prod(shape) * dt.itemsize} bytes, the pickle gives {len(data)}")
    arr = np.frombuffer(bytes(data), dtype=dt)
    arr = arr.reshape(shape[::-1]).T if order == "F" and shape else arr.reshape(shape)
    return Leaf.of(dtypes.as_little_endian(np.ascontiguousarray(arr)), kind)


def _reconstruct(cls: Any, shape: Any, typecode: Any) -> NumpyArray:
    if cls is not NDARRAY:
        raise TypeError("_reconstruct is admitted only for numpy.ndarray")
    return NumpyArray()


def _frombuffer(buf: Any, dtype: Any, shape: Any, order: Any) -> Leaf:
    return make_leaf(buf, dtype, shape, "F" if order == "F" else "C")


def _scalar(dtype: Any, data: Any = None) -> Leaf:
    return make_leaf(data, dtype, (), "C", "scalar")


def allowed() -> Dict[str, Any]:
    """The NumPy names a pickle may use, under NumPy 1's and NumPy 2's module names."""
    out: Dict[str, Any] = {"numpy.dtype": NumpyDtype, "numpy.ndarray": NDARRAY}
    for core in ("numpy.core", "numpy._core"):
        out[f"{core}.multiarray._reconstruct"] = StandIn(_reconstruct)
        out[f"{core}.multiarray.scalar"] = StandIn(_scalar)
        out[f"{core}.numeric._frombuffer"] = StandIn(_frombuffer)
    return out


def finish(obj: Any) -> Any:
    """A reconstructed array as its leaf (the unpickled tree holds the stand-in)."""
    if isinstance(obj, NumpyArray):
        if obj.leaf is None:
            raise TypeError("a NumPy array in the pickle was never given its data")
        return obj.leaf
    return obj
