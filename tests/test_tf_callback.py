"""uckpt.keras.Checkpoint as a drop-in model.fit callback: what it saves, when, and resume."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from tf_common import assert_bitwise, data, keras, small_cnn, values

import uckpt  # noqa: E402
import uckpt.keras  # noqa: E402
import uckpt_tf  # noqa: E402

BATCH, N = 4, 24  # 6 batches per epoch


def compiled(seed=0):
    keras.utils.set_random_seed(seed)
    model = small_cnn()
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=False)
    return model


def fit(model, cb, epochs, initial_epoch=0, callbacks=()):
    x, y = data(N)
    ds = uckpt_tf.epoch_shuffled((x, y), batch_size=BATCH, seed=3, initial_epoch=initial_epoch)
    return model.fit(ds, epochs=epochs, steps_per_epoch=N // BATCH, initial_epoch=initial_epoch,
                     shuffle=False, callbacks=[cb, *callbacks], verbose=0)


def test_saves_every_epoch_and_resumes_into_a_fresh_model(tmp_path):
    model = compiled()
    with uckpt.CheckpointManager(tmp_path) as manager:
        cb = uckpt.keras.Checkpoint(manager)  # default: every epoch
        fit(model, cb, epochs=2)
        assert manager.steps() == [6, 12]
        meta = uckpt.manifest(manager.path(12)).metadata
        assert meta["keras"] == {"epoch": 2, "batch": 0, "step": 12}
        assert set(meta["metrics"]) == {"loss"}
        tree = uckpt.load(manager.path(12))
        assert set(tree) == {"model", "optimizer", "rng", "epoch", "batch", "step"}
        assert (tree["epoch"], tree["step"]) == (2, 12)
        assert int(tree["optimizer"]["variables"]["iteration"]) == 12

        fresh = compiled(seed=5)
        cb2 = uckpt.keras.Checkpoint(manager)
        assert cb2.restore(fresh) == 2
        assert (cb2.epoch, cb2.batch, cb2.step) == (2, 0, 12)
        assert fresh.optimizer.built and int(fresh.optimizer.iterations) == 12
        assert_bitwise(values(fresh.variables), values(model.variables))
        assert_bitwise(values(fresh.optimizer.variables), values(model.optimizer.variables))

        # Both continue with epoch 3: the same losses, and checkpoint 18 from the fresh one.
        rng = {"rng": uckpt.RandomState()}
        uckpt.save(tmp_path / "rng", rng)
        with uckpt.CheckpointManager(tmp_path / "other") as other:
            h1 = fit(model, uckpt.keras.Checkpoint(other), epochs=3, initial_epoch=2)
        uckpt.load(tmp_path / "rng", rng)
        h2 = fit(fresh, cb2, epochs=3, initial_epoch=2)
        assert h1.history["loss"] == h2.history["loss"]
        assert manager.steps() == [6, 12, 18]


def test_async_manager(tmp_path):
    model = compiled()
    with uckpt.CheckpointManager(tmp_path, async_save=True, keep_last=1) as manager:
        fit(model, uckpt.keras.Checkpoint(manager), epochs=2)
        assert manager.steps() == [12]  # on_train_end waited for the writes
    fresh = compiled(seed=1)
    with uckpt.CheckpointManager(tmp_path) as manager:
        assert uckpt.keras.Checkpoint(manager).restore(fresh) == 2
    assert_bitwise(values(fresh.variables), values(model.variables))


def test_restore_without_checkpoint_returns_zero(tmp_path):
    model = compiled()
    before = values(model.variables)
    with uckpt.CheckpointManager(tmp_path) as manager:
        cb = uckpt.keras.Checkpoint(manager)
        assert cb.restore(model) == 0 and cb.step == 0
    assert_bitwise(values(model.variables), before)
    assert not model.optimizer.built


def test_every_n_steps_mid_epoch(tmp_path):
    model = compiled()
    with uckpt.CheckpointManager(tmp_path) as manager:
        cb = uckpt.keras.Checkpoint(manager, every_n_steps=4, every_n_epochs=1)
        fit(model, cb, epochs=2)
        # steps 4, 8 (mid-epoch), 6 and 12 (epoch ends; step 12 is both, saved once)
        assert manager.steps() == [4, 6, 8, 12]
        assert uckpt.manifest(manager.path(8)).metadata["keras"] == {
            "epoch": 1, "batch": 2, "step": 8}
        (tmp_path / "step_00000012").rename(tmp_path / "elsewhere")  # newest is now mid-epoch

        cb2 = uckpt.keras.Checkpoint(manager)
        with pytest.warns(UserWarning, match="starts over from its first batch"):
            assert cb2.restore(compiled()) == 1
        assert (cb2.step, cb2.batch) == (8, 2)

        cb3 = uckpt.keras.Checkpoint(manager)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert cb3.restore(compiled(), at_epoch_end=True) == 1
        assert cb3.step == 6


def test_steps_keep_counting_after_a_mid_epoch_restore(tmp_path):
    model = compiled()
    with uckpt.CheckpointManager(tmp_path) as manager:
        fit(model, uckpt.keras.Checkpoint(manager, every_n_steps=4), epochs=1)
        assert manager.steps() == [4]
        cb = uckpt.keras.Checkpoint(manager, every_n_steps=4)
        with pytest.warns(UserWarning):
            start = cb.restore(model)
        fit(model, cb, epochs=2, initial_epoch=start)  # 12 more batches: steps 5-16
        assert manager.steps() == [4, 8, 12, 16]
        assert int(model.optimizer.iterations) == 16


def test_extra_state(tmp_path):
    model = compiled()
    counter = {"seen": 0}

    class Count(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            counter["seen"] += 1

    gen = np.random.default_rng(1)
    with uckpt.CheckpointManager(tmp_path) as manager:
        cb = uckpt.keras.Checkpoint(manager, state=lambda: {"seen": counter["seen"], "gen": gen})
        fit(model, cb, epochs=1, callbacks=[Count()])
        expected = gen.random(3)
        cb2 = uckpt.keras.Checkpoint(manager, state=lambda: {"seen": 0, "gen": gen})
        cb2.restore(compiled())
        assert cb2.restored["seen"] == 6
        assert_bitwise([gen.random(3)], [expected])
        with pytest.raises(ValueError, match="clash"):
            uckpt.keras.Checkpoint(manager, state={"step": 1}).restore(compiled())
    with pytest.raises(ValueError, match="every_n_steps"):
        uckpt.keras.Checkpoint(manager, every_n_steps=0)
