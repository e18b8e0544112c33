"""Keras layers and models (Keras 3 and tf_keras): every variable, keyed by the layer structure.

What is captured: ``layer.variables``, i.e. trainable and non-trainable
weights (BatchNorm moving statistics included) *and* the state of every
``SeedGenerator`` the layers own (Dropout, GaussianNoise, random augmentation
layers), so that dropout masks continue identically after a restart. Metric
variables are not (Keras resets them every epoch).

tf_keras (Keras 2) layers are walked the same way and get the same keys
(see :mod:`uckpt_tf.keras2` for where their variables are).

Keys: Keras's own ``variable.path`` holds auto-generated names
(``sequential_1/dense_3/kernel``) that differ between two instances of the
same model, so keys follow the structure instead, as Keras's ``.weights.h5``
files do: each sub-layer is named after its class in snake case, numbered
within its parent in tracking order (``conv2d``, ``conv2d_1``, ...); each
variable by its name within its layer (``kernel``, ``moving_mean``,
``seed_generator_state``); nested layers nest. A variable or layer shared
by several parents is stored once, under the first path. Any variable of
``layer.variables`` the walk does not reach is kept under ``_other``.

save: ``extract`` returns the nested dict of arrays (``{"conv2d": {"kernel":
array, ...}, ...}``).
load: a checkpoint in Keras's own ``.weights.h5`` layout (``layers/dense/vars/0``,
a converted weights file) is matched by Keras's names instead, see
:mod:`uckpt_tf.keras_files`. ``prepare`` compares keys, shapes and dtypes and raises one
:class:`~uckpt.errors.KeyMismatchError` listing missing, unexpected and
mismatched variables before anything changes; it also records a compiled
model's optimizer (see :mod:`uckpt_tf.optim`). ``restore`` assigns every
variable.
"""
from __future__ import annotations

import re
import sys
import weakref
from typing import Any, Dict, List, Tuple


from . import keras2
from .convert import unique
from .keras_files import build_optimizer, file_variables, is_file_layout
from .variables import NamedVariablesAdapter

_AUTO_VARIABLE = re.compile(r"^variable(_\d+)?$")  # Keras's name for an unnamed variable
_HINT = ("build the same architecture that was saved, and build it (call it on a batch "
         "or model.build(input_shape)) before loading")

#: optimizer -> weak reference to the model compiled with it (filled by prepare and extract)
compiled_models: "weakref.WeakKeyDictionary[Any, weakref.ref]" = weakref.WeakKeyDictionary()


def _snake(name: str) -> str:
    name = re.sub(r"(.)([A-Z][a-z]+)", r"\1_\2", name)
    return re.sub(r"([a-z])([A-Z])", r"\1_\2", name).lower()


def _variable_name(var: Any) -> str:
    name = str(getattr(var, "name", "variable")).split("/")[-1].split(":")[0]
    return "variable" if _AUTO_VARIABLE.match(name) else name


def layer_variables(layer: Any) -> Dict[str, Any]:
    """Flat ``{"conv2d/kernel": variable}`` for every variable of ``layer`` (see module doc)."""
    seen_vars: set = set()
    seen_layers: set = set()
    out: List[Tuple[List[str], Any]] = []

    legacy = keras2.is_layer(layer)

    def walk(obj: Any, parts: List[str]) -> None:
        seen_layers.add(id(obj))
        used: Dict[str, int] = {}
        if legacy:
            own, subs = keras2.own_variables(obj), keras2.sublayers(obj)
        else:
            own = list(getattr(obj, "_trainable_variables", [])) + \
                list(getattr(obj, "_non_trainable_variables", []))
            own += [sg.state for sg in getattr(obj, "_seed_generators", [])]
            subs = getattr(obj, "_layers", [])
        for var in own:
            key = id(keras2.target(var))
            if key not in seen_vars:
                seen_vars.add(key)
                out.append((parts + [unique(_variable_name(var), used)], var))
        for sub in subs:
            name = unique(_snake(type(sub).__name__), used)
            if id(sub) not in seen_layers:
                walk(sub, parts + [name])

    walk(layer, [])
    used: Dict[str, int] = {}
    for var in layer.variables:  # anything the walk missed (unusual tracking) is still kept
        if id(var) not in seen_vars:
            seen_vars.add(id(var))
            out.append((["_other", unique(_variable_name(var), used)], var))
    return {"/".join(parts): var for parts, var in out}


def remember_optimizer(model: Any) -> None:
    """Note which model a compiled optimizer belongs to, for building it on restore."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and hasattr(optimizer, "build"):
        known = compiled_models.get(optimizer)
        if known is None or known() is not model:
            compiled_models[optimizer] = weakref.ref(model)


class LayerAdapter(NamedVariablesAdapter):
    name = "keras.layer"
    hint = _HINT

    def handles(self, obj):
        keras = sys.modules.get("keras")
        return (keras is not None and isinstance(obj, keras.layers.Layer)) or keras2.is_layer(obj)

    def variables(self, obj):
        return layer_variables(obj)

    def variables_for(self, obj, tree):
        if is_file_layout(tree):  # a Keras .weights.h5 converted to uckpt
            build_optimizer(obj, tree)
            return file_variables(obj)
        return self.variables(obj)

    def describe(self, obj):
        return f"the {type(obj).__name__} {getattr(obj, 'name', '')!r}".rstrip()

    def extract(self, obj):
        remember_optimizer(obj)
        return super().extract(obj)

    def prepare(self, obj, spec, keys=None):
        remember_optimizer(obj)
        return super().prepare(obj, spec, keys)
