"""The adapters of :mod:`uckpt_jax`: arrays, pytree nodes, Flax NNX objects and variables.

* :class:`ArrayAdapter` (``jax.array``): a ``jax.Array`` (typed PRNG keys included) or, on
  load, a ``jax.ShapeDtypeStruct`` carrying a sharding. ``restore`` returns the new array.
* :class:`NodeAdapter` (``jax.pytree``): a registered pytree node that is not a dict, list
  or tuple (``flax.struct`` and registered dataclasses, custom nodes), saved as a dict of
  its children by name. ``restore`` returns the new node.
* :class:`NnxAdapter` (``flax.nnx``): a Flax NNX module or optimizer (an ``nnx.Pytree``),
  saved as ``nnx.state(obj).to_pure_dict()``, restored in place with ``nnx.update``.
* :class:`VariableAdapter` (``flax.nnx.variable``): one ``nnx.Variable`` (the values of an
  ``nnx.State``), restored in place with ``set_value``.

Each checks the whole checkpoint subtree against the live object in ``prepare``
(:func:`uckpt_jax.pytree.targets`), so that a mismatch changes nothing.
"""
from __future__ import annotations

import sys
from typing import Any, List


from uckpt.adapter import Adapter, Problem
from uckpt.errors import StateMismatchError

from .arrays import is_array
from .pytree import is_node, rebuild, targets, to_state


#: what fixes a target that does not match the checkpoint
HINT = ("restore into a pytree of the structure that was saved: the same code's objects, or "
        "jax.eval_shape of the function that made them (ShapeDtypeStructs, given a sharding "
        "to place the arrays); uckpt.load(path) without a target shows what was saved")


def _checked(obj: Any, spec: Any, what: str) -> Any:
    """The read targets of ``obj`` for ``spec``; one error listing every mismatch."""
    problems: List[Problem] = []
    out = targets(obj, spec, "", problems)
    if problems:
        classes = {cls for cls, _ in problems}
        cls = classes.pop() if len(classes) == 1 else StateMismatchError
        raise cls("\n".join([f"{what} does not match the checkpoint"]
                             + [f"  {msg}" for _, msg in problems]), hint=HINT)
    return out


class _Replaced(Adapter):
    """An immutable pytree: saved with :func:`to_state`, checked whole by ``prepare``,
    and made anew by ``restore`` (which returns it)."""

    def extract(self, obj):
        return to_state(obj)

    def prepare(self, obj, spec):
        what = "the jax.Array" if is_array(obj) else f"the {type(obj).__qualname__}"
        return _checked(obj, spec, what)

    def restore(self, obj, tree):
        return rebuild(obj, tree)


class ArrayAdapter(_Replaced):
    name = "jax.array"

    def handles(self, obj):
        return is_array(obj)


class NodeAdapter(_Replaced):
    name = "jax.pytree"

    def handles(self, obj):
        return is_node(obj)


def _nnx():
    return sys.modules.get("flax.nnx")


class NnxAdapter(Adapter):
    name = "flax.nnx"

    def handles(self, obj):
        nnx = _nnx()
        return nnx is not None and isinstance(obj, nnx.Pytree)

    def extract(self, obj):
        nnx = _nnx()
        return to_state(nnx.to_pure_dict(nnx.state(obj)))

    def prepare(self, obj, spec):
        nnx = _nnx()
        return _checked(nnx.to_pure_dict(nnx.state(obj)), spec, f"the {type(obj).__qualname__}")

    def restore(self, obj, tree):
        nnx = _nnx()
        state = nnx.state(obj)
        nnx.replace_by_pure_dict(state, rebuild(nnx.to_pure_dict(state), tree))
        nnx.update(obj, state)
        return None  # in place: an NNX object is mutable


class VariableAdapter(Adapter):
    name = "flax.nnx.variable"

    def handles(self, obj):
        nnx = _nnx()
        return nnx is not None and isinstance(obj, nnx.Variable)

    def extract(self, obj):
        return to_state(obj.get_value())

    def prepare(self, obj, spec):
        return _checked(obj.get_value(), spec, f"the {type(obj).__qualname__}")

    def restore(self, obj, tree):
        obj.set_value(rebuild(obj.get_value(), tree))
        return None


__all__ = ["ArrayAdapter", "NodeAdapter", "NnxAdapter", "VariableAdapter"]
