"""A framework object of which ``select=`` picks some leaves: its adapter is given a whole
tree, the selected leaves from the checkpoint and the others as the object holds them now
(its ``extract``), so that only the selected ones change whatever the adapter checks."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Dict

import numpy as np

from .. import dtypes
from ..adapter import ArraySpec, DeviceArray
from ..errors import StateMismatchError
from ..tree.flatten import decode, escape
from .selection import Selection


def merged(node: Dict[str, Any], current: Any, path: str, sel: Selection,
           leaf: Callable[[Dict[str, Any]], Any], keep: Callable[[Any], Any]) -> Any:
    """The tree of manifest ``node`` (at ``path``) where ``sel`` selects its leaves (made
    by ``leaf``, as :func:`uckpt.tree.flatten.decode` makes them), and ``current`` (what
    the object holds there, passed through ``keep``) where it does not."""
    if sel.whole(path):
        return decode(node, leaf)
    if not sel.wants(path):
        return kept(current, keep)
    kind = node["type"]
    if kind == "object":
        return merged(node["state"], current, path, sel, leaf, keep)
    if kind == "dict" and isinstance(current, Mapping):
        int_keys = node.get("key_type") == "int"
        out = {k: kept(v, keep) for k, v in current.items()}
        for name, child in node["items"].items():
            here = f"{path}/{escape(name)}" if path else escape(name)
            if sel.wants(here):
                key = int(name) if int_keys else name
                out[key] = merged(child, current.get(key), here, sel, leaf, keep)
        return out
    if kind in ("list", "tuple") and isinstance(current, (list, tuple)):
        items = [kept(v, keep) for v in current]
        for i, child in enumerate(node["items"]):
            here = f"{path}/{i}" if path else str(i)
            if not sel.wants(here):
                continue
            if i > len(items) or (i == len(items) and not sel.whole(here)):
                break  # (the object has fewer items: refused below)
            items[i:i + 1] = [merged(child, current[i] if i < len(current) else None, here,
                                     sel, leaf, keep)]
        else:
            return tuple(items) if kind == "tuple" else items
    raise StateMismatchError(
        f"{path!r}: select= picks some leaves below it, but the object holds "
        f"{type(current).__name__} there, where the checkpoint has a {kind}", leaf=path,
        hint="select the whole object, or leaves that the object has")


def kept(tree: Any, keep: Callable[[Any], Any]) -> Any:
    """``tree`` with ``keep`` applied to each leaf (dicts, lists and tuples rebuilt)."""
    if isinstance(tree, Mapping):
        return {k: kept(v, keep) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        items = [kept(v, keep) for v in tree]
        return tuple(items) if isinstance(tree, tuple) else items
    return keep(tree)


def as_spec(value: Any) -> Any:
    """An array the object holds as the :class:`~uckpt.adapter.ArraySpec` that
    ``prepare`` checks (it matches itself); other values as they are."""
    if isinstance(value, (np.ndarray, DeviceArray)):
        return ArraySpec(dtypes.name_of(value.dtype), tuple(value.shape))
    return value


def on_host(value: Any) -> Any:
    """An array the object holds, as ``restore`` takes it (a device array copied to the
    host); other values as they are."""
    if isinstance(value, DeviceArray):
        out = np.empty(value.shape, value.dtype)
        done = value.copy_to(out)
        if hasattr(done, "synchronize"):
            done.synchronize()
        return out
    return value
