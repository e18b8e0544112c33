"""``chainer.Variable`` and ``chainer.Parameter`` as a single array leaf.

save: ``extract`` returns the array (a view of a NumPy array; a device array
is copied to the host), or ``None`` for an uninitialized parameter.
load: ``prepare`` refuses another shape or dtype and returns the variable's own
NumPy array as the read target; ``restore`` initializes an uninitialized
parameter with the saved shape and copies the array in, unless the core
already read it there.
"""
from __future__ import annotations

import chainer
import numpy as np

from uckpt.adapter import Adapter

from .checks import Findings, leaf_problem
from .serializer import copy_into, to_host


class VariableAdapter(Adapter):
    name = "chainer.variable"

    def handles(self, obj):
        return isinstance(obj, chainer.Variable)

    def extract(self, obj):
        return to_host(obj.array)

    def prepare(self, obj, spec):
        findings = Findings(f"the {type(obj).__name__} {obj.name or ''}".rstrip())
        findings.add(leaf_problem("array", obj.array, spec, strict=True))
        findings.raise_if_any()
        return obj.array if isinstance(obj.array, np.ndarray) else None

    def restore(self, obj, tree):
        if tree is None:
            return
        if obj.array is None:
            if isinstance(obj, chainer.Parameter):
                rng = np.random.get_state()  # the initializer's draws must not shift it
                obj.initialize(tree.shape)
                np.random.set_state(rng)
            else:
                obj.array = tree
                return
        copy_into(obj.array, tree, "array")
