"""Keras integration: ``uckpt.keras.Checkpoint``, a callback for ``model.fit``.

Importing this module imports Keras (``import uckpt`` does not). The callback
lives in the TensorFlow adapter package; see
:mod:`uckpt_tf.callback` and docs/frameworks/tensorflow.md::

    cb = uckpt.keras.Checkpoint(manager, every_n_epochs=1)
    model.fit(x, y, epochs=10, initial_epoch=cb.restore(model), callbacks=[cb])

Keras 3 and tf_keras (Keras 2): ``Checkpoint(...)`` is a Keras 3 callback, or a
``tf_keras.callbacks.Callback`` when ``TF_USE_LEGACY_KERAS=1`` makes ``tf.keras``
tf_keras (as Horovod's ``horovod.tensorflow.keras`` needs). ``Keras2Checkpoint``
is the tf_keras one by name (importing it imports tf_keras).
"""
from uckpt_tf import OptimizerState, epoch_shuffled, make_deterministic
from uckpt_tf.callback import Checkpoint


def __getattr__(name: str):
    if name == "Keras2Checkpoint":
        from uckpt_tf.callback_keras2 import Checkpoint as Keras2Checkpoint
        return Keras2Checkpoint
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Keras2Checkpoint comes from __getattr__ above (imported only when asked for).
__all__ = ["Checkpoint", "Keras2Checkpoint", "OptimizerState",  # noqa: F822
           "epoch_shuffled", "make_deterministic"]
