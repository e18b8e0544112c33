"""A uckpt replacement for ``chainer.training.extensions.snapshot``, and ``resume``.

::

    import uckpt.chainer                      # before chainer under NumPy 2 (see compat)
    import chainer
    ...
    with uckpt.CheckpointManager("checkpoints", keep_last=3) as manager:
        trainer.extend(uckpt.chainer.snapshot(manager, trigger=(1, "epoch")))
        uckpt.chainer.resume(manager, trainer)   # newest intact checkpoint, if any
        trainer.run()

Each time the trigger fires (and whenever ``manager.should_save(iteration)``
says so, e.g. after SIGTERM with ``save_policy=uckpt.OnSignal()``) the
extension saves ``{"trainer": trainer, "rng": uckpt.RandomState(), **extra}``
as checkpoint ``trainer.updater.iteration``. Its priority is -100, like
Chainer's snapshot: it runs after every other extension of the iteration, so
LogReport's entry and every trigger's position for that iteration are in the
checkpoint. ``resume`` restores the same mapping into a freshly built trainer
before ``trainer.run()``; NumPy's global generator comes back with it, so
dropout masks and the next epoch's shuffle continue as if never interrupted.
"""
from __future__ import annotations

import logging
from typing import Any, Dict, Mapping, Optional, Sequence

from chainer.training import extension as _extension
from chainer.training import trigger as _trigger

from uckpt.errors import KeyMismatchError
from uckpt.rng import RandomState

log = logging.getLogger("uckpt.chainer")
_RNG = "rng"


def checkpoint_state(trainer, extra: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """The mapping the extension saves and ``resume`` restores."""
    state: Dict[str, Any] = {"trainer": trainer, _RNG: RandomState()}
    for key, value in (extra or {}).items():
        if key in state:
            raise ValueError(f"extra must not use the key {key!r}: the snapshot saves it itself")
        state[key] = value
    return state


def resume(manager, trainer, *, step: Optional[int] = None,
           extra: Optional[Mapping[str, Any]] = None) -> Optional[int]:
    """Restore the newest intact checkpoint (or ``step``) into ``trainer``; call before
    ``trainer.run()``. Returns the iteration restored, or None when there is none.

    A checkpoint converted from Chainer's own ``extensions.snapshot()`` file (``uckpt
    convert snapshot_iter_N root/step_0000000N``) holds the trainer alone: Chainer's
    snapshots do not save the random state, so the trainer is restored without it, as
    Chainer's own resume would, and a note is logged."""
    state = checkpoint_state(trainer, extra)
    try:
        return manager.restore(state, step=step)
    except KeyMismatchError as e:  # raised before anything changed
        if e.missing != [_RNG] or e.unexpected:
            raise
    log.info("the checkpoint holds no random state (a converted Chainer snapshot): restoring "
             "the trainer without it")
    return manager.restore({k: v for k, v in state.items() if k != _RNG}, step=step)


class Snapshot(_extension.Extension):
    """Saves the trainer to a :class:`uckpt.CheckpointManager`; see :func:`snapshot`."""

    trigger = (1, "iteration")  # checks its own trigger and the manager's policy every iteration
    priority = -100
    name = "uckpt_snapshot"

    def __init__(self, manager, trigger=(1, "epoch"), *, extra: Optional[Mapping[str, Any]] = None,
                 metrics: Sequence[str] = (), autoload: bool = False) -> None:
        self.manager = manager
        self._trigger = _trigger.get_trigger(trigger)
        self.extra = dict(extra or {})
        self.metrics = tuple(metrics)
        self.autoload = autoload
        checkpoint_state(None, self.extra)  # refuse reserved keys now, not at the first save

    def initialize(self, trainer) -> None:
        if self.autoload:
            self.resume(trainer)

    def __call__(self, trainer) -> None:
        step = trainer.updater.iteration
        fire = self._trigger(trainer)  # called every iteration: it tracks its own position
        if fire or self.manager.should_save(step):
            self.manager.save(step, checkpoint_state(trainer, self.extra),
                              metrics=self._metrics(trainer) or None)

    def _metrics(self, trainer) -> Dict[str, float]:
        out = {}
        for key in self.metrics:
            value = trainer.observation.get(key)
            if value is not None:
                out[key] = float(getattr(value, "array", value))
        return out

    def resume(self, trainer, *, step: Optional[int] = None) -> Optional[int]:
        return resume(self.manager, trainer, step=step, extra=self.extra)

    def serialize(self, serializer) -> None:
        if hasattr(self._trigger, "serialize"):
            self._trigger.serialize(serializer["_trigger"])


def snapshot(manager, trigger=(1, "epoch"), *, extra: Optional[Mapping[str, Any]] = None,
             metrics: Sequence[str] = (), autoload: bool = False) -> Snapshot:
    """A trainer extension that saves a uckpt checkpoint when ``trigger`` fires.

    manager
        a :class:`uckpt.CheckpointManager` (retention, async saves, tiers and its
        save policy apply); the checkpoint's step is ``trainer.updater.iteration``.
    trigger
        when to save, as for any Chainer extension: ``(1, "epoch")``,
        ``(500, "iteration")`` or a trigger object. The extension also saves
        whenever ``manager.should_save(iteration)`` is true.
    extra
        further objects saved and restored with the trainer (e.g. an order
        sampler's own ``numpy.random.RandomState``).
    metrics
        observation keys (e.g. ``"validation/main/loss"``) stored with each
        checkpoint, for ``uckpt.KeepBest``.
    autoload
        restore the newest checkpoint when the trainer starts (in
        ``initialize``, after the other extensions' initializers). Calling
        :func:`resume` before ``trainer.run()`` is the better choice.
    """
    return Snapshot(manager, trigger, extra=extra, metrics=metrics, autoload=autoload)
