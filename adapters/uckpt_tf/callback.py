"""``uckpt.keras.Checkpoint``: a Keras callback that saves and resumes ``model.fit``.

Call order, in one training process::

    manager = uckpt.CheckpointManager("ckpts", keep_last=3)
    cb = uckpt.keras.Checkpoint(manager, every_n_epochs=1)
    initial_epoch = cb.restore(model)      # compiled model; 0 when there is no checkpoint
    model.fit(..., initial_epoch=initial_epoch, callbacks=[cb])
    manager.close()

Each checkpoint holds ``{"model": model, "optimizer": model.optimizer, "rng":
uckpt.RandomState(), "epoch": epochs completed, "batch": batches done in the
current epoch, "step": batches trained in all}`` plus the entries of
``state``, is numbered by ``step`` and carries ``{"keras": {"epoch", "batch",
"step"}}`` in its metadata; the epoch's logs (numbers only) go in as ``metrics`` (for
``uckpt.KeepBest``).

``restore`` restores everything in place (building the optimizer if fit has
not yet; see :mod:`uckpt_tf.optim`) and returns the ``initial_epoch`` for
``fit``. Keras cannot start ``fit`` in the middle of an epoch: from a
checkpoint saved mid-epoch (``every_n_steps``) the epoch starts over from its
first batch with the restored weights, so its first batches are trained twice
(a warning says so). ``restore(at_epoch_end=True)`` takes the newest
checkpoint saved at the end of an epoch instead: the resumed run is then
bitwise the uninterrupted one, provided the data order of an epoch depends
only on the epoch (``uckpt_tf.epoch_shuffled``) and the process is
deterministic (``uckpt_tf.make_deterministic``). Checkpoints newer than the one
restored (mid-epoch ones skipped by ``at_epoch_end``), or all of them when none
was restored (none at an epoch's end), are kept: the resumed run saves no step
up to the newest of them again (a warning says so), and saves the later ones.

Saves happen at the end of every ``every_n_epochs``-th epoch, after every
``every_n_steps``-th batch, and whenever the manager's save policy asks
(``manager.should_save(step)``, e.g. ``uckpt.OnSignal()`` for preemption).
A save after an epoch's last batch is that epoch's end (``epoch`` counts it,
``batch`` is 0); when ``fit`` does not know the epoch's length, it is saved again
as such at the epoch's end.

Several ranks (a manager whose ``comm`` has more than one rank, e.g. Horovod's
``hvd.DistributedOptimizer`` training, one process per rank): every rank uses
the callback with the same ``every_n_*`` arguments and runs the same number of
batches per epoch, and every rank saves (each writes its part). The model and
optimizer are replicated state: they must be equal on every rank, which
gradient averaging gives. The callback keeps its own calls collective:

* ``rng`` is each process's own global random state: it is saved as
  ``uckpt.PerRank(uckpt.RandomState())`` and every rank gets its own back;
* ``manager.should_save`` is asked after every batch on every rank (for
  ``EveryNSeconds`` or ``OnSignal`` the manager makes the ranks agree there, so
  a signal that reaches one rank makes every rank save that step);
* an epoch's metrics in the metadata are rank 0's (use Horovod's
  ``MetricAverageCallback`` before this callback for averaged ones);
* ``restore`` agrees on the steps to try (those every rank sees), so every
  rank restores the same checkpoint.

Keras 2 (``tf_keras``, what ``tf.keras`` is under ``TF_USE_LEGACY_KERAS=1`` and
what Horovod's ``horovod.tensorflow.keras`` needs): its ``fit`` takes only
callbacks derived from ``tf_keras.callbacks.Callback``. ``Checkpoint(...)``
returns such a callback, :class:`uckpt_tf.callback_keras2.Checkpoint` (the same
logic, :class:`CheckpointLogic`), when ``TF_USE_LEGACY_KERAS`` is set as
TensorFlow reads it (``1``, ``true``, ``True``); create that class directly to
use tf_keras without the variable.
"""
from __future__ import annotations

from typing import Any

import keras

from . import keras2
from .callback_logic import CheckpointLogic


class Checkpoint(CheckpointLogic, keras.callbacks.Callback):
    __doc__ = CheckpointLogic.__doc__ + """
    A Keras 3 callback; under ``TF_USE_LEGACY_KERAS=1`` ``Checkpoint(...)`` returns
    the tf_keras one instead (see the module docstring).
    """

    def __new__(cls, *args: Any, **kwargs: Any):
        if cls is Checkpoint and keras2.legacy_keras_selected():
            from .callback_keras2 import Checkpoint as Keras2Checkpoint

            return Keras2Checkpoint(*args, **kwargs)  # not a Checkpoint: __init__ runs once
        return super().__new__(cls)
