"""Chainer's serializer protocol, into a uckpt state tree and back.

Every stateful Chainer object (links, optimizers, trainers, updaters,
iterators, extensions, triggers) implements ``serialize(serializer)``, the
protocol behind ``chainer.serializers.save_npz``. :class:`TreeSerializer` is
handed to it on save and records every entry in a nested ``dict``, one level
per path component, so a checkpoint holds exactly what ``save_npz`` would,
under the same paths (``updater/model:main/predictor/l1/W``).
:class:`TreeDeserializer` is handed to it on load and gives every entry back.

Save: ``serialize_tree(obj, serialize)`` (``extract``). Array leaves are the live NumPy
arrays (no copy; the core copies or writes them before ``save`` returns);
arrays on another device are copied to the host. ``probe(obj, serialize)`` records the
same tree with the live values untouched, for ``prepare`` to compare with a
checkpoint.

Load (``restore``, after ``prepare`` has checked the tree): each call gives
back exactly the value saved, type included (a Python ``int`` stays an
``int``, a ``numpy.float32`` a ``numpy.float32``). An array is copied into the
live array passed in (unless the core already read it there), after checking
shape and dtype; a saved ``None`` returns ``None``; a missing entry raises
:class:`MissingEntry` (a ``KeyError``, which is how Chainer's objects learn
that an optional entry is absent), except that a request whose live value is
``None`` gets ``None`` back (an update rule without state stays without state,
as it was saved).
"""
from __future__ import annotations

from typing import Any, Dict, Tuple

import chainer
import numpy as np
from chainer import serializer as _protocol

from uckpt.dtypes import name_of
from uckpt.errors import DtypeMismatchError, KeyMismatchError, ShapeMismatchError, \
    StateMismatchError, UnsupportedObjectError

_ABSENT = object()


def split(key: str) -> Tuple[str, ...]:
    """Path components of a serializer key (Chainer strips and joins with ``/``)."""
    return tuple(p for p in str(key).split("/") if p)


def join(parts) -> str:
    return "/".join(parts)


def is_array(value: Any) -> bool:
    """A NumPy array or an array of a Chainer backend (CuPy, ChainerX, iDeep)."""
    return isinstance(value, chainer.get_array_types())


def to_host(value: Any) -> Any:
    """What a tree leaf holds for ``value``: a NumPy array for any backend's array."""
    if isinstance(value, chainer.Variable):
        value = value.array
    if value is None or isinstance(value, np.ndarray) or not is_array(value):
        return value
    return chainer.backend.CpuDevice().send(value)


def is_deserializer(s: Any) -> bool:
    return isinstance(s, _protocol.Deserializer)


class TreeSerializer(_protocol.Serializer):
    """Records ``obj.serialize(self)`` into :attr:`target`, a nested dict.

    ``host=False`` keeps the values as they are (device arrays, Variables):
    ``prepare`` compares those with the checkpoint without copying anything.
    Subtrees are created on their first entry, so an object that writes
    nothing leaves no trace.
    """

    def __init__(self, target: Dict[str, Any] = None, parts: Tuple[str, ...] = (),
                 host: bool = True) -> None:
        self.target = {} if target is None else target
        self.parts = parts
        self.host = host

    def __getitem__(self, key):
        return TreeSerializer(self.target, self.parts + split(key), self.host)

    def __call__(self, key, value):
        parts = self.parts + split(key)
        if not parts:
            raise ValueError("a serializer entry needs a non-empty key")
        node = self.target
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            held = node.get(part, _ABSENT)
            if (isinstance(held, dict) and last) or (held is not _ABSENT and not
                                                     isinstance(held, dict) and not last):
                raise UnsupportedObjectError(
                    f"Chainer serialized both a value and entries below {join(parts[:i + 1])!r}; "
                    "a uckpt tree cannot hold both")
            if last:
                node[part] = to_host(value) if self.host else value
            else:
                node = node.setdefault(part, {})
        return value


class MissingEntry(KeyError):
    """An entry the object asked for is not in the checkpoint (``args[0]``: its path)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


class TreeDeserializer(_protocol.Deserializer):
    """Gives the entries of a loaded tree back to ``obj.serialize(self)``."""

    def __init__(self, tree: Any, parts: Tuple[str, ...] = (), strict: bool = True) -> None:
        self.tree = tree
        self.parts = parts
        self.strict = strict  # False: an entry the tree lacks leaves the value as it is

    def __getitem__(self, key):
        return TreeDeserializer(self.tree, self.parts + split(key), self.strict)

    def _lookup(self, parts):
        node = self.tree
        for part in parts:
            if not isinstance(node, dict) or part not in node:
                return _ABSENT
            node = node[part]
        return node

    def __call__(self, key, value):
        parts = self.parts + split(key)
        path = join(parts)
        stored = self._lookup(parts)
        if stored is _ABSENT:
            if value is None or not self.strict:
                return value
            raise MissingEntry(path)
        if isinstance(stored, dict):
            raise StateMismatchError(f"{path!r}: the checkpoint holds entries below this path, "
                                     f"the object asks for a value", leaf=path)
        if stored is None or value is None:
            return stored
        if isinstance(value, chainer.Variable):
            value = value.array
        if is_array(value):
            copy_into(value, stored, path)
            return value
        if isinstance(value, (bool, int, float)) and isinstance(stored, np.ndarray) and \
                stored.ndim == 0:  # Chainer's own files hold scalars as 0-d arrays
            return type(value)(stored)
        return stored

    def has(self, key: str) -> bool:
        """Whether the tree holds an entry at ``key`` below this serializer's path."""
        return self._lookup(self.parts + split(key)) is not _ABSENT


def copy_into(dest: Any, stored: Any, path: str) -> None:
    """Copy a loaded array into a live one of the same shape and dtype (any backend)."""
    src = np.asarray(stored)
    if tuple(src.shape) != tuple(dest.shape):
        raise ShapeMismatchError(f"{path!r}: the checkpoint holds shape {list(src.shape)}, "
                                 f"the object has {list(dest.shape)}", leaf=path)
    if name_of(src.dtype) != name_of(dest.dtype):
        raise DtypeMismatchError(f"{path!r}: the checkpoint holds {name_of(src.dtype)}, "
                                 f"the object has {name_of(dest.dtype)}", leaf=path)
    if isinstance(dest, np.ndarray):
        if src is not dest:
            np.copyto(dest, src)
        return
    # CuPy, ChainerX, iDeep: Chainer's own NPZ deserializer knows how to copy into each
    from chainer.serializers import NpzDeserializer

    NpzDeserializer({"x": src})("x", dest)


def serialize_tree(obj: Any, serialize) -> Dict[str, Any]:
    """The tree ``serialize(obj, TreeSerializer())`` records (host arrays)."""
    s = TreeSerializer()
    serialize(obj, s)
    return s.target


def probe(obj: Any, serialize) -> Dict[str, Any]:
    """The same tree with live values (no device copies), for ``prepare``."""
    s = TreeSerializer(host=False)
    serialize(obj, s)
    return s.target


def restore_with(obj, tree, serialize, what: str, strict: bool = True) -> None:
    """Run ``serialize(obj, TreeDeserializer(tree, strict=strict))`` (``strict=False``:
    entries the tree lacks are left as they are).

    NumPy's global generator is left as it was: restoring a link initializes
    its uninitialized parameters (with the saved shape, then overwritten), and
    an initializer draws random numbers, which must not shift a generator that
    ``uckpt.RandomState()`` restored before. A missing entry becomes a
    KeyMismatchError that says the object may be partly restored.
    """
    rng = np.random.get_state()
    try:
        serialize(obj, TreeDeserializer(tree, strict=strict))
    except MissingEntry as e:
        raise KeyMismatchError(
            what, missing=[e.path],
            hint="the object asked for an entry the checkpoint lacks after part of it was "
                 "restored; restore it again from a checkpoint that matches it") from None
    finally:
        np.random.set_state(rng)
