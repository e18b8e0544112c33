"""Keras's .weights.h5 layout and uckpt's live layout are one tree (issue 14): a checkpoint of a
live model converts to a .weights.h5 that model.load_weights accepts, and a .weights.h5
converted to uckpt restores with uckpt.load(dir, {"model": model}); optimizer included."""
import numpy as np
import pytest

import uckpt
from uckpt.conversion import convert, diff
from uckpt.errors import KeyMismatchError

pytestmark = pytest.mark.filterwarnings("ignore::uckpt.conversion.ConvertWarning")


def _small():
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4),
                              keras.layers.BatchNormalization(), keras.layers.Dropout(0.2),
                              keras.Sequential([keras.layers.Dense(3), keras.layers.Dense(2)])])
    model.compile(optimizer="adam", loss="mse")
    return model


def _trained(make, shape, out):
    """A model after two steps of fit, so that every optimizer variable holds a trained value.
    Run eagerly: tracing a Keras Application's train step into a graph costs several times
    what two eager steps cost, and the eager steps fill the same weights and optimizer
    variables (docs/testing.md, "Run time")."""
    model = make()
    model.run_eagerly = True
    rng = np.random.default_rng(0)
    model.fit(rng.random((4, *shape)).astype("float32"), rng.random((4, *out)).astype("float32"),
              verbose=0, epochs=1, batch_size=2)
    return model


def _assert_same(a, b, optimizer=True):
    pairs = list(zip(a.weights, b.weights))
    if optimizer:
        assert len(a.optimizer.variables) == len(b.optimizer.variables)
        pairs += list(zip(a.optimizer.variables, b.optimizer.variables))
    for x, y in pairs:
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and np.array_equal(x, y), getattr(x, "path", "")


def _live_to_file(tmp_path, model, make):
    """live -> uckpt -> .weights.h5 -> load_weights"""
    uckpt.save(tmp_path / "live", {"model": model, "optimizer": model.optimizer, "epoch": 1})
    with pytest.warns(uckpt.conversion.ConvertWarning, match="left out 'epoch'"):
        convert(tmp_path / "live", tmp_path / "out.weights.h5")
    again = make()
    again.optimizer.build(again.trainable_variables)
    again.load_weights(tmp_path / "out.weights.h5")
    _assert_same(model, again)


def _file_to_live(tmp_path, model, make):
    """.weights.h5 (Keras's own) -> uckpt -> uckpt.load(dir, {"model": model})"""
    model.save_weights(tmp_path / "keras.weights.h5")
    convert(tmp_path / "keras.weights.h5", tmp_path / "conv")
    assert diff(tmp_path / "keras.weights.h5", tmp_path / "conv").identical
    again = make()
    assert not again.optimizer.built
    uckpt.load(tmp_path / "conv", {"model": again})  # builds the optimizer, as fit would
    _assert_same(model, again)
    # and back to a .weights.h5: Keras's loader takes it
    convert(tmp_path / "conv", tmp_path / "back.weights.h5")
    third = make()
    third.optimizer.build(third.trainable_variables)
    third.load_weights(tmp_path / "back.weights.h5")
    _assert_same(model, third)


def test_live_checkpoint_to_weights_h5(tmp_path):
    _live_to_file(tmp_path, _trained(_small, (3,), (2,)), _small)


def test_weights_h5_to_live_model(tmp_path):
    _file_to_live(tmp_path, _trained(_small, (3,), (2,)), _small)


def test_weights_h5_into_another_architecture_changes_nothing(tmp_path):
    import keras

    model = _trained(_small, (3,), (2,))
    model.save_weights(tmp_path / "keras.weights.h5")
    convert(tmp_path / "keras.weights.h5", tmp_path / "conv")
    other = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(2)])
    before = [np.array(w) for w in other.weights]
    with pytest.raises(KeyMismatchError, match="layers/batch_normalization/vars/0"):
        uckpt.load(tmp_path / "conv", {"model": other})
    for w, b in zip(other.weights, before):
        assert np.array_equal(np.asarray(w), b)


def test_model_without_optimizer_state(tmp_path):
    """A .weights.h5 of an uncompiled model (no optimizer group) restores the weights only."""
    import keras

    def make():
        return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4),
                                 keras.layers.BatchNormalization()])
    model = make()
    model.save_weights(tmp_path / "m.weights.h5")
    convert(tmp_path / "m.weights.h5", tmp_path / "conv")
    again = make()
    uckpt.load(tmp_path / "conv", {"model": again})
    _assert_same(model, again, optimizer=False)


def _app(name):
    import keras

    def make():
        model = getattr(keras.applications, name)(weights=None, input_shape=(32, 32, 3),
                                                  classes=3)
        model.compile(optimizer="adam", loss="categorical_crossentropy")
        return model
    return make


@pytest.mark.slow
@pytest.mark.parametrize("name", ["MobileNetV2", "EfficientNetB0", "ResNet50"])
def test_keras_applications_both_directions(tmp_path, name):
    make = _app(name)
    model = _trained(make, (32, 32, 3), (3,))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _live_to_file(tmp_path / "a", model, make)
    _file_to_live(tmp_path / "b", model, make)


def test_two_models_cannot_share_a_weights_file(tmp_path):
    from uckpt.errors import UnsupportedObjectError

    a, b = _small(), _small()
    for m in (a, b):
        m.build((None, 3))
    uckpt.save(tmp_path / "live", {"a": a, "b": b})
    with pytest.raises(UnsupportedObjectError, match=r"models at \['a', 'b'\]"):
        convert(tmp_path / "live", tmp_path / "out.weights.h5")
    assert not (tmp_path / "out.weights.h5").exists()
    # any other HDF5 name keeps uckpt's own layout (Keras reads its layout only from
    # *.weights.h5 files), and converts back to the same checkpoint
    convert(tmp_path / "live", tmp_path / "plain.h5")
    assert diff(tmp_path / "live", tmp_path / "plain.h5").identical


def test_cli_writes_keras_layout(tmp_path):
    import subprocess
    import sys

    model = _trained(_small, (3,), (2,))
    uckpt.save(tmp_path / "live", {"model": model, "optimizer": model.optimizer})
    r = subprocess.run([sys.executable, "-m", "uckpt.cli", "convert", str(tmp_path / "live"),
                        str(tmp_path / "out.weights.h5")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    again = _small()
    again.optimizer.build(again.trainable_variables)
    again.load_weights(tmp_path / "out.weights.h5")
    _assert_same(model, again)
