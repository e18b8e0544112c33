"""``uckpt.torch.LateSnapshot``: every-step asynchronous checkpoints that copy the
parameters and optimizer state as late as possible (snapshot-then-offload).

::

    late = uckpt.torch.LateSnapshot(optimizer)
    manager = uckpt.CheckpointManager(root, async_save=True, late_snapshot=late)
    for step in ...:
        loss = model(x).loss; loss.backward()   # the copies of step-1's save run meanwhile
        optimizer.step()                        # pre-hook: any copy still left is done first
        manager.save(step, {"model": model, "optimizer": optimizer})   # stalls only for
                                                # buffers, counters and the plan
    manager.close(); late.close()

A parameter, and the optimizer's state of it, change only inside
``optimizer.step()``. So ``save`` copies now only what else the state holds (BatchNorm
statistics and other buffers, which the next forward pass changes; counters; RNG
states), and the parameters and optimizer state are copied into the same staging
memory by the save's low-priority background writer while the next forward and
backward pass run. A step pre-hook (``Optimizer.register_step_pre_hook``) runs before the optimizer
changes anything and finishes whatever is left on the training thread, so each
tensor is copied once, before it changes; the checkpoint holds exactly the state at
``save``. The write to storage begins when the copies are done and overlaps the
following steps. Extra memory: the manager's staging arenas (``max_inflight``
states), as for any async save.

What it assumes (the caller's side of the bargain): between ``save`` and the next
``optimizer.step()`` nothing but that step changes a parameter or the optimizer's
state in place (not ``p.data.mul_()``, not ``optimizer.load_state_dict``, not a
second optimizer over the same parameters that is not guarded too). Gradients,
buffers and anything else may change freely. Call :meth:`flush` first where the
loop does change them outside the step. Only CPU tensors are deferred (CUDA tensors
are copied by the device's own asynchronous copy at ``save``).
"""
from __future__ import annotations

import threading
from typing import List, Tuple

import torch

from uckpt.saving.late import DeferredCopy, LateGuard


def _extent(t: torch.Tensor):
    if t.device.type != "cpu" or not t.is_contiguous() or t.numel() == 0:
        return None
    start = t.data_ptr()
    return start, start + t.numel() * t.element_size()


class LateSnapshot(LateGuard):
    """A late-copy guard over ``optimizers`` (their parameters and state); see the module
    docstring. ``close()`` (or ``with``) removes the hooks, after finishing pending copies."""

    def __init__(self, *optimizers: torch.optim.Optimizer) -> None:
        if not optimizers or not all(isinstance(o, torch.optim.Optimizer) for o in optimizers):
            raise TypeError("LateSnapshot(optimizer, ...): give the torch.optim.Optimizer(s) "
                            f"whose step changes the state, got {optimizers!r}")
        self.optimizers = optimizers
        self._pending: List[DeferredCopy] = []
        self._lock = threading.Lock()
        self._hooks = [o.register_step_pre_hook(self._before_step) for o in optimizers]
        #: bytes copied by the training thread in the hook (not done in the background)
        self.copied_in_hook = 0

    def covered_ranges(self) -> List[Tuple[int, int]]:
        out = []
        for opt in self.optimizers:
            for group in opt.param_groups:
                out += [e for e in map(_extent, group["params"]) if e]
            for state in opt.state.values():
                out += [e for v in state.values() if isinstance(v, torch.Tensor)
                        for e in [_extent(v)] if e]
        return out

    def arm(self, deferred: DeferredCopy) -> None:
        with self._lock:
            self._pending.append(deferred)

    def _before_step(self, optimizer, args, kwargs) -> None:
        self.flush()

    def flush(self) -> None:
        """Finish every pending copy now (before changing guarded tensors outside a step)."""
        with self._lock:
            pending, self._pending = self._pending, []
        for d in pending:
            d.finish(by_guard=True)
            self.copied_in_hook += d.copied_by_guard

    def close(self) -> None:
        self.flush()
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def __enter__(self) -> "LateSnapshot":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
