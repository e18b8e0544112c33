"""tf_keras (Keras 2) beside Keras 3: which Keras an object is from, and Keras 2's internals.

TensorFlow users keep ``tf_keras`` (``TF_USE_LEGACY_KERAS=1`` makes ``tf.keras``
that package) where Keras 3 does not fit, e.g. Horovod's ``horovod.tensorflow.keras``.
Its layers, models and optimizers are saved in the same layout as Keras 3's (see
:mod:`uckpt_tf.layers` and :mod:`uckpt_tf.optim`); only the way to reach their
variables differs, and lives here:

* a Keras 2 layer keeps its own weights in ``_trainable_weights`` and
  ``_non_trainable_weights`` and its sub-layers behind ``_flatten_layers``; a
  seeded ``Dropout`` (or other random layer) also owns a ``tf.random.Generator``
  (``_random_generator._generator``), saved as ``random_generator_state``;
* a Keras 2 optimizer (``tf_keras.optimizers.Optimizer``, the default one since
  TF 2.11) names each slot variable ``{optimizer name}/{slot}/{trained variable's
  shared name}``, is built when ``_built`` is set, and keeps a plain learning rate
  in the variable ``_learning_rate``, outside ``optimizer.variables``. The
  ``tf_keras.optimizers.legacy`` ones are not supported.

Nothing here imports a Keras: ``tf_keras`` is looked up in ``sys.modules``.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Dict, Iterable, List, Optional

from uckpt.errors import UnsupportedObjectError


def _tf_keras() -> Any:
    return sys.modules.get("tf_keras")


def legacy_keras_selected() -> bool:
    """Whether ``tf.keras`` is tf_keras in this process (TensorFlow's own rule)."""
    return os.environ.get("TF_USE_LEGACY_KERAS", "") in ("true", "True", "1")


def is_layer(obj: Any) -> bool:
    tf_keras = _tf_keras()
    return tf_keras is not None and isinstance(obj, tf_keras.layers.Layer)


def is_optimizer(obj: Any) -> bool:
    tf_keras = _tf_keras()
    return tf_keras is not None and isinstance(obj, tf_keras.optimizers.Optimizer)


def is_legacy_optimizer(obj: Any) -> bool:
    tf_keras = _tf_keras()
    return tf_keras is not None and isinstance(obj, tf_keras.optimizers.legacy.Optimizer)


# -- layers ------------------------------------------------------------------------------------
def own_variables(layer: Any) -> List[Any]:
    """The variables a Keras 2 layer holds itself (not those of its sub-layers)."""
    own = list(getattr(layer, "_trainable_weights", [])) + \
        list(getattr(layer, "_non_trainable_weights", []))
    generator = getattr(getattr(layer, "_random_generator", None), "_generator", None)
    if generator is not None and hasattr(generator, "state"):
        own.append(_Named(generator.state, "random_generator_state"))
    return own


def sublayers(layer: Any) -> List[Any]:
    return list(layer._flatten_layers(include_self=False, recursive=False))


class _Named:
    """A variable under another name (a generator's ``state`` has a generic one)."""

    def __init__(self, var: Any, name: str) -> None:
        self.var, self.name = var, name

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.var, attr)


def target(var: Any) -> Any:
    """The variable itself, also when :func:`own_variables` wrapped it to rename it."""
    return var.var if isinstance(var, _Named) else var


# -- optimizers --------------------------------------------------------------------------------
def is_built(opt: Any) -> bool:
    return bool(getattr(opt, "_built", False))


def slot_owners(opt: Any) -> Dict[str, str]:
    """``{shared name of a trained variable: its position}`` from the optimizer's index.

    The index maps ``_var_key(variable)``, which is the variable's ``_unique_id``
    (``{shared name}_{uid}`` when eager), to its position in the list the
    optimizer was built with.
    """
    out: Dict[str, str] = {}
    clashes = set()
    for key, index in getattr(opt, "_index_dict", {}).items():
        shared = str(key).rsplit("_", 1)[0] if str(key).rsplit("_", 1)[-1].isdigit() else str(key)
        if shared in out:
            clashes.add(shared)
        out[shared] = str(index)
    if clashes:
        raise UnsupportedObjectError(
            f"the {type(opt).__name__} optimizer trains several variables named "
            f"{sorted(clashes)}; their slots cannot be told apart",
            hint="give the layers unique names (tf_keras names them uniquely unless "
                 "tf_keras.backend.clear_session() ran between two models)")
    return out


def optimizer_variables(opt: Any, unique) -> Dict[str, Any]:
    """Flat ``{"variables/iteration": v, "variables/learning_rate": v, "slots/0/m": v, ...}``."""
    owners = slot_owners(opt)
    out: Dict[str, Any] = {}
    used_own: Dict[str, int] = {}
    used_slots: Dict[str, Dict[str, int]] = {}
    for var in list(opt.variables) + _learning_rate(opt):
        name = str(var.name).split(":")[0]
        slot = _slot_of(name, owners)
        if slot is None:
            out["variables/" + unique(name.split("/")[-1], used_own)] = var
        else:
            index, slot_name = slot
            out[f"slots/{index}/{unique(slot_name, used_slots.setdefault(index, {}))}"] = var
    return out


def _slot_of(name: str, owners: Dict[str, str]) -> Optional[tuple]:
    """(position, slot name) for ``[scope/]slot/shared_name``; the longest owner wins."""
    parts = name.split("/")
    for cut in range(1, len(parts)):
        owner = "/".join(parts[cut:])
        if owner in owners:
            return owners[owner], parts[cut - 1]
    return None


def _learning_rate(opt: Any) -> List[Any]:
    import tensorflow as tf

    lr = getattr(opt, "_learning_rate", None)
    if isinstance(lr, tf.Variable) and all(lr is not v for v in opt.variables):
        return [lr]
    return []


def build(opt: Any, variables: Iterable[Any]) -> None:
    """Build as ``apply_gradients`` does on the first step (same name scope)."""
    import tensorflow as tf

    with tf.name_scope(opt.name or "optimizer"):
        with tf.init_scope():
            opt.build(list(variables))
