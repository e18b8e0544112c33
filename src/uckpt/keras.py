"""Keras integration: ``uckpt.keras.Checkpoint``, a callback for ``model.fit``.

Importing this module imports Keras (``import uckpt`` does not). The callback
lives in the TensorFlow adapter package; see
:mod:`uckpt_tf.callback` and docs/frameworks/tensorflow.md::

    cb = uckpt.keras.Checkpoint(manager, every_n_epochs=1)
    model.fit(x, y, epochs=10, initial_epoch=cb.restore(model), callbacks=[cb])
"""
from uckpt_tf import OptimizerState, epoch_shuffled, make_deterministic
from uckpt_tf.callback import Checkpoint

__all__ = ["Checkpoint", "OptimizerState", "epoch_shuffled", "make_deterministic"]
