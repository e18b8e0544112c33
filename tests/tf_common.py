"""Shared pieces of the TensorFlow/Keras tests: tiny models, training steps, comparisons."""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
from keras import layers  # noqa: E402


def small_cnn(filters=4, classes=3, extra_dense=False):
    """conv-BN-relu, dropout, dense: trainable, non-trainable and seed-generator state."""
    stack = [keras.Input((6, 6, 1)), layers.Conv2D(filters, 3), layers.BatchNormalization(),
             layers.ReLU(), layers.Flatten(), layers.Dropout(0.5)]
    if extra_dense:
        stack.append(layers.Dense(5))
    stack.append(layers.Dense(classes))
    return keras.Sequential(stack)


def data(n=16, seed=0, classes=3):
    g = np.random.default_rng(seed)
    return (g.standard_normal((n, 6, 6, 1)).astype("float32"),
            g.integers(0, classes, n).astype("int32"))


LOSS = None


def loss_fn():
    global LOSS
    if LOSS is None:
        LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return LOSS


def train_step(model, optimizer, x, y):
    """One eager step (dropout active); returns the float32 loss as a NumPy scalar."""
    with tf.GradientTape() as tape:
        loss = loss_fn()(y, model(x, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss.numpy()


def values(variables):
    return [v.numpy() for v in variables]


def assert_bitwise(a, b):
    """Two lists of arrays (or scalars) with the same dtypes, shapes and bytes."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape
        assert x.tobytes() == y.tobytes()


def float_bits(values):
    return [int(np.float32(v).view(np.uint32)) for v in values]


def compiled_cnn(seed=0, lr=0.01):
    """``small_cnn()`` from Keras seed ``seed``, compiled for ``fit`` (Adam, no XLA)."""
    keras.utils.set_random_seed(seed)
    model = small_cnn()
    model.compile(optimizer=keras.optimizers.Adam(lr),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=False)
    return model


def numpy_rng_digest():
    """A short digest of NumPy's global generator state (to compare it across processes)."""
    import hashlib

    _, keys, pos, *_ = np.random.get_state()
    return hashlib.sha256(keys.tobytes() + str(pos).encode()).hexdigest()[:16]
