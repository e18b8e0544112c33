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
``restore`` converts the arrays to tensors (sharing their memory: the
optimizer keeps them) and calls ``optimizer.load_state_dict``, which moves them
to the parameters' devices.
"""
from __future__ import annotations

import torch

from uckpt.adapter import Adapter, ArraySpec
from uckpt.errors import StateMismatchError

from .checks import check_class, class_name
from .convert import _NAMES, tree_from_numpy, tree_to_numpy, writable_view


class OptimizerAdapter(Adapter):
    name = "torch.optimizer"

    def handles(self, obj):
        return isinstance(obj, torch.optim.Optimizer)

    def extract(self, obj):
        return {"class": class_name(obj), **tree_to_numpy(obj.state_dict())}

    def prepare(self, obj, spec):
        self._check(obj, spec)
        params = [p for g in obj.param_groups for p in g["params"]]
        targets = {}
        for index, entries in spec["state"].items():
            live = obj.state.get(params[index], {}) if index < len(params) else {}
            views = {}
            for name, want in entries.items():
                t = live.get(name)
                if isinstance(want, ArraySpec) and isinstance(t, torch.Tensor) and \
                        tuple(t.shape) == tuple(want.shape) and _NAMES.get(t.dtype) == want.dtype:
                    views[name] = writable_view(t)
            targets[index] = views
        return {"state": targets}

    def restore(self, obj, tree):
        self._check(obj, tree)
        sd = {k: v for k, v in tree.items() if k != "class"}
        obj.load_state_dict(tree_from_numpy(sd))

    @staticmethod
    def _check(obj, tree):
        check_class(obj, tree, "optimizer")
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
