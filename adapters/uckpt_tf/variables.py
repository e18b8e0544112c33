"""Single variables (``tf.Variable``, ``keras.Variable``) and ``tf.Module`` objects.

``VariableAdapter``: ``extract`` returns the value as one array; ``prepare``
refuses another shape or dtype; ``restore`` assigns it. A ``keras.Variable``
and a ``tf.Variable`` load each other's checkpoints.

``ModuleAdapter`` (``tf.Module``, e.g. a ``tf.keras``-free model written with
raw variables): every ``tf.Variable`` reachable from the module's attributes,
trainable or not, keyed by attribute path (``{"dense": {"w": array}}``, list
positions as ``"0"``, ``"1"``, ...), as ``tf.Module.variables`` finds them. A
variable reachable twice is stored once. ``prepare`` raises one
``KeyMismatchError`` listing missing, unexpected and mismatched variables;
``restore`` assigns every variable. (Keras layers are not ``tf.Module``\\ s: pass
them directly, the layer adapter handles them.)
"""
from __future__ import annotations

import sys
import weakref
from typing import Any, Dict

from uckpt.adapter import Adapter

from .convert import assign, check_variables, flat, leaf_problem, nested, raise_problems, \
    to_numpy


def _is_variable(obj: Any) -> bool:
    tf = sys.modules.get("tensorflow")
    keras = sys.modules.get("keras")
    return (tf is not None and isinstance(obj, tf.Variable)) or \
        (keras is not None and isinstance(obj, keras.Variable))


class VariableAdapter(Adapter):
    name = "tf.variable"

    def handles(self, obj):
        return _is_variable(obj)

    def extract(self, obj):
        return to_numpy(obj)

    def prepare(self, obj, spec):
        self._check(obj, spec)
        return None

    def restore(self, obj, tree):
        self._check(obj, tree)
        assign(obj, tree)

    @staticmethod
    def _check(obj, leaf):
        raise_problems(f"the variable {getattr(obj, 'name', '')!r}",
                       [leaf_problem("variable", obj, leaf)])


def module_variables(module: Any) -> Dict[str, Any]:
    """Flat ``{"sub/w": variable}`` for every variable reachable from a ``tf.Module``."""
    import tensorflow as tf

    out: Dict[str, Any] = {}
    seen = set()
    for path, var in module._flatten(predicate=lambda v: isinstance(v, tf.Variable),
                                     with_path=True):
        if id(var) not in seen:
            seen.add(id(var))
            out["/".join(str(p).replace("/", "_") for p in path)] = var
    return out


class NamedVariablesAdapter(Adapter):
    """An object that is a set of variables by name (a Keras layer, a ``tf.Module``).

    Subclasses say how to list the variables (``variables``) and how to name the
    object in errors (``describe``); extract, prepare and restore are shared.
    """

    hint = ""
    partial = True  # strict=False: the variables both hold are loaded, the others reported

    def __init__(self) -> None:
        #: objects being loaded with strict=False (from ``prepare`` to ``restore``)
        self._partial: "weakref.WeakSet" = weakref.WeakSet()

    def variables(self, obj) -> Dict[str, Any]:
        raise NotImplementedError

    def describe(self, obj) -> str:
        raise NotImplementedError

    def extract(self, obj):
        return nested((k.split("/"), to_numpy(v)) for k, v in self.variables(obj).items())

    def variables_for(self, obj, tree) -> Dict[str, Any]:
        """The variables to restore from ``tree``, by key (a subclass may choose its naming
        by the checkpoint's layout)."""
        return self.variables(obj)

    def prepare(self, obj, spec, keys=None):
        check_variables(self.describe(obj), self.variables_for(obj, spec), spec, self.hint, keys)
        self._partial.discard(obj)
        if keys is not None:
            self._partial.add(obj)
        return None

    def restore(self, obj, tree):
        live = self.variables_for(obj, tree)
        saved = flat(tree) if isinstance(tree, dict) else tree
        if obj in self._partial and isinstance(saved, dict):
            self._partial.discard(obj)
            live = {k: v for k, v in live.items() if k in saved}
        check_variables(self.describe(obj), live, tree, self.hint)
        for key, var in live.items():
            assign(var, saved[key])


class ModuleAdapter(NamedVariablesAdapter):
    name = "tf.module"
    hint = "create the module with the same attributes and variables that were saved"

    def handles(self, obj):
        tf = sys.modules.get("tensorflow")
        return tf is not None and isinstance(obj, tf.Module)

    def variables(self, obj):
        return module_variables(obj)

    def describe(self, obj):
        return f"the {type(obj).__name__} module {obj.name!r}"
