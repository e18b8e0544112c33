"""``torch.optim.Optimizer`` (any of them): ``state_dict()`` with tensors as arrays.

save: ``extract`` returns ``{"class": "torch.optim.adam.Adam", "state": {index:
{name: array or value}}, "param_groups": [{hyperparameters..., "params":
[indices]}]}``; arrays view the live state tensors, tuples such as ``betas``
stay tuples and dtypes are kept (Adam's ``step`` is a 0-d float32 array).
load: ``prepare`` refuses another optimizer class, another number of parameter
groups or of parameters in a group, and state for parameters the groups do not
list. When the optimizer already has state tensors of the checkpoint's shapes
and dtypes (a restore into a running optimizer), ``prepare`` hands them to the
core to read into in place; otherwise the core reads into fresh arrays.
A floating-point parameter's state entry (but ``step``) of another dtype than the
parameter is refused unless the load's ``cast=`` converts it: ``load_state_dict`` would
cast it to the parameter's dtype, a silent narrowing for float32 state of a bfloat16 model.
``restore`` converts the arrays to tensors (sharing their memory: the
optimizer keeps them) and calls ``optimizer.load_state_dict``, which moves them
to the parameters' devices.
DTensor state (an optimizer over DTensor / FSDP2 parameters) is saved as
:class:`uckpt.Shard` leaves. On load, an entry whose live state is a DTensor of
the checkpoint's shape is read into that DTensor's local box in place; with no
live state yet, an entry of its parameter's shape is read in the parameter's
layout (mesh, placements) and becomes a new DTensor; any other entry (``step``)
is a plain tensor, as saved.
"""
from __future__ import annotations

import weakref

import numpy as np
import torch

from typing import Optional

from uckpt.adapter import Adapter, ArraySpec, Problem, raise_problems
from uckpt.errors import DtypeMismatchError, StateMismatchError

from .checks import class_name
from .convert import _NAMES, tree_from_numpy, writable_view
from .device import tree_to_numpy
from .dtensor import fill, is_dtensor, like, read_target
from .layout import check_kind


def _layout_of(t, param, want: ArraySpec):
    """The DTensor whose layout state entry ``want`` is loaded in, or None: the live entry
    ``t`` when it is a DTensor of that shape; when there is no live entry yet, the
    parameter, if it is a DTensor of that shape (moments are laid out as their parameter)."""
    if t is None:
        t = param
    if is_dtensor(t) and tuple(t.shape) == tuple(want.shape):
        return t
    return None


def _cast_by_torch(index, name: str, want: ArraySpec, param) -> Optional[Problem]:
    """A state entry ``load_state_dict`` would cast to its parameter's dtype (every one of
    a floating-point parameter but ``step``) of a dtype the load's ``cast=`` does not
    convert to that one: refused, not narrowed silently."""
    if param is None or name == "step" or not param.is_floating_point():
        return None
    have = _NAMES.get(param.dtype)
    if have is None or want.fits(have):
        return None
    return DtypeMismatchError, (f"state/{index}/{name}: dtype {want.dtype} in the checkpoint, "
                                f"{have} in its parameter (to which load_state_dict casts it)")


class OptimizerAdapter(Adapter):
    name = "torch.optimizer"

    def __init__(self) -> None:
        #: optimizer -> {(index, name): DTensor whose layout a state entry is read in},
        #: from ``prepare`` to ``restore``
        self._sharded: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        #: optimizer -> {(index, name): (live state tensor, the view of its memory handed to
        #: the core)}: a loaded array that *is* that view was read in place, and the live
        #: tensor itself goes back to ``load_state_dict`` (no new tensor around it)
        self._views: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

    def handles(self, obj):
        return isinstance(obj, torch.optim.Optimizer)

    def extract(self, obj):
        return {"class": class_name(obj), **tree_to_numpy(obj.state_dict())}

    def prepare(self, obj, spec):
        self._check(obj, spec, note=True)
        params = [p for g in obj.param_groups for p in g["params"]]
        targets, sharded, own = {}, {}, {}
        problems = []
        for index, entries in spec["state"].items():
            param = params[index] if index < len(params) else None
            live = obj.state.get(param, {}) if param is not None else {}
            views = {}
            for name, want in entries.items():
                if not isinstance(want, ArraySpec):
                    continue
                problems.append(_cast_by_torch(index, name, want, param))
                t = live.get(name)
                ref = _layout_of(t, param, want)
                if ref is not None:
                    views[name] = read_target(ref, want, f"state/{index}/{name}",
                                              in_place=ref is t)
                    sharded[(index, name)] = ref
                elif isinstance(t, torch.Tensor) and not is_dtensor(t) and \
                        tuple(t.shape) == tuple(want.shape) and t.dtype in _NAMES and \
                        want.fits(_NAMES[t.dtype]):
                    view = views[name] = writable_view(t)
                    if view is not None:
                        own[(index, name)] = (t, view)
            targets[index] = views
        raise_problems(f"the {class_name(obj)}", problems)
        self._sharded[obj] = sharded
        self._views[obj] = own
        return {"state": targets}

    def restore(self, obj, tree):
        self._check(obj, tree, note=False)
        sharded = self._sharded.pop(obj, {})
        views = self._views.pop(obj, {})
        sd = {k: v for k, v in tree.items() if k != "class"}
        state = {index: dict(entries) for index, entries in sd["state"].items()}
        params = [p for g in obj.param_groups for p in g["params"]]
        for index, entries in state.items():
            live = obj.state.get(params[index], {}) if index < len(params) else {}
            for name, value in entries.items():
                tv = views.get((index, name))
                if tv is not None and tv[1] is value and live.get(name) is tv[0]:
                    entries[name] = tv[0]  # read in place: the live tensor holds the values
        for (index, name), ref in sharded.items():
            value = state.get(index, {}).get(name)
            if not isinstance(value, np.ndarray):
                continue
            if ref is obj.state.get(params[index], {}).get(name):
                fill(ref, value)  # the live state: read in place, or copied now
                state[index][name] = ref
            else:
                state[index][name] = like(ref, value)
        obj.load_state_dict(tree_from_numpy({**sd, "state": state}))

    @staticmethod
    def _check(obj, tree, note: bool):
        check_kind(obj, tree, "optimizer", note)
        saved = [len(g["params"]) for g in tree["param_groups"]]
        mine = [len(g["params"]) for g in obj.param_groups]
        if saved != mine:
            raise StateMismatchError(
                f"the checkpoint's {class_name(obj)} has {len(saved)} parameter group(s) of "
                f"{saved} parameters, the optimizer {len(mine)} of {mine}",
                hint="create the optimizer over the same parameters, in the same groups and order")
        indices = {i for g in tree["param_groups"] for i in g["params"]}
        stray = [k for k in tree["state"] if k not in indices]
        if stray:
            raise StateMismatchError(
                f"the checkpoint's optimizer holds state for parameters {stray[:10]!r} "
                "that none of its parameter groups lists")
