"""JAX pytrees <-> uckpt state trees, for the adapters of :mod:`uckpt_jax`.

:func:`to_state` (save) turns a pytree into a state tree: dicts, lists and tuples stay
(a namedtuple is saved as a tuple), a registered node (a ``flax.struct`` or registered
dataclass, a custom node) becomes a dict of its children by their key names, a
``jax.Array`` a :func:`uckpt_jax.arrays.to_leaf`, a typed PRNG key ``{"impl": name,
"key_data": array}``; NumPy arrays and Python values are leaves as they are.

:func:`targets` (load, before reading) walks a live pytree (``like``: arrays, or
``jax.ShapeDtypeStruct`` leaves carrying a sharding) against the checkpoint's spec
tree, collecting what does not fit, and returns the read targets.
:func:`rebuild` (after reading) makes the new pytree: ``like``'s structure and types
(namedtuples, dataclasses, a node's static fields), new ``jax.Array``\\ s placed with
``like``'s shardings.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Dict, List, Tuple

import jax
import numpy as np

from uckpt.adapter import ArraySpec, Problem
from uckpt.dtypes import name_of
from uckpt.errors import (DtypeMismatchError, KeyMismatchError, ShapeMismatchError,
                          StateMismatchError, UnsupportedObjectError)

from .arrays import from_host, is_array, is_key, key_from_host, key_impl, read_target, to_leaf

_VALUES = (type(None), bool, int, float, str, bytes, np.generic, np.ndarray)


def _name(key: Any) -> Any:
    """A child's name from its jax key path entry (a str, or an int for positions)."""
    for attr in ("name", "key", "idx"):
        if hasattr(key, attr):
            value = getattr(key, attr)
            return value if isinstance(value, int) else str(value)
    return str(key)


def is_node(x: Any) -> bool:
    """Whether ``x`` is a registered pytree node the core does not know as a container."""
    if isinstance(x, (Mapping, list, tuple) + _VALUES) or is_array(x):
        return False
    treedef = jax.tree_util.tree_structure(x, is_leaf=lambda y: y is not x)
    return not jax.tree_util.treedef_is_leaf(treedef)


def children(node: Any) -> Tuple[List[Tuple[Any, Any]], Any]:
    """``([(name, child), ...], treedef)`` of a registered node, one level down."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda y: y is not node)
    return [(_name(path[-1]), child) for path, child in flat], treedef


def _keyed(items: List[Tuple[Any, Any]]) -> Dict[Any, Any]:
    if all(isinstance(k, int) for k, _ in items):
        return dict(items)
    return {str(k): v for k, v in items}


def to_state(x: Any, path: str = "") -> Any:
    """The state tree of pytree ``x`` on save (see the module docstring)."""
    if isinstance(x, jax.ShapeDtypeStruct):
        raise UnsupportedObjectError(
            f"{path or '<root>'!r} is a jax.ShapeDtypeStruct: it has a shape, no values to save",
            leaf=path or None, hint="save the arrays; ShapeDtypeStructs are load targets")
    if isinstance(x, jax.Array):
        if is_key(x):
            return {"impl": key_impl(x), "key_data": to_leaf(jax.random.key_data(x), path)}
        return to_leaf(x, path)
    if isinstance(x, _VALUES):
        return x
    if isinstance(x, Mapping):
        return {k: to_state(v, _at(path, k)) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        items = [to_state(v, _at(path, i)) for i, v in enumerate(x)]
        return items if isinstance(x, list) else tuple(items)
    if is_node(x):
        kids, _ = children(x)
        return _keyed([(k, to_state(v, _at(path, k))) for k, v in kids])
    return x  # another framework's object: its own adapter


def _here(path: str) -> str:
    """Where in the object a problem is (nothing for the object itself)."""
    return f"{path!r}: " if path else ""


def _at(path: str, key: Any) -> str:
    return f"{path}/{key}" if path else str(key)


def _get(tree: Mapping, key: Any) -> Any:
    return tree[key] if key in tree else tree[str(key)]


def _has(tree: Mapping, key: Any) -> bool:
    return key in tree or str(key) in tree


def _key_sets(like_keys: List[Any], spec: Mapping, path: str) -> List[Problem]:
    want = {str(k) for k in like_keys}
    have = {str(k) for k in spec}
    if want == have:
        return []
    missing, unexpected = sorted(want - have), sorted(have - want)
    return [(KeyMismatchError, f"{_here(path)}keys missing from the checkpoint "
             f"{missing}, in the checkpoint only {unexpected}")]


def targets(like: Any, spec: Any, path: str, problems: List[Problem]) -> Any:
    """Check ``spec`` (the checkpoint, arrays as ArraySpecs) against pytree ``like``;
    append what does not fit to ``problems``; return the read targets (None: fresh)."""
    if is_array(like):
        if is_key(like):
            if not (isinstance(spec, Mapping) and set(spec) == {"impl", "key_data"}):
                problems.append((StateMismatchError, f"{_here(path)}the state holds typed PRNG "
                                 f"keys, the checkpoint {_kind(spec)}"))
                return None
            impl = _impl_of(like)
            if impl is not None and spec["impl"] != impl:
                problems.append((StateMismatchError, f"{_here(path)}the checkpoint holds "
                                 f"{spec['impl']} keys, the state {impl} keys"))
            data, want = spec["key_data"], jax.eval_shape(jax.random.key_data, like).shape
            if isinstance(data, ArraySpec) and tuple(data.shape) != tuple(want):
                problems.append((ShapeMismatchError, f"{_here(path)}the checkpoint holds key data "
                                 f"of shape {list(data.shape)}, the state's keys of shape "
                                 f"{list(like.shape)} have {list(want)}"))
            return None
        if not isinstance(spec, ArraySpec):
            problems.append((StateMismatchError, f"{_here(path)}the state holds an array, the "
                             f"checkpoint {_kind(spec)}"))
            return None
        if tuple(spec.shape) != tuple(like.shape):
            problems.append((ShapeMismatchError, f"{_here(path)}the checkpoint holds shape "
                             f"{list(spec.shape)}, the state {list(like.shape)}"))
            return None
        dtype = name_of(np.dtype(like.dtype))
        if not spec.fits(dtype):
            problems.append((DtypeMismatchError, f"{_here(path)}the checkpoint holds "
                             f"{spec.dtype}, the state {dtype}"))
            return None
        return read_target(like, np.dtype(like.dtype))
    if isinstance(like, np.ndarray) or isinstance(like, _VALUES):
        return None  # delivered as loaded
    if isinstance(like, (list, tuple)):
        if not isinstance(spec, (list, tuple)) or len(spec) != len(like):
            problems.append((StateMismatchError, f"{_here(path)}the state holds a sequence of "
                             f"{len(like)}, the checkpoint {_kind(spec)}"))
            return None
        return [targets(v, s, _at(path, i), problems) for i, (v, s) in
                enumerate(zip(like, spec))]
    items = list(like.items()) if isinstance(like, Mapping) else \
        children(like)[0] if is_node(like) else None
    if items is None:
        problems.append((StateMismatchError, f"{_here(path)}a {type(like).__qualname__} is not "
                         "a JAX pytree"))
        return None
    if not isinstance(spec, Mapping):
        problems.append((StateMismatchError, f"{_here(path)}the state holds a "
                         f"{type(like).__qualname__}, the checkpoint {_kind(spec)}"))
        return None
    found = _key_sets([k for k, _ in items], spec, path)
    if found:
        problems.extend(found)
        return None
    return {k if k in spec else str(k): targets(v, _get(spec, k), _at(path, k), problems)
            for k, v in items}


def _kind(spec: Any) -> str:
    if isinstance(spec, ArraySpec):
        return f"an array of shape {list(spec.shape)}"
    if isinstance(spec, Mapping):
        return f"a mapping of keys {sorted(map(str, spec))[:8]}"
    if isinstance(spec, (list, tuple)):
        return f"a sequence of {len(spec)}"
    return f"the value {spec!r}"


def _impl_of(like: Any) -> Any:
    try:
        return key_impl(like)
    except (TypeError, ValueError, AttributeError):  # a ShapeDtypeStruct of keys
        impl = getattr(like.dtype, "_impl", None)
        return getattr(impl, "name", None)


def rebuild(like: Any, value: Any, path: str = "") -> Any:
    """The new pytree of ``like``'s structure holding the loaded ``value``."""
    if is_array(like):
        if is_key(like):
            return key_from_host(value["impl"], value["key_data"], like)
        return from_host(value, like, path)
    if isinstance(like, _VALUES):
        return value
    if isinstance(like, (list, tuple)):
        items = [rebuild(v, x, _at(path, i)) for i, (v, x) in enumerate(zip(like, value))]
        if isinstance(like, tuple):
            make = getattr(type(like), "_make", None)
            return make(items) if make is not None else type(like)(items) \
                if type(like) is not tuple else tuple(items)
        return items if type(like) is list else type(like)(items)
    if isinstance(like, Mapping):
        out = {k: rebuild(v, _get(value, k), _at(path, k)) for k, v in like.items()}
        if type(like) is dict:
            return out
        cls: Any = type(like)  # FrozenDict, nnx.State: made from a dict
        try:
            return cls(out)
        except TypeError:
            return out
    kids, treedef = children(like)
    return treedef.unflatten([rebuild(v, _get(value, k), _at(path, k)) for k, v in kids])
