"""``torch.Tensor`` (and ``nn.Parameter``) as a single array leaf.

save: ``extract`` returns a view of the tensor (a CUDA tensor is copied at snapshot time).
load: ``prepare`` refuses a different shape or dtype and returns the tensor's
own memory as the read target when it can; ``restore`` copies the loaded array
in, unless the core already read it there.
A DTensor is saved as a :class:`uckpt.Shard` and loads only this rank's box,
straight into its local tensor where possible (see :mod:`.dtensor`).
"""
from __future__ import annotations

import torch

from uckpt.adapter import Adapter

from .checks import array_problem, raise_problems
from .convert import from_numpy, same_memory, writable_view
from .device import to_leaf
from .dtensor import fill, is_dtensor, read_target


class TensorAdapter(Adapter):
    name = "torch.tensor"

    def handles(self, obj):
        return isinstance(obj, torch.Tensor)

    def extract(self, obj):
        return to_leaf(obj)

    def prepare(self, obj, spec):
        self._check(obj, spec)
        if is_dtensor(obj):
            return read_target(obj, spec, "")
        return writable_view(obj)

    def restore(self, obj, tree):
        self._check(obj, tree)
        if is_dtensor(obj):
            fill(obj, tree)
        elif not same_memory(tree, obj):
            with torch.no_grad():
                obj.copy_(from_numpy(tree, like=obj))

    @staticmethod
    def _check(obj, leaf):
        problem = array_problem("tensor", obj, leaf)
        raise_problems("the tensor", [problem] if problem else [])
