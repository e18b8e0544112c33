"""Objects a load replaces instead of filling: immutable arrays (JAX) and their containers.

An adapter's ``restore`` returns None when it restored its object in place (PyTorch,
TensorFlow, Chainer), or a new object that stands for it (a ``jax.Array`` cannot be
written into). :func:`write_back` puts each new object where the old one was in the
state: into its mapping (or list), and into a tuple, namedtuple or immutable mapping
rebuilt around it, itself put back into its own container. :func:`returned` builds the
tree a load returns: the new objects at their paths, the loaded arrays and values
elsewhere, tuples and namedtuples of the state's own types.

Paths are those of :mod:`uckpt.tree.flatten` (escaped keys joined by ``/``; a sequence's
items by index; a :class:`~uckpt.tree.shard.PerRank` value under its rank).
"""
from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any, Callable, Dict, Iterable, Set

import numpy as np

from ..tree.flatten import decode, escape
from ..tree.shard import PerRank

# values (and lists and tuples of them) a load returns rather than fills
_VALUES = (type(None), bool, int, float, str, bytes, list, tuple, np.generic)


def ancestors(paths: Iterable[str]) -> Set[str]:
    """Every path above one of ``paths`` and the paths themselves ("" is the root)."""
    out = {""}
    for path in paths:
        parts = path.split("/")
        out.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    return out


def _child(path: str, key: str) -> str:
    return f"{path}/{key}" if path else key


def rebuilt(like: Any, items: list) -> Any:
    """A sequence of ``like``'s type holding ``items`` (a namedtuple keeps its type)."""
    if isinstance(like, tuple):
        make = getattr(type(like), "_make", None)
        if make is not None:
            return make(items)
        return tuple(items) if type(like) is tuple else type(like)(items)
    return items if type(like) is list else type(like)(items)


class Replacer:
    """The new objects of one load (``new``: path -> object), the sequences the load went
    into (``sequences``: paths), and the PerRank rank of this process."""

    def __init__(self, new: Dict[str, Any], sequences: Set[str], rank: int = 0) -> None:
        self.new = new
        self.sequences = sequences
        self.rank = rank
        self.touched = ancestors(list(new) + list(sequences)) if new or sequences else set()

    def write_back(self, obj: Any, node: Dict[str, Any], path: str,
                   leaf: Callable[[Dict[str, Any]], Any]) -> Any:
        """``obj`` (manifest ``node``) with the new objects below ``path`` in place: the
        same container where it is mutable (changed in place), a rebuilt one where it is
        not; the values of a sequence the load went into are the loaded ones."""
        if path in self.new:
            return self.new[path]
        if path not in self.touched:
            return obj
        if path in self.sequences:
            items = []
            for i, (v, n) in enumerate(zip(obj, node["items"])):
                here = _child(path, str(i))
                items.append(self.write_back(v, n, here, leaf) if here in self.touched else
                             decode(n, leaf) if isinstance(v, _VALUES) else v)
            if type(obj) is list:
                obj[:] = items
                return obj
            return rebuilt(obj, items)
        node = _as_dict(obj, node)
        kind = node["type"]
        if isinstance(obj, PerRank) and kind == "dict":
            here = str(self.rank)
            obj.value = self.write_back(obj.value, node["items"][here], _child(path, here), leaf)
            return obj
        if isinstance(obj, Mapping) and kind == "dict":
            changed = {}
            for key, value in obj.items():
                name = str(key)
                if name in node["items"]:
                    new = self.write_back(value, node["items"][name],
                                          _child(path, escape(name)), leaf)
                    if new is not value:
                        changed[key] = new
            if not changed:
                return obj
            if isinstance(obj, MutableMapping):
                for key, new in changed.items():
                    obj[key] = new
                return obj
            return _remade(obj, {**obj, **changed})
        return obj

    def returned(self, obj: Any, node: Dict[str, Any], path: str,
                 leaf: Callable[[Dict[str, Any]], Any]) -> Any:
        """What a load returns for ``obj`` of the state (manifest ``node``): the new object,
        or the loaded tree (:func:`uckpt.tree.flatten.decode`), of the state's sequence
        types where the load went into them."""
        if path in self.new:
            return self.new[path]
        if path not in self.touched:
            return decode(node, leaf)
        node = _as_dict(obj, node)
        kind = node["type"]
        if path in self.sequences:
            return rebuilt(obj, [self.returned(v, n, _child(path, str(i)), leaf)
                                 for i, (v, n) in enumerate(zip(obj, node["items"]))])
        if isinstance(obj, PerRank) and kind == "dict":
            return {int(k): self.returned(obj.value, n, _child(path, k), leaf)
                    if int(k) == self.rank else decode(n, leaf) for k, n in node["items"].items()}
        if isinstance(obj, Mapping) and kind == "dict":
            int_keys = node.get("key_type") == "int"
            out = {}
            for name, n in node["items"].items():
                key = int(name) if int_keys else name
                out[key] = self.returned(obj[key], n, _child(path, escape(name)), leaf) \
                    if key in obj else decode(n, leaf)
            return out
        return decode(node, leaf)


def _as_dict(obj: Any, node: Dict[str, Any]) -> Dict[str, Any]:
    """The node a mapping of the state was matched with: an object's state loaded as a
    mapping (an NNX module's state into a pytree of arrays) is its dict."""
    if node["type"] == "object" and isinstance(obj, Mapping):
        return node["state"]
    return node


def _remade(like: Mapping, items: Dict[Any, Any]) -> Any:
    """A mapping of ``like``'s type (e.g. Flax's FrozenDict) holding ``items``; a dict when
    that type cannot be made from one."""
    cls: Any = type(like)
    try:
        return cls(items)
    except TypeError:
        return dict(items)
