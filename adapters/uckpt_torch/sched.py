"""Learning-rate schedulers (``LRScheduler`` subclasses and ``ReduceLROnPlateau``).

save: ``extract`` returns ``{"class": ..., **scheduler.state_dict()}`` with any
tensor as an array.
load: ``prepare`` refuses another scheduler class; ``restore`` converts arrays
back to tensors and calls ``scheduler.load_state_dict``. Create the scheduler
before loading its optimizer: creating one resets the optimizer's learning
rates, loading one does not.
"""
from __future__ import annotations

from torch.optim import lr_scheduler

from uckpt.adapter import Adapter

from .checks import class_name
from .convert import tree_from_numpy
from .device import tree_to_numpy
from .layout import check_kind

_CLASSES = (lr_scheduler.LRScheduler, lr_scheduler.ReduceLROnPlateau)


class SchedulerAdapter(Adapter):
    name = "torch.lr_scheduler"

    def handles(self, obj):
        return isinstance(obj, _CLASSES)

    def extract(self, obj):
        return {"class": class_name(obj), **tree_to_numpy(obj.state_dict())}

    def prepare(self, obj, spec):
        check_kind(obj, spec, "learning-rate scheduler")
        return None

    def restore(self, obj, tree):
        check_kind(obj, tree, "learning-rate scheduler", note=False)
        obj.load_state_dict(tree_from_numpy({k: v for k, v in tree.items() if k != "class"}))
