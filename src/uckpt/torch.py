"""PyTorch helpers that are part of uckpt's public API; importing this module imports torch.

``uckpt.torch.ResumableSampler``: a shuffling ``torch.utils.data.Sampler`` whose
epoch and position in the epoch go into a checkpoint with the rest of the state,
so that a restored ``DataLoader`` continues at the same sample in the same order.
It lives in the ``uckpt_torch`` adapter package (which saves and restores it);
``import uckpt`` alone never imports torch.

``uckpt.torch.LateSnapshot(optimizer)``: a guard for ``CheckpointManager(...,
async_save=True, late_snapshot=...)`` that copies parameters and optimizer state
late, while the next step's forward and backward run (see :mod:`uckpt_torch.late`).
"""
from uckpt_torch.late import LateSnapshot
from uckpt_torch.sampler import ResumableSampler

__all__ = ["LateSnapshot", "ResumableSampler"]
