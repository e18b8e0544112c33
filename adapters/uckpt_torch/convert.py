"""Tensors to NumPy arrays and back, without copying where memory allows.

``to_numpy`` is called by ``extract`` (save), ``writable_view`` by ``prepare``
(load, to give the core an in-place read target), ``same_memory`` and
``from_numpy`` by ``restore``. ``bfloat16`` and the float8 types travel through
an integer tensor of the same width and are reinterpreted as the matching
``ml_dtypes`` type, bit for bit.
"""
from __future__ import annotations

import sys
from typing import Any, Optional

import numpy as np
import torch

from uckpt.dtypes import name_of
from uckpt.dtypes import to_numpy as _numpy_dtype
from uckpt.errors import UnsupportedDtypeError, UnsupportedObjectError

# torch dtype -> neutral name; a dtype absent from this torch is left out
_NAMES = {
    getattr(torch, name): name
    for name in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                 "uint64", "float16", "float32", "float64", "complex64", "complex128",
                 "bfloat16", "float8_e4m3fn", "float8_e5m2")
    if hasattr(torch, name)
}
# dtypes NumPy knows only through ml_dtypes: carried as an integer of the same width
_CARRIER = {torch.bfloat16: torch.int16}
_CARRIER.update({getattr(torch, n): torch.uint8 for n in ("float8_e4m3fn", "float8_e5m2")
                 if hasattr(torch, n)})
_FROM_NAME = {name: dtype for dtype, name in _NAMES.items()}


def dtype_name(dtype: torch.dtype) -> str:
    """The neutral name of a torch dtype; UnsupportedDtypeError if the format has none."""
    try:
        return _NAMES[dtype]
    except KeyError:
        raise UnsupportedDtypeError(
            f"torch dtype {dtype} cannot be stored",
            hint="the uckpt format holds: " + ", ".join(sorted(_FROM_NAME))
                 + "; convert the tensor to one of these first (e.g. dequantize it)") from None


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    return _numpy_dtype(dtype_name(dtype))


def _cpu_strided(t: torch.Tensor) -> torch.Tensor:
    if t.layout != torch.strided:
        raise UnsupportedObjectError(
            f"a {t.layout} tensor cannot be stored", hint="convert it with .to_dense() first")
    if t.is_meta:
        raise UnsupportedObjectError("a tensor on the meta device holds no data")
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    return t.resolve_conj().resolve_neg()


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A NumPy array with the tensor's values, sharing memory with a CPU tensor.

    Strides are kept (a transposed tensor gives a transposed view); the core
    makes the bytes contiguous when it writes them.
    """
    name = dtype_name(t.dtype)
    t = _cpu_strided(t)
    carrier = _CARRIER.get(t.dtype)
    if carrier is None:
        return t.numpy()
    return t.view(carrier).numpy().view(_numpy_dtype(name))


def writable_view(t: torch.Tensor) -> Optional[np.ndarray]:
    """A writable C-contiguous array over the tensor's own memory, or None.

    None when writing into the array would not change the tensor: a tensor that
    is not on the CPU, not contiguous, not strided, or has a conjugate or
    negative bit, or whose dtype the format cannot hold.
    """
    if (not t.is_cpu or t.layout != torch.strided or is_dtensor(t)
            or not t.is_contiguous() or t.is_conj() or t.is_neg() or t.dtype not in _NAMES):
        return None
    carrier = _CARRIER.get(t.dtype)  # (as to_numpy, whose other checks were just made)
    if carrier is None:
        return t.detach().numpy()
    return t.detach().view(carrier).numpy().view(numpy_dtype(t.dtype))


def is_dtensor(t: Any) -> bool:
    """Whether ``t`` is a DTensor (:mod:`.dtensor`): a tensor subclass without memory of its
    own. Looked up in ``sys.modules``: a DTensor exists only once ``torch.distributed.tensor``
    is imported, and nothing here imports it."""
    if type(t) in PLAIN_TENSORS:  # (the common case, without the module lookup)
        return False
    mod = sys.modules.get("torch.distributed.tensor")
    cls = getattr(mod, "DTensor", None)
    return cls is not None and isinstance(t, cls)


#: the exact types of plain tensors: neither DTensors nor a lazy module's uninitialized
#: parameters (both are subclasses)
PLAIN_TENSORS = frozenset((torch.Tensor, torch.nn.Parameter))


def same_memory(arr: np.ndarray, t: torch.Tensor) -> bool:
    """True when ``arr`` is exactly the tensor's memory (same address, shape, strides, dtype)."""
    if is_dtensor(t) or t.device.type != "cpu" or t.layout != torch.strided or \
            t.dtype not in _NAMES or arr.shape != t.shape:
        return False
    dt = numpy_dtype(t.dtype)
    if arr.dtype != dt:
        return False
    size = dt.itemsize
    return (arr.strides == tuple([s * size for s in t.stride()])
            and arr.__array_interface__["data"][0] == t.data_ptr())


def from_numpy(arr: np.ndarray, like: Optional[torch.Tensor] = None) -> torch.Tensor:
    """A tensor with the array's values, on ``like``'s device when given.

    The tensor shares memory with ``arr`` when the array is writable, aligned,
    native-endian and has no negative strides; otherwise it holds a copy.
    """
    arr = np.asarray(arr)
    dtype = _FROM_NAME.get(name_of(arr.dtype))
    if dtype is None:
        raise UnsupportedDtypeError(f"NumPy dtype {arr.dtype} has no equivalent in this torch")
    if (not arr.flags.writeable or not arr.flags.aligned or not arr.dtype.isnative
            or any(s < 0 for s in arr.strides)):
        arr = arr.astype(arr.dtype.newbyteorder("="), copy=True)
    carrier = _CARRIER.get(dtype)
    if carrier is None:
        t = torch.from_numpy(arr)
    else:
        t = torch.from_numpy(arr.view(numpy_dtype(carrier))).view(dtype)
    if like is not None and like.device != t.device:
        t = t.to(like.device)
    return t


def tree_from_numpy(x: Any) -> Any:
    """Every array in a nested dict/list/tuple replaced by ``from_numpy``; containers rebuilt."""
    if isinstance(x, np.ndarray):
        return from_numpy(x)
    if isinstance(x, dict):
        return {k: tree_from_numpy(v) for k, v in x.items()}
    if isinstance(x, list):
        return [tree_from_numpy(v) for v in x]
    if isinstance(x, tuple):
        return tuple(tree_from_numpy(v) for v in x)
    return x
