"""Checks shared by the adapters' ``prepare`` and ``restore``: they only read.

``array_problem`` compares one checkpoint leaf (an :class:`~uckpt.adapter.ArraySpec`
in ``prepare``, the loaded ``ndarray`` in ``restore``) with its destination
tensor (for a DTensor: the global shape in ``prepare``; in ``restore`` the
loaded array may also be the local box it was read into) and
``raise_problems`` turns every problem found into one error (a dtype differs only
where the load's ``cast=`` does not convert it: :meth:`ArraySpec.fits`; the core then
delivers the array in the tensor's dtype); ``check_class``
compares the class recorded by ``extract`` with the object's own.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

from uckpt.adapter import (ArraySpec, Problem, check_class, class_name,  # noqa: F401
                           raise_problems)  # re-exported for the adapter modules
from uckpt.dtypes import name_of
from uckpt.errors import DtypeMismatchError, ShapeMismatchError, StateMismatchError

from .convert import dtype_name


def _signature(leaf: Any):
    """(neutral dtype name, shape) of an ArraySpec or ndarray; None for any other leaf."""
    if isinstance(leaf, ArraySpec):
        return leaf.dtype, tuple(leaf.shape)
    if isinstance(leaf, np.ndarray):
        return name_of(leaf.dtype), leaf.shape
    return None


def _is_local_box(key: str, leaf: Any, t: torch.Tensor) -> bool:
    """A loaded array with the shape of a DTensor's local tensor: the box it was given to
    read into (``prepare`` compares the checkpoint's global shape with ``t.shape``)."""
    from .dtensor import is_dtensor, layout

    return isinstance(leaf, np.ndarray) and is_dtensor(t) and \
        tuple(leaf.shape) == tuple(layout(t, key, "loaded into")[0].shape)


def array_problem(key: str, t: torch.Tensor, leaf: Any) -> Optional[Problem]:
    """Why ``leaf`` cannot go into ``t`` (error class, sentence), or None if it can."""
    sig = _signature(leaf)
    if sig is None:
        return StateMismatchError, \
            f"{key}: the checkpoint holds a {type(leaf).__name__}, not an array"
    dtype, shape = sig
    if shape != tuple(t.shape) and not _is_local_box(key, leaf, t):
        return ShapeMismatchError, \
            f"{key}: shape {list(shape)} in the checkpoint, {list(t.shape)} in the object"
    have = dtype_name(t.dtype)
    if dtype != have and not (isinstance(leaf, ArraySpec) and leaf.fits(have)):
        return DtypeMismatchError, \
            f"{key}: dtype {dtype} in the checkpoint, {have} in the object"
    return None
