"""Keras optimizers (Keras 3 and tf_keras): every variable, the iteration counter included,
built on restore.

save: ``extract`` returns ``{"class": "keras.src.optimizers.adam.Adam", "built":
bool, "variables": {"iteration": int64 array, "learning_rate": array, ...},
"slots": {"0": {"momentum": array, "velocity": array}, "1": {...}, ...}}``.
``variables`` holds the optimizer's own variables by name (a repeated name
gets ``_1``, ``_2``); a wrapper's inner optimizer (``LossScaleOptimizer``)
nests under ``inner_optimizer`` with the same layout; ``slots`` holds the
per-variable state, keyed by the position of the trained variable in the list
the optimizer was built with (``model.trainable_variables`` for ``model.fit``
and for ``apply_gradients(zip(grads, model.trainable_variables))``) and by
slot name.
Keras's own variable names embed the model's auto-generated names
(``sequential_1_dense_kernel_momentum``), which change between instances; the
position does not.

load: a Keras optimizer creates its slot variables lazily, on its first
step, and Keras's own ``load_weights`` then skips the optimizer with a
warning. This adapter builds it instead, against the variables it will train:

* ``uckpt_tf.OptimizerState(optimizer, model)`` (or a list of variables) says
  which, explicitly;
* a bare optimizer that a model was compiled with (``model.optimizer``) is
  built against ``model.trainable_variables`` when that model is handed to
  uckpt too, in the same state mapping, e.g.
  ``{"model": model, "optimizer": model.optimizer}``: the layer adapter
  records ``model.optimizer`` when it sees the model.

``prepare`` refuses another optimizer class (``StateMismatchError``); builds
the optimizer when the checkpoint's was built and this one is not (exactly
what Keras does on the first step, so building is harmless even if a later
check fails); then compares keys, shapes and dtypes and raises one
``KeyMismatchError`` listing every difference before anything is assigned.
When the model comes after the optimizer in the mapping, building and the
checks wait for ``restore`` (by then every ``prepare`` has run). ``restore``
assigns every variable. A bare, unbuilt optimizer whose model is unknown is
refused with a hint rather than left without its state.

tf_keras (Keras 2) optimizers (``tf_keras.optimizers.Optimizer``) are saved in the
same layout (see :mod:`uckpt_tf.keras2`); their slots are named ``m``, ``v``, ...
as tf_keras names them. A ``hvd.DistributedOptimizer`` (Horovod's Keras
integration) is a class Horovod makes at run time, deriving from the wrapped
optimizer's class: it is recorded as, and checked against, that class, so a
checkpoint of a Horovod job loads into the plain optimizer and back.
"""
from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any, Dict, List, Optional, Sequence

from uckpt.adapter import Adapter
from uckpt.errors import StateMismatchError, UnsupportedObjectError

from . import keras2
from .convert import assign, check_class, check_variables, class_name, flat, nested, to_numpy, \
    unique
from .layers import compiled_models

INNER = "inner_optimizer"


class OptimizerState:
    """A Keras optimizer and what it trains: a model or layer, or a list of variables.

    Put it in the state mapping in place of the optimizer when the optimizer
    was not compiled into a model that is in the same mapping (a custom
    training loop): ``{"model": model, "optimizer":
    uckpt_tf.OptimizerState(optimizer, model)}``. On restore an unbuilt
    optimizer is built with ``optimizer.build(model.trainable_variables)`` (or
    the list given), the list the first ``apply_gradients`` would build it with.
    """

    def __init__(self, optimizer: Any, trains: Any) -> None:
        if not _is_keras_optimizer(optimizer):
            raise UnsupportedObjectError(
                f"OptimizerState takes a Keras optimizer, got {class_name(optimizer)}")
        self.optimizer = optimizer
        self.trains = trains
        _register_wrapper_adapter()

    def variables(self) -> List[Any]:
        if hasattr(self.trains, "trainable_variables"):
            return list(self.trains.trainable_variables)
        return list(self.trains)

    def __repr__(self) -> str:
        return f"OptimizerState({class_name(self.optimizer)}, {type(self.trains).__name__})"


def _prefix(var: Any) -> str:
    """The prefix Keras puts before a slot name in ``add_variable_from_reference``."""
    if hasattr(var, "path"):
        return var.path.replace("/", "_") + "_"
    return str(var.name).replace("/", "_").replace(":", "_") + "_"


def _is_keras_optimizer(obj: Any) -> bool:
    keras = sys.modules.get("keras")
    return (keras is not None and isinstance(obj, keras.optimizers.Optimizer)) or \
        keras2.is_optimizer(obj)


def optimizer_class(opt: Any) -> str:
    """``module.QualName`` of the optimizer's class, Horovod's run-time subclass skipped."""
    cls = type(opt)
    while cls.__module__.split(".")[0] == "horovod" and cls.__bases__ != (object,):
        cls = cls.__bases__[0]
    return f"{cls.__module__}.{cls.__qualname__}"


def _check_class(opt: Any, tree: Any) -> None:
    if not (isinstance(tree, Mapping) and tree.get("class") == optimizer_class(opt)):
        check_class(opt, tree, "optimizer")  # also accepts the run-time class's own name


def _is_built(opt: Any) -> bool:
    return keras2.is_built(opt) if keras2.is_optimizer(opt) else bool(opt.built)


def optimizer_variables(opt: Any) -> Dict[str, Any]:
    """Flat ``{"variables/iteration": v, "slots/0/momentum": v, ...}`` (see module doc)."""
    if keras2.is_optimizer(opt):
        return keras2.optimizer_variables(opt, unique)
    inner = getattr(opt, "inner_optimizer", None)  # LossScaleOptimizer
    out = {}
    if inner is not None:
        out = {f"{INNER}/{k}": v for k, v in optimizer_variables(inner).items()}
    taken = {id(v) for v in out.values()}
    prefixes = {_prefix(r): str(i) for i, r in enumerate(getattr(opt, "_trainable_variables", []))}
    used_own: Dict[str, int] = {}
    used_slots: Dict[str, Dict[str, int]] = {}
    for var in opt.variables:
        if id(var) in taken:
            continue
        name = str(var.name).split("/")[-1]
        index = None
        for cut in range(len(name) - 1, 0, -1):  # the longest matching prefix wins
            if name[cut - 1] == "_" and name[:cut] in prefixes:
                index = prefixes[name[:cut]]
                break
        if index is None:
            out["variables/" + unique(name, used_own)] = var
        else:
            slot = unique(name[cut:], used_slots.setdefault(index, {}))
            out[f"slots/{index}/{slot}"] = var
    return out


def _saved(tree: Any) -> Dict[str, Any]:
    """The variables part of an extracted tree (everything but ``class`` and ``built``)."""
    return {k: v for k, v in tree.items() if k not in ("class", "built")}


class OptimizerAdapter(Adapter):
    name = "keras.optimizer"

    def handles(self, obj):
        return isinstance(obj, OptimizerState) or _is_keras_optimizer(obj) or \
            keras2.is_legacy_optimizer(obj)

    def extract(self, obj):
        opt = _optimizer(obj)
        tree = nested((k.split("/"), to_numpy(v)) for k, v in optimizer_variables(opt).items())
        return {"class": optimizer_class(opt), "built": _is_built(opt), "variables": {},
                "slots": {}, **tree}

    def prepare(self, obj, spec):
        opt = _optimizer(obj)
        _check_class(opt, spec)
        if spec.get("built") and not _is_built(opt):
            trains = _trained_variables(obj)
            if trains is None:
                return None  # the model may come later in the mapping: build in restore
            _build(opt, trains)
        self._check(opt, spec)
        return None

    def restore(self, obj, tree):
        opt = _optimizer(obj)
        _check_class(opt, tree)
        if tree.get("built") and not _is_built(opt):
            trains = _trained_variables(obj)
            if trains is None:
                raise StateMismatchError(
                    f"the checkpoint holds the state of a built {class_name(opt)}, but this "
                    "optimizer has not been built yet (Keras creates its variables on the "
                    "first step) and uckpt does not know which variables it trains",
                    hint="put uckpt_tf.OptimizerState(optimizer, model) in the state in place "
                         "of the optimizer, or put the model it was compiled with in the same "
                         "state mapping, or call optimizer.build(model.trainable_variables) "
                         "before restoring")
            _build(opt, trains)
        live = self._check(opt, tree)
        saved = flat(_saved(tree))
        for key, var in live.items():
            assign(var, saved[key])

    @staticmethod
    def _check(opt, tree):
        live = optimizer_variables(opt)
        saved = _saved(tree)
        hint = None
        if not tree.get("built") and _is_built(opt):
            hint = ("the checkpoint was saved before the optimizer's first step; restore it "
                    "into a new, unbuilt optimizer")
        check_variables(f"the {type(opt).__name__} optimizer", live, saved,
                        hint or "create the optimizer over the same variables, in the same "
                                "order, with the same options (e.g. amsgrad, use_ema)")
        return live


class _WrapperAdapter(OptimizerAdapter):
    """The same adapter, for OptimizerState only: registered at run time (see below)."""

    def handles(self, obj):
        return isinstance(obj, OptimizerState)


_registered = False


def _register_wrapper_adapter() -> None:
    """The registry finds adapters by the framework an object's class comes from, and
    OptimizerState comes from uckpt_tf, which no entry point names: register it once."""
    global _registered
    if not _registered:
        from uckpt.registry import register_adapter

        register_adapter(_WrapperAdapter())
        _registered = True


def _optimizer(obj: Any) -> Any:
    opt = obj.optimizer if isinstance(obj, OptimizerState) else obj
    if keras2.is_legacy_optimizer(opt):
        raise UnsupportedObjectError(
            f"{class_name(opt)} is a tf_keras legacy optimizer (OptimizerV2), which uckpt "
            "does not save",
            hint="use the tf_keras.optimizers one of the same name (not .legacy); "
                 "hvd.DistributedOptimizer wraps either")
    return opt


def _trained_variables(obj: Any) -> Optional[Sequence[Any]]:
    if isinstance(obj, OptimizerState):
        return obj.variables()
    ref = compiled_models.get(obj)
    model = ref() if ref is not None else None
    return list(model.trainable_variables) if model is not None else None


def _build(opt: Any, variables: Sequence[Any]) -> None:
    """Build as ``apply_gradients`` does on the first step (same name scope)."""
    if keras2.is_optimizer(opt):
        keras2.build(opt, variables)
        return
    import keras

    with keras.name_scope(opt.name, caller=opt):
        opt.build(list(variables))
    opt.built = True
