"""``torch.amp.GradScaler`` (``torch.cuda.amp.GradScaler`` derives from it).

save: ``extract`` returns ``scaler.state_dict()``: the scale, growth and
backoff factors, growth interval and growth tracker; empty for a disabled scaler.
load: ``prepare`` refuses an empty (disabled) state for an enabled scaler;
``restore`` calls ``scaler.load_state_dict`` (a disabled scaler ignores it).
"""
from __future__ import annotations

import torch

from uckpt.adapter import Adapter
from uckpt.errors import StateMismatchError

from .convert import tree_from_numpy
from .device import tree_to_numpy

_CLASSES = tuple(c for c in (getattr(torch.amp, "GradScaler", None),
                             torch.cuda.amp.GradScaler) if c is not None)


class GradScalerAdapter(Adapter):
    name = "torch.grad_scaler"

    def handles(self, obj):
        return isinstance(obj, _CLASSES)

    def extract(self, obj):
        return tree_to_numpy(obj.state_dict())

    def prepare(self, obj, spec):
        self._check(obj, spec)
        return None

    def restore(self, obj, tree):
        self._check(obj, tree)
        obj.load_state_dict(tree_from_numpy(tree))

    @staticmethod
    def _check(obj, tree):
        if obj.is_enabled() and not tree:
            raise StateMismatchError(
                "the checkpoint holds no GradScaler state (it was saved from a disabled "
                "scaler) but the GradScaler to restore is enabled",
                hint="load into a GradScaler(enabled=False), or save from an enabled one")
