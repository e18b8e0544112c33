"""Saving a Keras model reads its variables without copying them (uckpt_tf.convert.to_numpy):
a read of a variable that TensorFlow keeps is a snapshot, because TensorFlow copies a
variable's buffer before updating it while a read of it is alive. These tests train on
after extracting and check that what was extracted never changes, compiled with XLA and
without, and that a checkpoint saved asynchronously from such reads is the state at save."""
from __future__ import annotations

import numpy as np
import pytest

from tf_common import compiled_cnn, data, keras, tf

import uckpt  # noqa: E402
from uckpt.registry import find_adapter  # noqa: E402
from uckpt.tree.flatten import flatten  # noqa: E402


def leaves(tree):
    return {k: np.array(v) for k, v in flatten(tree).arrays.items()}


@pytest.mark.parametrize("jit", [True, False])
def test_extracted_state_is_a_snapshot_that_training_does_not_change(jit):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16),
                              keras.layers.BatchNormalization(), keras.layers.Dense(1)])
    model.compile(keras.optimizers.Adam(0.1), "mse", jit_compile=jit)
    x, y = np.random.rand(64, 8).astype("f4"), np.random.rand(64, 1).astype("f4")
    model.fit(x, y, epochs=1, verbose=0, batch_size=16)
    extracted = {name: find_adapter(obj).extract(obj)
                 for name, obj in (("model", model), ("optimizer", model.optimizer))}
    arrays = flatten(extracted).arrays
    copies = {k: np.array(v, copy=True) for k, v in arrays.items()}
    # views, never written through (a scalar reads back as a NumPy scalar: copied)
    assert all(not a.flags.writeable for a in arrays.values() if a.ndim)
    before = [v.numpy().copy() for v in model.weights]
    model.fit(x, y, epochs=2, verbose=0, batch_size=16)
    assert sum(not np.array_equal(b, v.numpy()) for b, v in zip(before, model.weights)) > 0
    changed = [k for k, a in arrays.items() if not np.array_equal(a, copies[k])]
    assert changed == []


def test_async_save_then_training_saves_the_state_at_save(tmp_path):
    model = compiled_cnn()
    xs, ys = data(32)
    model.fit(xs[:8], ys[:8], batch_size=4, epochs=1, verbose=0)
    expected = [v.numpy().copy() for v in model.weights]
    with uckpt.CheckpointManager(tmp_path, async_save=True) as mgr:
        mgr.save(1, {"model": model, "optimizer": model.optimizer})
        model.fit(xs[8:], ys[8:], batch_size=4, epochs=1, verbose=0)  # while it writes
    assert any(not np.array_equal(e, v.numpy()) for e, v in zip(expected, model.weights))
    fresh = compiled_cnn(seed=1)
    fresh.fit(xs[:4], ys[:4], batch_size=4, epochs=1, verbose=0)  # built, optimizer too
    uckpt.CheckpointManager(tmp_path).restore({"model": fresh, "optimizer": fresh.optimizer})
    assert len(fresh.weights) == len(expected)
    for e, v in zip(expected, fresh.weights):
        np.testing.assert_array_equal(v.numpy(), e, err_msg=v.path)


def test_tf_variables_and_bfloat16_read_without_copy():
    from uckpt_tf.convert import to_numpy

    v = tf.Variable(tf.ones((3, 4), tf.bfloat16))
    k = keras.Variable(np.arange(6, dtype=np.float32).reshape(2, 3))
    a, b = to_numpy(v), to_numpy(k)
    assert str(a.dtype) == "bfloat16" and not a.flags.writeable
    v.assign_add(tf.ones((3, 4), tf.bfloat16))
    k.assign(np.zeros((2, 3), np.float32))
    assert (a.astype(np.float32) == 1).all() and (b == np.arange(6).reshape(2, 3)).all()
