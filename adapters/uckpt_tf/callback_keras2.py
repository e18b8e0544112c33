"""``uckpt.keras.Checkpoint`` for tf_keras (Keras 2): the same callback on tf_keras's base class.

tf_keras's ``model.fit`` (``tf.keras`` under ``TF_USE_LEGACY_KERAS=1``, and so
Horovod's ``horovod.tensorflow.keras``) calls hooks only Keras 2 callbacks have;
this class is :class:`uckpt_tf.callback_logic.CheckpointLogic` on
``tf_keras.callbacks.Callback``. ``uckpt.keras.Checkpoint(...)`` returns it when
``TF_USE_LEGACY_KERAS`` is set; importing this module imports tf_keras.
"""
from __future__ import annotations

import tf_keras

from .callback_logic import CheckpointLogic


class Checkpoint(CheckpointLogic, tf_keras.callbacks.Callback):
    __doc__ = CheckpointLogic.__doc__ + """
    A tf_keras (Keras 2) callback.
    """
