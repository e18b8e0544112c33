"""Variables to NumPy arrays and back, and the checks every adapter of this package shares.

``to_numpy`` is called by ``extract`` (save); ``leaf_problem`` by ``prepare``
(with :class:`~uckpt.adapter.ArraySpec` leaves) and again by ``restore`` (with
the loaded arrays); ``assign`` by ``restore``. They work on ``tf.Variable`` and
``keras.Variable`` alike and import neither framework: both expose
``dtype``, ``shape``, ``numpy()`` and ``assign()``, and TensorFlow's dtype names
are the format's neutral names (``bfloat16`` arrays come back as
``ml_dtypes.bfloat16``).

``nested`` / ``flat`` convert between the nested dicts the adapters store
(``{"conv2d": {"kernel": array}}``, so manifest paths read
``model/conv2d/kernel``) and flat ``"conv2d/kernel"`` keys for comparisons and
messages.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

import numpy as np

from uckpt.adapter import (ArraySpec, Problem, check_class, class_name,  # noqa: F401
                           raise_problems)  # re-exported for the adapter modules
from uckpt.dtypes import NAMES, name_of
from uckpt.errors import (DtypeMismatchError, KeyMismatchError, ShapeMismatchError,
                          StateMismatchError, UnsupportedDtypeError)



def dtype_name(var: Any) -> str:
    """The neutral dtype name of a variable or tensor (TF ``DType`` or Keras dtype string)."""
    dtype = var.dtype
    name = dtype if isinstance(dtype, str) else getattr(dtype, "name", str(dtype))
    if name == "half":
        name = "float16"
    if name not in NAMES:
        raise UnsupportedDtypeError(
            f"a variable of dtype {name} cannot be stored",
            hint="the uckpt format holds: " + ", ".join(NAMES))
    return name


def shape_of(var: Any) -> Tuple[int, ...]:
    return tuple(int(d) for d in var.shape)


def to_numpy(var: Any) -> np.ndarray:
    """The variable's current value as a read-only NumPy array that later updates of the
    variable never change.

    Where it can, this is a read of the variable (``read_value()``) viewed without a
    copy: TensorFlow copies a variable's buffer before updating it while a read of
    that buffer is alive (assignments, optimizer kernels, XLA-compiled steps alike;
    tests/test_tf_snapshot.py checks it), so the read is a snapshot that cost no
    copy. ``numpy()`` copies every byte (into first-touched memory, which is slow for a
    large state), which a save would then copy again or write."""
    arr = _read_view(var)
    if arr is None or name_of(arr.dtype) != dtype_name(var):
        arr = np.asarray(var.numpy())  # the public, copying way
    if name_of(arr.dtype) != dtype_name(var):  # e.g. a framework's own bfloat16 type
        raise UnsupportedDtypeError(f"{dtype_name(var)} variable read back as {arr.dtype}")
    return arr


def _read_view(var: Any) -> Optional[np.ndarray]:
    """A read of ``var`` as a read-only array sharing the read's buffer, or None where
    the variable offers none (then the caller copies)."""
    inner = getattr(var, "value", None)  # a keras.Variable's tf.Variable (a method on tf's)
    target = var if inner is None or callable(inner) else inner
    read = getattr(target, "read_value", None)
    if read is None:
        return None
    try:
        arr = read()._numpy()  # the array keeps the read tensor alive
    except Exception:  # noqa: BLE001 - any variable kind without it: the copying way
        return None
    if not isinstance(arr, np.ndarray):
        return None
    arr.flags.writeable = False  # the buffer may still be the variable's until it changes
    return arr


def assign(var: Any, arr: np.ndarray) -> None:
    var.assign(np.asarray(arr))


def signature(leaf: Any) -> Optional[Tuple[str, Tuple[int, ...]]]:
    """(neutral dtype name, shape) of an ArraySpec or ndarray; None for any other leaf."""
    if isinstance(leaf, ArraySpec):
        return leaf.dtype, tuple(leaf.shape)
    if isinstance(leaf, np.ndarray):
        return name_of(leaf.dtype), tuple(leaf.shape)
    return None


def leaf_problem(key: str, var: Any, leaf: Any) -> Optional[Problem]:
    """Why the checkpoint's ``leaf`` cannot go into ``var`` (error class, sentence), or None."""
    sig = signature(leaf)
    if sig is None:
        return StateMismatchError, f"{key}: the checkpoint holds a {type(leaf).__name__}, " \
                                   "not an array"
    dtype, shape = sig
    if shape != shape_of(var):
        return ShapeMismatchError, \
            f"{key}: shape {list(shape)} in the checkpoint, {list(shape_of(var))} in the object"
    have = dtype_name(var)
    if dtype != have and not (isinstance(leaf, ArraySpec) and leaf.fits(have)):
        return DtypeMismatchError, \
            f"{key}: dtype {dtype} in the checkpoint, {have} in the object"
    return None


def check_variables(what: str, live: Mapping[str, Any], saved: Any, hint: str,
                    keys: Any = None) -> None:
    """Compare flat ``{key: variable}`` with the checkpoint's nested tree; raise on any difference.

    Missing and unexpected keys raise one :class:`KeyMismatchError` that also
    lists shape and dtype differences; otherwise those raise alone. With ``keys`` (a
    ``strict=False`` load's :class:`uckpt.loading.report.KeySink`) they are reported there
    instead, and only the variables both hold are compared.
    """
    if not isinstance(saved, Mapping):
        raise StateMismatchError(f"the checkpoint holds a {type(saved).__name__} where {what} "
                                 "expects a mapping of variables")
    saved = flat(saved)
    problems = [leaf_problem(k, v, saved[k]) for k, v in live.items() if k in saved]
    problems = [p for p in problems if p]
    missing = live.keys() - saved.keys()
    unexpected = saved.keys() - live.keys()
    if keys is not None:
        for k in sorted(missing):
            keys.missing(k.split("/"))
        for k in sorted(unexpected):
            keys.unexpected(k.split("/"))
        missing = unexpected = set()
    if missing or unexpected:
        raise KeyMismatchError(what, missing=missing, unexpected=unexpected,
                               mismatched=[msg for _, msg in problems], hint=hint)
    raise_problems(what, problems)


def unique(name: str, used: Dict[str, int]) -> str:
    """``name``, or ``name_1``, ``name_2``, ... if it was taken before (counts in ``used``)."""
    if name not in used:
        used[name] = 0
        return name
    while True:
        used[name] += 1
        candidate = f"{name}_{used[name]}"
        if candidate not in used:
            used[candidate] = 0
            return candidate


def flat(tree: Mapping, prefix: str = "") -> Dict[str, Any]:
    """``{"a": {"b": x}}`` -> ``{"a/b": x}`` (keys converted to ``str``)."""
    out: Dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flat(v, key + "/"))
        else:
            out[key] = v
    return out


def nested(items: Iterable[Tuple[List[str], Any]]) -> Dict[str, Any]:
    """``[(["a", "b"], x)]`` -> ``{"a": {"b": x}}``."""
    out: Dict[str, Any] = {}
    for parts, value in items:
        node = out
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return out
