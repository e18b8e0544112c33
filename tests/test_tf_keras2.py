"""tf_keras (Keras 2) models, layers and optimizers, and the callback on tf_keras, in one process.

The Horovod runs on several ranks are in tests/test_horovod_tf.py. Here tf_keras is used
by its own name (``TF_USE_LEGACY_KERAS`` stays unset: other tests in this process use
Keras 3 through ``tf.keras``), except where the callback's choice of class is tested.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tf_common import keras, tf  # noqa: F401  (skips the module without TensorFlow / Keras 3)

tf_keras = pytest.importorskip("tf_keras")

import uckpt  # noqa: E402
import uckpt.keras  # noqa: E402
from uckpt.errors import KeyMismatchError, StateMismatchError, UnsupportedObjectError  # noqa: E402


def model_k2(seed=0, optimizer=None):
    tf_keras.utils.set_random_seed(seed)
    model = tf_keras.Sequential([tf_keras.layers.Dense(6, activation="tanh", input_shape=(4,)),
                                 tf_keras.layers.BatchNormalization(),
                                 tf_keras.layers.Dense(2)])
    model.compile(optimizer=optimizer or tf_keras.optimizers.Adam(0.01), loss="mse")
    return model


def data(n=16, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 4)).astype("float32")
    return x, np.stack([x.sum(1), x[:, 0]], 1).astype("float32")


def everything(model):
    return [v.numpy() for v in list(model.variables) + list(model.optimizer.variables)]


def assert_bitwise(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


def test_model_and_optimizer_round_trip(tmp_path):
    model = model_k2()
    model.fit(*data(), batch_size=4, epochs=1, shuffle=False, verbose=0)
    uckpt.save(tmp_path / "c", {"model": model, "optimizer": model.optimizer})
    tree = uckpt.load(tmp_path / "c")
    # the layout of Keras 3's adapters, with tf_keras's slot names
    assert sorted(tree["model"]) == ["batch_normalization", "dense", "dense_1"]
    assert sorted(tree["model"]["batch_normalization"]) == ["beta", "gamma", "moving_mean",
                                                            "moving_variance"]
    opt = tree["optimizer"]
    assert opt["class"] == "tf_keras.src.optimizers.adam.Adam" and opt["built"] is True
    assert int(opt["variables"]["iteration"]) == 4
    assert float(opt["variables"]["learning_rate"]) == np.float32(0.01)
    assert sorted(opt["slots"]) == [str(i) for i in range(6)]
    assert sorted(opt["slots"]["0"]) == ["m", "v"]
    np.testing.assert_array_equal(opt["slots"]["0"]["m"], model.optimizer.variables[1].numpy())

    fresh = model_k2(seed=1)  # other weights, optimizer not built yet: built on restore
    uckpt.load(tmp_path / "c", {"model": fresh, "optimizer": fresh.optimizer})
    assert_bitwise(everything(fresh), everything(model))
    # and training goes on identically
    for m in (model, fresh):
        m.fit(*data(seed=1), batch_size=4, epochs=1, shuffle=False, verbose=0)
    assert_bitwise(everything(fresh), everything(model))


def test_optimizer_state_in_a_custom_loop(tmp_path):
    model = model_k2()
    opt = tf_keras.optimizers.SGD(0.05, momentum=0.9)
    x, y = data()
    for _ in range(2):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                model.trainable_variables))
    uckpt.save(tmp_path / "c", {"model": model, "opt": uckpt.keras.OptimizerState(opt, model)})
    fresh, fresh_opt = model_k2(seed=3), tf_keras.optimizers.SGD(0.05, momentum=0.9)
    uckpt.load(tmp_path / "c", {"model": fresh,
                                   "opt": uckpt.keras.OptimizerState(fresh_opt, fresh)})
    assert int(fresh_opt.iterations) == 2
    assert_bitwise([v.numpy() for v in fresh_opt.variables], [v.numpy() for v in opt.variables])
    assert sorted(uckpt.load(tmp_path / "c")["opt"]["slots"]["0"]) == ["m"]


def test_another_optimizer_class_is_refused(tmp_path):
    model = model_k2()
    model.fit(*data(), batch_size=8, epochs=1, verbose=0)
    uckpt.save(tmp_path / "c", {"model": model, "optimizer": model.optimizer})
    other = model_k2(optimizer=tf_keras.optimizers.SGD(0.01))
    with pytest.raises(StateMismatchError, match="adam.Adam"):
        uckpt.load(tmp_path / "c", {"model": other, "optimizer": other.optimizer})


def test_another_architecture_is_refused(tmp_path):
    model = model_k2()
    uckpt.save(tmp_path / "c", {"model": model})
    tf_keras.utils.set_random_seed(0)
    other = tf_keras.Sequential([tf_keras.layers.Dense(6, input_shape=(4,)),
                                 tf_keras.layers.Dense(2)])
    with pytest.raises(KeyMismatchError, match="batch_normalization"):
        uckpt.load(tmp_path / "c", {"model": other})


def test_legacy_optimizer_is_refused_with_a_hint(tmp_path):
    model = model_k2(optimizer=tf_keras.optimizers.legacy.Adam(0.01))
    model.fit(*data(), batch_size=8, epochs=1, verbose=0)
    with pytest.raises(UnsupportedObjectError, match="(?s)legacy optimizer.*not .legacy"):
        uckpt.save(tmp_path / "c", {"optimizer": model.optimizer})
    assert not (tmp_path / "c").exists()


def test_checkpoint_is_a_tf_keras_callback_under_legacy_keras(monkeypatch, tmp_path):
    with uckpt.CheckpointManager(tmp_path / "a") as manager:
        monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
        cb3 = uckpt.keras.Checkpoint(manager)
        assert isinstance(cb3, keras.callbacks.Callback)
        assert not isinstance(cb3, tf_keras.callbacks.Callback)
        monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
        cb2 = uckpt.keras.Checkpoint(manager, every_n_steps=2)
        assert isinstance(cb2, tf_keras.callbacks.Callback) and cb2.every_n_steps == 2
        assert type(cb2) is uckpt.keras.Keras2Checkpoint


def test_tf_keras_process_does_not_import_keras_3_for_the_callback(tmp_path):
    """Under ``TF_USE_LEGACY_KERAS=1`` ``uckpt.keras.Checkpoint`` is the tf_keras callback
    without Keras 3 being imported (seconds of every Horovod rank's start); a fresh
    interpreter, as this process has imported Keras 3 already."""
    code = f"""
import os, sys
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import tf_keras, uckpt, uckpt.keras
with uckpt.CheckpointManager({str(tmp_path / 'a')!r}) as manager:
    cb = uckpt.keras.Checkpoint(manager)
print(type(cb).__module__, isinstance(cb, tf_keras.callbacks.Callback), "keras" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["uckpt_tf.callback_keras2", "True", "False"]


def test_callback_resumes_tf_keras_fit_bitwise(tmp_path):
    x, y = data(24)
    Callback = uckpt.keras.Keras2Checkpoint

    def fit(model, cb, epochs, initial_epoch=0):
        model.fit(x, y, batch_size=4, epochs=epochs, initial_epoch=initial_epoch,
                  shuffle=False, callbacks=[cb], verbose=0)

    full = model_k2()
    with uckpt.CheckpointManager(tmp_path / "full") as manager:
        fit(full, Callback(manager), 3)
        assert manager.steps() == [6, 12, 18]
    part = model_k2()
    with uckpt.CheckpointManager(tmp_path / "part") as manager:
        fit(part, Callback(manager), 2)
    resumed = model_k2(seed=9)
    with uckpt.CheckpointManager(tmp_path / "part") as manager:
        cb = Callback(manager)
        assert cb.restore(resumed) == 2 and cb.step == 12
        fit(resumed, cb, 3, initial_epoch=2)
        assert manager.steps() == [6, 12, 18]
    assert_bitwise(everything(resumed), everything(full))


def test_resume_at_epoch_end_keeps_newer_mid_epoch_checkpoints(tmp_path):
    x, y = data(24)  # 6 batches per epoch
    Callback = uckpt.keras.Keras2Checkpoint

    class Crash(Exception):
        pass

    class CrashAfter(tf_keras.callbacks.Callback):
        def __init__(self, cb, step):
            super().__init__()
            self.cb, self.crash_at = cb, step

        def on_train_batch_end(self, batch, logs=None):
            if self.cb.step == self.crash_at:
                raise Crash  # the run ends mid-epoch 1, after step 9

    def fit(model, cbs, initial_epoch=0):
        model.fit(x, y, batch_size=4, epochs=2, initial_epoch=initial_epoch, shuffle=False,
                  callbacks=cbs, verbose=0)

    full = model_k2()
    with uckpt.CheckpointManager(tmp_path / "full") as manager:
        fit(full, [Callback(manager, every_n_steps=4, every_n_epochs=1)])
    part = model_k2()
    with uckpt.CheckpointManager(tmp_path / "part") as manager:
        cb = Callback(manager, every_n_steps=4, every_n_epochs=1)
        with pytest.raises(Crash):
            fit(part, [cb, CrashAfter(cb, 9)])
        assert manager.steps() == [4, 6, 8]
        before = (Path(manager.path(8)) / "manifest.json").read_bytes()
    resumed = model_k2(seed=9)
    with uckpt.CheckpointManager(tmp_path / "part") as manager:
        cb = Callback(manager, every_n_steps=4, every_n_epochs=1)
        assert cb.restore(resumed, at_epoch_end=True) == 1 and cb.step == 6
        with pytest.warns(UserWarning, match="step 8 exists from before the restart"):
            fit(resumed, [cb], initial_epoch=1)
        assert manager.steps() == [4, 6, 8, 12]
        # not rewritten: the same bytes (a rewrite would record another 'created' time)
        assert (Path(manager.path(8)) / "manifest.json").read_bytes() == before
    assert_bitwise(everything(resumed), everything(full))
