"""Issue 29's dtype policy and ``strict=False`` report with real Keras models: float32 into
a bfloat16 and a float16 model, refused without ``cast=``; a model with a new head."""
import numpy as np
import pytest
from tf_common import keras, layers

import uckpt
import uckpt_tf  # noqa: F401
from uckpt.errors import DtypeMismatchError, KeyMismatchError


def _model(dtype="float32", head=False, seed=0):
    keras.utils.set_random_seed(seed)
    stack = [keras.Input((4,)), layers.Dense(3, dtype=dtype, name="d"),
             layers.BatchNormalization(dtype=dtype, name="bn")]
    if head:
        stack.append(layers.Dense(2, dtype=dtype, name="head"))
    return keras.Sequential(stack)


def _values(model):
    return [np.array(v.numpy()) for v in model.weights]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_float32_into_a_lower_precision_model_needs_cast(tmp_path, dtype):
    full = _model()
    path = uckpt.save(tmp_path / "ck", {"model": full})
    low = _model(dtype, seed=1)
    before = _values(low)
    with pytest.raises(DtypeMismatchError) as e:
        uckpt.load(path, {"model": low})
    assert f"dense/kernel: dtype float32 in the checkpoint, {dtype} in the object" in str(e.value)
    assert "cast={'model/" in str(e.value)
    assert all(np.array_equal(a, b) for a, b in zip(_values(low), before))
    uckpt.load(path, {"model": low}, cast={"model/*": dtype})
    for got, want in zip(_values(low), _values(full)):
        assert got.dtype.name == dtype and np.array_equal(got, want.astype(got.dtype))


def test_a_float16_checkpoint_into_a_float32_model_with_a_safe_rule(tmp_path):
    half = _model("float16")
    path = uckpt.save(tmp_path / "ck", {"model": half})
    full = _model(seed=3)
    uckpt.load(path, {"model": full}, cast="safe")
    for got, want in zip(_values(full), _values(half)):
        assert got.dtype == np.float32 and np.array_equal(got, want.astype(np.float32))


def test_strict_false_loads_the_shared_variables_and_reports_the_new_head(tmp_path):
    old = _model()
    path = uckpt.save(tmp_path / "ck", {"model": old})
    new = _model(head=True, seed=4)
    head = new.layers[-1].kernel.numpy().copy()
    report = uckpt.LoadReport()
    uckpt.load(path, {"model": new}, strict=False, report=report)
    assert report.missing_keys == ["model/dense_1/bias", "model/dense_1/kernel"]
    assert report.unexpected_keys == []
    assert np.array_equal(new.layers[0].kernel.numpy(), old.layers[0].kernel.numpy())
    assert np.array_equal(new.layers[-1].kernel.numpy(), head)
    with pytest.raises(KeyMismatchError) as e:
        uckpt.load(path, {"model": _model(head=True)})
    assert e.value.missing == ["dense_1/bias", "dense_1/kernel"]
