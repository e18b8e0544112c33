"""Random state: ``torch.Generator`` objects and torch's global generators.

``GeneratorAdapter`` (an adapter): ``extract`` returns ``{"device": "cpu",
"state": uint8 array}`` from ``get_state()``; ``prepare`` refuses a state from
another device type or of another length; ``restore`` calls ``set_state()``.

``TorchRNG`` (the ``torch`` :class:`~uckpt.adapter.RNGProvider`, used by
``uckpt.RandomState``): ``get`` returns ``{"cpu": uint8 array}`` plus ``"cuda":
[one uint8 array per device]`` when CUDA is initialized; ``set`` restores them,
warning when CUDA states cannot all be restored.
"""
from __future__ import annotations

import warnings

import torch

from uckpt.adapter import Adapter, RNGProvider
from uckpt.errors import StateMismatchError

from .checks import array_problem, raise_problems
from .convert import from_numpy, to_numpy


class GeneratorAdapter(Adapter):
    name = "torch.generator"

    def handles(self, obj):
        return isinstance(obj, torch.Generator)

    def extract(self, obj):
        return {"device": obj.device.type, "state": to_numpy(obj.get_state())}

    def prepare(self, obj, spec):
        self._check(obj, spec)
        return None

    def restore(self, obj, tree):
        self._check(obj, tree)
        obj.set_state(from_numpy(tree["state"]))

    @staticmethod
    def _check(obj, tree):
        if tree.get("device") != obj.device.type:
            raise StateMismatchError(
                f"the checkpoint holds the state of a {tree.get('device')} generator, "
                f"the generator to restore is on {obj.device.type}")
        problem = array_problem("state", obj.get_state(), tree.get("state"))
        raise_problems(f"the {obj.device.type} generator", [problem] if problem else [])


class TorchRNG(RNGProvider):
    name = "torch"

    def get(self):
        out = {"cpu": to_numpy(torch.get_rng_state())}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            out["cuda"] = [to_numpy(s) for s in torch.cuda.get_rng_state_all()]
        return out

    def set(self, tree):
        torch.set_rng_state(from_numpy(tree["cpu"]))
        saved = tree.get("cuda") or []
        if not saved:
            return
        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if have < len(saved):
            warnings.warn(
                f"the checkpoint holds the random state of {len(saved)} CUDA device(s) but "
                f"{have} are available; only the first {have} were restored",
                RuntimeWarning, stacklevel=2)
        for index, state in enumerate(saved[:have]):
            torch.cuda.set_rng_state(from_numpy(state), index)
