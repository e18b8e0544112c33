"""``chainer.Optimizer`` (``MomentumSGD``, ``Adam``, any ``GradientMethod``).

save: ``extract`` returns what ``optimizer.serialize`` writes (``t``,
``epoch`` and, under each parameter's path, its update rule's ``t`` and state:
MomentumSGD's ``v``, Adam's ``m``, ``v`` and ``vhat``), plus what Chainer's
snapshots leave out, under keys Chainer never uses:

``uckpt:class``         the optimizer's class
``uckpt:hyperparam``    the optimizer's hyperparameters (``lr``, ``momentum``,
                        Adam's ``alpha``, ...), changed by schedules during training;
                        not inside a trainer, whose shift extensions own them
``uckpt:hooks``         each optimizer hook by name: ``hook.serialize`` when it has
                        one, else its public plain attributes (``WeightDecay.rate``,
                        ``GradientClipping.threshold``, ...)
``uckpt:loss_scaling``  the loss scale and its dynamic-scaling state, when enabled

load: ``prepare`` refuses another optimizer class, an optimizer that is not
set up, parameters, hooks or hyperparameters that differ from the saved ones,
and state arrays of another shape or dtype; all before anything changes. An
update rule whose state is not yet initialized (a fresh optimizer) takes the
saved state when its keys are the ones ``init_state`` would create; an
initialized one is read into in place. ``restore`` runs ``optimizer.serialize``
with the loaded tree, then sets hyperparameters, hook attributes and the loss
scale. Per-parameter hyperparameter overrides and per-rule hooks are
configuration, not state: create them again before restoring.
"""
from __future__ import annotations

import copy
import logging
from typing import Any, Dict, List, Tuple

import chainer
import numpy as np

from uckpt.adapter import Adapter, ArraySpec
from uckpt.dtypes import name_of
from uckpt.errors import DtypeMismatchError, ShapeMismatchError, StateMismatchError

from .checks import _PLAIN, Findings, class_name, compare_strict, flatten, nest, require_dict
from .serializer import is_deserializer, join, probe, restore_with, serialize_tree, split

log = logging.getLogger("uckpt.chainer")

CLASS = "uckpt:class"
HYPER = "uckpt:hyperparam"
HOOKS = "uckpt:hooks"
LOSS = "uckpt:loss_scaling"
ADDITIONS = (CLASS, HYPER, HOOKS, LOSS)
HINT = "create the same optimizer (class, hooks, hyperparameter names) over the same link"
# dynamic loss scaling: (tree key, attribute)
_LOSS_ATTRS = (("scale", "_loss_scale"), ("dynamic", "_loss_scaling_is_dynamic"),
               ("multiplier", "_loss_scaling_multiplier"),
               ("isnan_ever", "_loss_scaling_isnan_ever"))


def hooks(opt) -> List[Tuple[str, Any]]:
    """The optimizer's hooks by name, pre-update hooks first, in registration order."""
    hookable = getattr(opt, "_hookable", None)
    out: List[Tuple[str, Any]] = []
    for attr in ("_pre_update_hooks", "_post_update_hooks"):
        out.extend((getattr(hookable, attr, None) or {}).items())
    return out


def plain_attributes(hook) -> List[Tuple[str, Any]]:
    """A hook's public attributes that hold plain values (its state, for built-in hooks)."""
    attrs = getattr(hook, "__dict__", None) or {}
    return sorted((k, v) for k, v in attrs.items()
                  if not k.startswith("_") and isinstance(v, _PLAIN))


def serialize_optimizer(opt, s) -> None:
    """``opt.serialize(s)`` and :func:`serialize_additions` (save and load alike)."""
    if getattr(opt, "target", None) is None:
        raise StateMismatchError(
            f"the {class_name(opt)} is not set up", hint="call optimizer.setup(link) first")
    opt.serialize(s)
    serialize_additions(opt, s)


def serialize_additions(opt, s, hyperparameters: bool = True) -> None:
    """Class, hyperparameters, hooks and loss scaling: what ``opt.serialize`` leaves out.

    An updater serializes its optimizers itself; :mod:`.training` calls this
    for each of them afterwards, with the optimizer's serializer and without
    the hyperparameters: in a trainer, the shift extensions (ExponentialShift,
    ...) own them, restore them from their own state in ``initialize`` and take
    the optimizer's value at that moment as the schedule's start, which a
    restored value would shift.
    """
    loading = is_deserializer(s)
    if not loading:
        s(CLASS, class_name(opt))
    elif not s.has(CLASS):
        return  # Chainer's own layout (a converted snapshot): it holds none of these

    hp, sub = opt.hyperparam, s[HYPER]
    for key, value in sorted(hp.get_dict().items()) if hyperparameters else ():
        if isinstance(value, _PLAIN):
            value = sub(key, value)
            if loading:
                setattr(hp, key, value)

    registry = s[HOOKS]
    for name, hook in hooks(opt):
        child = registry[name]
        if callable(getattr(hook, "serialize", None)):
            hook.serialize(child)
            continue
        for attr, value in plain_attributes(hook):
            value = child(attr, value)
            if loading:
                setattr(hook, attr, value)

    if getattr(opt, "_loss_scale", None) is not None:
        scaling = s[LOSS]
        for key, attr in _LOSS_ATTRS:
            if hasattr(opt, attr):
                value = scaling(key, getattr(opt, attr))
                if loading:
                    setattr(opt, attr, value)


def _rules(opt) -> Dict[str, Any]:
    """Parameter path -> parameter, for the parameters that have an update rule."""
    return {join(split(name)): param for name, param in opt.target.namedparams()
            if getattr(param, "update_rule", None) is not None}


def _expected_state(param) -> Dict[str, Tuple[Any, str]]:
    """What ``init_state`` would create for a parameter: key -> (shape, dtype), each
    None where the parameter is not initialized yet.

    Computed the way Chainer's own deserialization does it: on a copy of the
    rule, with a one-element stand-in; a state shaped like that stand-in is
    shaped like the parameter.
    """
    rule = copy.copy(param.update_rule)
    rule._state = {}
    known = param.array is not None  # an uninitialized parameter has no shape or dtype yet
    dummy = np.zeros(1, dtype=param.dtype if known else np.float32)
    rule.init_state(chainer.Variable(dummy, grad=dummy))
    out: Dict[str, Tuple[Any, Any]] = {}
    for key, value in rule.state.items():
        if tuple(value.shape) != (1,):  # not shaped like the parameter
            out[key] = (tuple(value.shape), name_of(value.dtype))
        elif known:
            out[key] = (tuple(param.shape), name_of(value.dtype))
        else:
            out[key] = (None, None)
    return out


def check_optimizer(opt, live, saved, findings: Findings, prefix: str = ""):
    """Compare an optimizer's probed tree with the checkpoint's; return in-place targets."""
    saved = require_dict(saved, f"the {class_name(opt)}")
    if CLASS not in saved and saved:  # Chainer's own layout: nothing of uckpt's additions
        log.info("restoring the %s%s from Chainer's own layout (a converted snapshot or "
                 "save_npz file): its class, hooks and hyperparameters are not in it",
                 class_name(opt), " at " + prefix if prefix else "")
        live = {k: v for k, v in live.items() if k not in ADDITIONS}
    elif saved.get(CLASS) != class_name(opt):
        held = f"the state of a {saved.get(CLASS)}" if saved.get(CLASS) else "no optimizer state"
        raise StateMismatchError(
            f"the checkpoint holds {held}{' at ' + prefix if prefix else ''} but the optimizer "
            f"to restore is a {class_name(opt)}", hint="create the optimizer class that was saved")
    rules = _rules(opt)
    lf, sf = flatten(live), flatten(saved)
    at = (lambda p: f"{prefix}/{p}") if prefix else (lambda p: p)
    common = [p for p in lf if p in sf]
    targets = compare_strict({p: lf[p] for p in common}, {p: sf[p] for p in common},
                             findings, prefix)
    findings.missing += [at(p) for p in lf if p not in sf]
    fresh: Dict[str, Dict[str, Any]] = {}  # rule path -> saved state of a rule without state yet
    for path in sf:
        if path in lf:
            continue
        head, _, key = path.rpartition("/")
        param = rules.get(head)
        if param is not None and param.update_rule.state is None and key != "t":
            fresh.setdefault(head, {})[key] = sf[path]
        else:
            findings.unexpected.append(at(path))
    for head, entries in fresh.items():
        expected = _expected_state(rules[head])
        findings.missing += [at(f"{head}/{k}") for k in expected if k not in entries]
        for key, leaf in entries.items():
            if key not in expected:
                findings.unexpected.append(at(f"{head}/{key}"))
                continue
            findings.add(_state_problem(at(f"{head}/{key}"), leaf, *expected[key]))
    return nest(targets)


def _state_problem(path: str, leaf: Any, shape, dtype: str):
    """Why a saved state entry does not fit a rule that will create it, or None."""
    if not isinstance(leaf, ArraySpec):
        return StateMismatchError, f"{path}: the checkpoint holds a {type(leaf).__name__}, " \
                                   "the update rule an array"
    if shape is not None and tuple(leaf.shape) != shape:
        return ShapeMismatchError, (f"{path}: shape {list(leaf.shape)} in the checkpoint, "
                                    f"{list(shape)} for the parameter")
    if dtype is not None and leaf.dtype != dtype:
        return DtypeMismatchError, f"{path}: dtype {leaf.dtype} in the checkpoint, {dtype} here"
    return None


class OptimizerAdapter(Adapter):
    name = "chainer.optimizer"

    def handles(self, obj):
        return isinstance(obj, chainer.Optimizer)

    def extract(self, obj):
        return serialize_tree(obj, serialize_optimizer)

    def prepare(self, obj, spec):
        findings = Findings(f"the {type(obj).__name__} optimizer")
        targets = check_optimizer(obj, probe(obj, serialize_optimizer), spec, findings)
        findings.raise_if_any(HINT)
        return targets

    def restore(self, obj, tree):
        restore_with(obj, tree, serialize_optimizer, f"the {type(obj).__name__} optimizer")
