"""The data position: ``tf.data`` iterators, and a data order that needs no saving.

``IteratorAdapter`` (the iterator of ``iter(dataset)`` in eager mode):
``extract`` asks TensorFlow to serialize the iterator's state (as
``tf.train.Checkpoint`` does: ``SerializeIterator``) and stores it as a
``bytes`` leaf, ``{"element_spec": str, "state": bytes}``; no TensorFlow
checkpoint file is involved, but the bytes are TensorFlow's own encoding (a
``TensorProto`` holding the iterator's variant), meaningful only to
TensorFlow. They hold everything the pipeline buffers: a ``shuffle`` buffer,
prefetched elements. ``prepare`` refuses an iterator of another element
structure; ``restore`` parses the bytes and restores the iterator in place.
Needs a pipeline TensorFlow can serialize: one whose functions hold no
stateful random ops (use ``shuffle(seed=...)``, stateless ops, or set
``options.experimental_external_state_policy``), and TensorFlow refuses to
restore into a pipeline defined differently.

``epoch_shuffled``: an endless dataset of shuffled batches whose order is a
pure function of ``(seed, epoch, position)``, so the position is two integers
the training loop already knows. Use it with ``model.fit(...,
steps_per_epoch=n // batch_size, initial_epoch=k)`` (Keras then keeps one
iterator across epochs, whose epochs line up with the dataset's), or resume a
custom loop mid-epoch with ``initial_batch``.
"""
from __future__ import annotations

import sys
from typing import Any

from uckpt.adapter import Adapter
from uckpt.errors import StateMismatchError, UnsupportedObjectError

from .convert import class_name


class IteratorAdapter(Adapter):
    name = "tf.data.iterator"

    def handles(self, obj):
        tf = sys.modules.get("tensorflow")
        return tf is not None and isinstance(obj, tf.data.Iterator) and \
            hasattr(obj, "_serialize_to_tensors")

    def extract(self, obj):
        import tensorflow as tf

        try:
            variant = obj._serialize_to_tensors()["_STATE"]
        except tf.errors.OpError as e:
            raise UnsupportedObjectError(
                f"TensorFlow cannot save the position of this {class_name(obj)}: {e.message}",
                hint="make the pipeline serializable: no stateful random ops in its functions "
                     "(use Dataset.shuffle(seed=...) or stateless ops), or use "
                     "uckpt_tf.epoch_shuffled and save the epoch and position instead") from None
        return {"element_spec": repr(obj.element_spec),
                "state": tf.io.serialize_tensor(variant).numpy()}

    def prepare(self, obj, spec):
        self._check(obj, spec)
        return None

    def restore(self, obj, tree):
        import tensorflow as tf

        self._check(obj, tree)
        try:
            variant = tf.io.parse_tensor(tree["state"], out_type=tf.variant)
            obj._restore_from_tensors({"_STATE": variant})
        except tf.errors.OpError as e:
            raise StateMismatchError(f"TensorFlow could not restore the tf.data iterator: "
                                     f"{e.message}",
                                     hint="build the same input pipeline that was saved") from None

    @staticmethod
    def _check(obj, tree):
        saved = tree.get("element_spec") if isinstance(tree, dict) else None
        if saved != repr(obj.element_spec):
            raise StateMismatchError(
                f"the checkpoint holds the position of an iterator over {saved}, the iterator "
                f"to restore yields {obj.element_spec!r}",
                hint="build the same input pipeline that was saved")


def epoch_shuffled(data: Any, *, batch_size: int, seed: int, initial_epoch: int = 0,
                   initial_batch: int = 0):
    """Endless shuffled batches of ``data``; epoch e's order depends only on ``(seed, e)``.

    ``data`` is an array or a tuple/dict of arrays with the same first dimension
    ``n``. Each epoch is ``n // batch_size`` full batches (the remainder is
    dropped) of a permutation drawn by ``tf.random.experimental.stateless_shuffle``
    with seed ``(seed, epoch)``. The dataset starts at batch ``initial_batch``
    of epoch ``initial_epoch``; resuming is building it again with the
    position from the checkpoint.
    """
    import tensorflow as tf

    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    tensors = tf.nest.map_structure(tf.convert_to_tensor, data)
    n = int(tf.nest.flatten(tensors)[0].shape[0])
    per_epoch = n // batch_size
    if per_epoch == 0:
        raise ValueError(f"batch_size {batch_size} exceeds the {n} items")
    if not 0 <= initial_batch < per_epoch:
        raise ValueError(f"initial_batch must be in [0, {per_epoch}), got {initial_batch}")

    def epoch(e):
        order = tf.random.experimental.stateless_shuffle(
            tf.range(n, dtype=tf.int64), seed=tf.stack([tf.constant(seed, tf.int64), e]))
        batches = tf.reshape(order[:per_epoch * batch_size], [per_epoch, batch_size])
        return tf.data.Dataset.from_tensor_slices(batches)

    ds = tf.data.Dataset.range(initial_epoch, 2 ** 62).flat_map(epoch).skip(initial_batch)
    return ds.map(lambda idx: tf.nest.map_structure(lambda t: tf.gather(t, idx), tensors))
