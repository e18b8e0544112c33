"""Keras integration: ``uckpt.keras.Checkpoint``, a callback for ``model.fit``.

Importing this module imports no Keras (nor does ``import uckpt``); asking for
``Checkpoint`` imports the Keras the process uses. The callback lives in the
TensorFlow adapter package; see :mod:`uckpt_tf.callback` and
docs/frameworks/tensorflow.md::

    cb = uckpt.keras.Checkpoint(manager, every_n_epochs=1)
    model.fit(x, y, epochs=10, initial_epoch=cb.restore(model), callbacks=[cb])

Keras 3 and tf_keras (Keras 2): ``Checkpoint`` is the Keras 3 callback
(:class:`uckpt_tf.callback.Checkpoint`, importing Keras 3), or the
``tf_keras.callbacks.Callback`` one (:class:`uckpt_tf.callback_keras2.Checkpoint`,
importing only tf_keras) when ``TF_USE_LEGACY_KERAS=1`` makes ``tf.keras``
tf_keras (as Horovod's ``horovod.tensorflow.keras`` needs): a tf_keras process
does not import Keras 3 for it. ``Keras2Checkpoint`` is the tf_keras one by name.
"""
from uckpt_tf import OptimizerState, epoch_shuffled, make_deterministic
from uckpt_tf.keras2 import legacy_keras_selected


def __getattr__(name: str):
    """``Checkpoint`` and ``Keras2Checkpoint``, each imported when asked for (the choice
    of ``Checkpoint`` made anew each time, as ``TF_USE_LEGACY_KERAS`` is then)."""
    if name == "Keras2Checkpoint" or (name == "Checkpoint" and legacy_keras_selected()):
        from uckpt_tf.callback_keras2 import Checkpoint as Keras2Checkpoint
        return Keras2Checkpoint
    if name == "Checkpoint":
        from uckpt_tf.callback import Checkpoint
        return Checkpoint
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Checkpoint and Keras2Checkpoint come from __getattr__ above (imported only when asked for).
__all__ = ["Checkpoint", "Keras2Checkpoint", "OptimizerState",  # noqa: F822
           "epoch_shuffled", "make_deterministic"]
