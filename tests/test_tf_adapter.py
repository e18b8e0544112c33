"""The TensorFlow/Keras adapters through real checkpoints: exact round trips into fresh
objects, and refusals that change nothing."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tf_common import (assert_bitwise, data, float_bits, keras, layers, small_cnn, tf,
                       train_step, values)

import uckpt  # noqa: E402
import uckpt_tf  # noqa: E402
from uckpt.errors import (DtypeMismatchError, KeyMismatchError, ShapeMismatchError,  # noqa: E402
                          StateMismatchError, UnsupportedObjectError)

OPTIMIZERS = {
    "sgd-momentum": lambda: keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True),
    "adam": lambda: keras.optimizers.Adam(0.01),
    "adam-amsgrad": lambda: keras.optimizers.Adam(0.01, amsgrad=True),
    "adamw": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.1),
    "rmsprop": lambda: keras.optimizers.RMSprop(0.01, momentum=0.5, centered=True),
    "adam-ema": lambda: keras.optimizers.Adam(0.01, use_ema=True),
    "loss-scale": lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(0.01)),
    "accumulate": lambda: keras.optimizers.SGD(0.05, momentum=0.5, gradient_accumulation_steps=2),
}


def trained(opt_name="adam", steps=3, seed=0):
    keras.utils.set_random_seed(seed)
    model = small_cnn()
    optimizer = OPTIMIZERS[opt_name]()
    x, y = data()
    for i in range(steps):
        train_step(model, optimizer, x[i * 4:(i + 1) * 4], y[i * 4:(i + 1) * 4])
    return model, optimizer


# --- models -----------------------------------------------------------------------------------
def test_model_keys_follow_structure_not_auto_names(tmp_path):
    a, b = small_cnn(), small_cnn()  # b's layers are conv2d_1, dense_1, ...: other paths
    assert [v.path for v in a.variables] != [v.path for v in b.variables]
    keys = list(uckpt_tf.layer_variables(a))
    assert keys == list(uckpt_tf.layer_variables(b))
    assert keys == ["conv2d/kernel", "conv2d/bias", "batch_normalization/gamma",
                    "batch_normalization/beta", "batch_normalization/moving_mean",
                    "batch_normalization/moving_variance", "dropout/seed_generator_state",
                    "dense/kernel", "dense/bias"]
    uckpt.save(tmp_path / "ck", {"model": a})
    assert "model/batch_normalization/moving_mean" in uckpt.manifest(tmp_path / "ck").arrays


def test_nested_and_shared_layers_are_stored_once():
    shared = layers.Dense(3, name="shared")
    inner = keras.Sequential([keras.Input((3,)), shared, layers.Dense(3)])
    inp = keras.Input((3,))
    out = layers.Dense(3)(shared(inner(inp)))
    model = keras.Model(inp, out)
    keys = uckpt_tf.layer_variables(model)
    assert len(keys) == len({id(v) for v in model.variables}) == len(model.variables)
    assert "sequential/dense/kernel" in keys and "sequential/dense_1/kernel" in keys


def test_subclassed_model_keys_are_stable_and_complete():
    class Scale(layers.Layer):
        def build(self, shape):  # unnamed weights: Keras names them variable_<counter>
            self.s = self.add_weight(shape=(shape[-1],), initializer="ones")
            self.t = self.add_weight(shape=(), initializer="zeros", trainable=False)

        def call(self, x):
            return x * self.s + self.t

    class Net(keras.Model):
        def __init__(self):
            super().__init__()
            self.blocks = [layers.Dense(4), layers.Dense(4)]
            self.heads = {"a": layers.Dense(2), "b": Scale()}
            self.noise = layers.GaussianNoise(0.1)

        def call(self, x):
            for b in self.blocks:
                x = b(x)
            return self.heads["b"](self.heads["a"](self.noise(x)))

    keys = []
    for _ in range(2):
        net = Net()
        net(np.zeros((1, 3), "float32"))
        found = uckpt_tf.layer_variables(net)
        assert len(found) == len(net.variables)
        keys.append(list(found))
    assert keys[0] == keys[1]
    assert keys[0][-3:] == ["scale/variable", "scale/variable_1",
                            "gaussian_noise/seed_generator_state"]


def test_model_and_optimizer_roundtrip_into_fresh_compiled_model(tmp_path):
    """model.optimizer of a fresh compiled model is unbuilt: it is built, then restored."""
    model, optimizer = trained("adam")
    model.compile(optimizer=optimizer, loss="mse")
    uckpt.save(tmp_path / "ck", {"model": model, "optimizer": model.optimizer,
                                 "rng": uckpt.RandomState()})
    x, y = data(seed=1)
    expected = [train_step(model, optimizer, x[i:i + 4], y[i:i + 4]) for i in (0, 4, 8)]

    keras.utils.set_random_seed(99)  # other initial weights and seeds: the restore must win
    fresh = small_cnn()
    fresh.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    assert not fresh.optimizer.built
    uckpt.load(tmp_path / "ck", {"model": fresh, "optimizer": fresh.optimizer,
                                 "rng": uckpt.RandomState()})
    assert fresh.optimizer.built and int(fresh.optimizer.iterations) == 3
    got = [train_step(fresh, fresh.optimizer, x[i:i + 4], y[i:i + 4]) for i in (0, 4, 8)]
    assert float_bits(got) == float_bits(expected)  # dropout masks continue identically
    assert_bitwise(values(fresh.variables), values(model.variables))
    assert_bitwise(values(fresh.optimizer.variables), values(optimizer.variables))


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
def test_optimizer_roundtrip_every_variable(tmp_path, opt_name):
    model, optimizer = trained(opt_name)
    uckpt.save(tmp_path / "ck", {"model": model,
                                 "optimizer": uckpt_tf.OptimizerState(optimizer, model)})
    tree = uckpt.load(tmp_path / "ck")
    counter = tree["optimizer"].get("inner_optimizer", tree["optimizer"])["variables"]["iteration"]
    assert int(counter) == 3 and counter.dtype == np.int64
    assert tree["optimizer"]["built"] is True
    saved = uckpt_tf.optimizer_variables(optimizer)
    assert len(saved) == len(optimizer.variables)

    fresh_model, fresh_opt = small_cnn(), OPTIMIZERS[opt_name]()
    uckpt.load(tmp_path / "ck", {"model": fresh_model,
                                 "optimizer": uckpt_tf.OptimizerState(fresh_opt, fresh_model)})
    assert list(uckpt_tf.optimizer_variables(fresh_opt)) == list(saved)
    assert_bitwise(values(fresh_opt.variables), values(optimizer.variables))
    steps = 1 if opt_name == "accumulate" else 3  # two batches per step
    assert int(fresh_opt.iterations) == int(optimizer.iterations) == steps
    x, y = data(seed=2)
    tf.random.set_global_generator(tf.random.Generator.from_seed(0))
    a = train_step(model, optimizer, x[:4], y[:4])
    b = train_step(fresh_model, fresh_opt, x[:4], y[:4])
    assert float_bits([a]) == float_bits([b])
    assert_bitwise(values(fresh_model.variables), values(model.variables))


def test_optimizer_after_model_in_mapping_is_built_in_restore(tmp_path):
    model, optimizer = trained("adam")
    model.compile(optimizer=optimizer, loss="mse")
    uckpt.save(tmp_path / "ck", {"optimizer": model.optimizer, "model": model})
    fresh = small_cnn()
    fresh.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    uckpt.load(tmp_path / "ck", {"optimizer": fresh.optimizer, "model": fresh})
    assert_bitwise(values(fresh.optimizer.variables), values(optimizer.variables))


def test_unbuilt_optimizer_without_its_model_is_refused(tmp_path):
    model, optimizer = trained("adam")
    uckpt.save(tmp_path / "ck", {"optimizer": optimizer})
    fresh = keras.optimizers.Adam(0.01)
    with pytest.raises(StateMismatchError, match="OptimizerState") as info:
        uckpt.load(tmp_path / "ck", {"optimizer": fresh})
    assert "has not been built" in str(info.value)
    assert not fresh.built and int(fresh.iterations) == 0
    fresh.build(small_cnn().trainable_variables)  # the other way out the hint names
    uckpt.load(tmp_path / "ck", {"optimizer": fresh})
    assert_bitwise(values(fresh.variables), values(optimizer.variables))


def test_unbuilt_optimizer_roundtrip(tmp_path):
    optimizer = keras.optimizers.SGD(0.1)
    optimizer.learning_rate.assign(0.25)
    uckpt.save(tmp_path / "ck", {"optimizer": optimizer})
    fresh = keras.optimizers.SGD(0.1)
    uckpt.load(tmp_path / "ck", {"optimizer": fresh})
    assert not fresh.built and float(fresh.learning_rate) == 0.25
    model, built = trained("sgd-momentum")
    with pytest.raises(KeyMismatchError, match="before the optimizer's first step"):
        uckpt.load(tmp_path / "ck", {"optimizer": built})


def test_other_architecture_lists_everything_and_changes_nothing(tmp_path):
    model, optimizer = trained("adam")
    uckpt.save(tmp_path / "ck", {"model": model,
                                 "optimizer": uckpt_tf.OptimizerState(optimizer, model)})
    other = small_cnn(filters=6, extra_dense=True)
    other_opt = keras.optimizers.Adam(0.01)
    before = values(other.variables)
    with pytest.raises(KeyMismatchError) as info:
        uckpt.load(tmp_path / "ck", {"model": other,
                                     "optimizer": uckpt_tf.OptimizerState(other_opt, other)})
    err = info.value
    assert err.missing == ["dense_1/bias", "dense_1/kernel"]
    assert err.unexpected == []
    assert any(m.startswith("conv2d/kernel: shape [3, 3, 1, 4] in the checkpoint, "
                            "[3, 3, 1, 6]") for m in err.mismatched)
    assert any(m.startswith("dense/kernel") for m in err.mismatched)
    assert "hint" in str(err)
    assert_bitwise(values(other.variables), before)
    assert not other_opt.built

    smaller = keras.Sequential([keras.Input((6, 6, 1)), layers.Conv2D(4, 3),
                                layers.Flatten(), layers.Dense(3)])
    extra = sorted(["batch_normalization/beta", "batch_normalization/gamma",
                    "batch_normalization/moving_mean", "batch_normalization/moving_variance",
                    "dropout/seed_generator_state"])
    with pytest.raises(KeyMismatchError) as info:
        uckpt.load(tmp_path / "ck", {"model": smaller, "optimizer": uckpt_tf.OptimizerState(
            keras.optimizers.Adam(0.01), smaller)})
    assert info.value.unexpected == extra
    # strict=False (issue 29): the variables both hold load, the others are reported
    report = uckpt.LoadReport()
    uckpt.load(tmp_path / "ck", {"model": smaller}, strict=False, report=report)
    assert report.unexpected_keys == ["model/" + k for k in extra] + ["optimizer"]
    assert report.missing_keys == []
    assert_bitwise(values(smaller.layers[-1].variables), values(model.layers[-1].variables))


def test_unbuilt_model_is_refused_with_a_hint(tmp_path):
    uckpt.save(tmp_path / "ck", {"model": small_cnn()})
    lazy = keras.Sequential([layers.Conv2D(4, 3), layers.Flatten(), layers.Dense(3)])
    with pytest.raises(KeyMismatchError, match="model.build") as info:
        uckpt.load(tmp_path / "ck", {"model": lazy})
    assert "conv2d/kernel" in info.value.unexpected and info.value.missing == []


def test_shape_or_dtype_alone_raise_their_own_error(tmp_path):
    model = small_cnn()
    uckpt.save(tmp_path / "ck", {"model": model})
    with pytest.raises(ShapeMismatchError):
        uckpt.load(tmp_path / "ck", {"model": small_cnn(classes=4)})
    keras.config.set_dtype_policy("float64")
    try:
        wide = small_cnn()
    finally:
        keras.config.set_dtype_policy("float32")
    with pytest.raises(DtypeMismatchError):
        uckpt.load(tmp_path / "ck", {"model": wide})


def test_other_optimizer_type_is_refused(tmp_path):
    model, optimizer = trained("adam")
    uckpt.save(tmp_path / "ck", {"model": model,
                                 "optimizer": uckpt_tf.OptimizerState(optimizer, model)})
    fresh = small_cnn()
    sgd = keras.optimizers.SGD(0.1, momentum=0.9)
    before = values(fresh.variables)
    with pytest.raises(StateMismatchError, match="Adam.*SGD") as info:
        uckpt.load(tmp_path / "ck", {"model": fresh,
                                     "optimizer": uckpt_tf.OptimizerState(sgd, fresh)})
    assert not isinstance(info.value, KeyMismatchError)
    assert_bitwise(values(fresh.variables), before)  # refused before anything changed
    assert not sgd.built


# --- variables, modules ---------------------------------------------------------------------
DTYPES = ["float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64",
          "uint8", "bool", "complex64"]


def _values(dtype, seed):
    g = np.random.default_rng(seed)
    if dtype == "bool":
        return g.random((2, 3)) > 0.5
    return tf.cast(g.standard_normal((2, 3)) * 50, dtype).numpy()


@pytest.mark.parametrize("dtype", DTYPES)
def test_variables_every_dtype(tmp_path, dtype):
    tv = tf.Variable(_values(dtype, 0))
    kv = keras.Variable(_values(dtype, 1), dtype=dtype) if dtype != "complex64" else tf.Variable(
        _values(dtype, 1))
    uckpt.save(tmp_path / "ck", {"tf": tv, "keras": kv})
    assert {e.dtype for e in uckpt.manifest(tmp_path / "ck").arrays.values()} == {dtype}
    t2, k2 = tf.Variable(_values(dtype, 2)), tf.Variable(_values(dtype, 3))
    uckpt.load(tmp_path / "ck", {"tf": t2, "keras": k2})
    assert_bitwise([t2.numpy(), k2.numpy()], [tv.numpy(), kv.numpy()])
    with pytest.raises(ShapeMismatchError):
        uckpt.load(tmp_path / "ck", {"tf": tf.Variable(_values(dtype, 2)[:1]), "keras": k2})


def test_tf_module_roundtrip_and_mismatch(tmp_path):
    def module(seed, extra=False):
        g = np.random.default_rng(seed)
        m = tf.Module(name="net")
        m.w = tf.Variable(g.standard_normal((3, 2)).astype("float32"))
        m.steps = tf.Variable(seed, dtype=tf.int64, trainable=False)
        m.blocks = [tf.Module(), tf.Module()]
        for b in m.blocks:
            b.scale = tf.Variable(g.standard_normal(2).astype("float32"))
        m.alias = m.w  # reachable twice: stored once
        if extra:
            m.bias = tf.Variable(np.zeros(2, "float32"))
        return m

    a = module(1)
    uckpt.save(tmp_path / "ck", {"net": a})
    assert sorted(uckpt.manifest(tmp_path / "ck").arrays) == [
        "net/alias", "net/blocks/0/scale", "net/blocks/1/scale", "net/steps"]
    b = module(2)
    uckpt.load(tmp_path / "ck", {"net": b})
    assert_bitwise(values(b.variables), values(a.variables))
    with pytest.raises(KeyMismatchError) as info:
        uckpt.load(tmp_path / "ck", {"net": module(3, extra=True)})
    assert info.value.missing == ["bias"]


# --- random state -------------------------------------------------------------------------------
def test_tf_generator_roundtrip_and_algorithm_check(tmp_path):
    g = tf.random.Generator.from_seed(7)
    g.normal([3])
    uckpt.save(tmp_path / "ck", {"g": g})
    expected = g.uniform([5]).numpy()
    fresh = tf.random.Generator.from_seed(123)
    uckpt.load(tmp_path / "ck", {"g": fresh})
    assert_bitwise([fresh.uniform([5]).numpy()], [expected])
    other = tf.random.Generator.from_seed(1, alg="threefry")
    with pytest.raises(StateMismatchError, match="algorithm"):
        uckpt.load(tmp_path / "ck", {"g": other})


def test_seed_generator_roundtrip(tmp_path):
    sg = keras.random.SeedGenerator(5)
    keras.random.normal([2], seed=sg)
    uckpt.save(tmp_path / "ck", {"sg": sg})
    expected = keras.random.normal([4], seed=sg).numpy()
    fresh = keras.random.SeedGenerator(77)
    uckpt.load(tmp_path / "ck", {"sg": fresh})
    assert_bitwise([keras.random.normal([4], seed=fresh).numpy()], [expected])


def test_random_state_captures_tf_and_keras_globals(tmp_path):
    keras.utils.set_random_seed(3)
    tf.random.set_global_generator(tf.random.Generator.from_seed(3))

    def draws():
        return [tf.random.get_global_generator().normal([3]).numpy(),
                keras.random.uniform([3]).numpy(),  # unseeded: Keras's global SeedGenerator
                np.random.random(2), np.float64(__import__("random").random())]

    draws()
    uckpt.save(tmp_path / "ck", {"rng": uckpt.RandomState()})
    tree = uckpt.load(tmp_path / "ck")
    assert set(tree["rng"]["tensorflow"]) == {"global_generator", "keras"}
    assert tree["rng"]["tensorflow"]["keras"]["random_seed"] == 3
    expected = draws()
    keras.utils.set_random_seed(50)  # drops Keras's global generator
    tf.random.set_global_generator(tf.random.Generator.from_seed(50))
    draws()
    uckpt.load(tmp_path / "ck", {"rng": uckpt.RandomState()})
    assert_bitwise(draws(), expected)


def test_random_state_restores_absent_keras_generator(tmp_path):
    keras.utils.set_random_seed(4)  # Keras's global generator does not exist yet
    uckpt.save(tmp_path / "ck", {"rng": uckpt.RandomState()})
    expected = keras.random.uniform([3]).numpy()  # created now, from Python's random
    keras.random.uniform([3])
    uckpt.load(tmp_path / "ck", {"rng": uckpt.RandomState()})
    assert_bitwise([keras.random.uniform([3]).numpy()], [expected])


# --- data position -------------------------------------------------------------------------------
def _pipeline():
    return (tf.data.Dataset.range(40).shuffle(16, seed=5, reshuffle_each_iteration=True)
            .repeat().map(lambda x: x * 2).batch(3).prefetch(2))


def test_tf_data_iterator_position_roundtrip(tmp_path):
    it = iter(_pipeline())
    for _ in range(17):  # into the second pass over the data
        next(it)
    uckpt.save(tmp_path / "ck", {"data": it})
    stored = uckpt.load(tmp_path / "ck")["data"]
    assert isinstance(stored["state"], bytes) and "int64" in stored["element_spec"]
    expected = [next(it).numpy() for _ in range(10)]
    fresh = iter(_pipeline())
    uckpt.load(tmp_path / "ck", {"data": fresh})
    assert_bitwise([next(fresh).numpy() for _ in range(10)], expected)

    with pytest.raises(StateMismatchError, match="iterator"):
        uckpt.load(tmp_path / "ck", {"data": iter(tf.data.Dataset.range(3).batch(2).map(
            lambda x: tf.cast(x, tf.float32)))})
    stateful = iter(tf.data.Dataset.range(4).map(lambda x: x + tf.random.uniform([], 0, 9,
                                                                                  tf.int64)))
    with pytest.raises(UnsupportedObjectError, match="stateful"):
        uckpt.save(tmp_path / "bad", {"data": stateful})


def test_epoch_shuffled_order_is_a_function_of_seed_and_epoch():
    x = np.arange(10, dtype="int64")
    ds = uckpt_tf.epoch_shuffled(x, batch_size=3, seed=1)
    batches = [b.numpy() for b in ds.take(9)]  # 3 epochs of 3 batches (one item dropped)
    epochs = [np.concatenate(batches[i:i + 3]) for i in (0, 3, 6)]
    assert all(len(set(e)) == 9 for e in epochs) and not np.array_equal(epochs[0], epochs[1])
    later = [b.numpy() for b in uckpt_tf.epoch_shuffled(x, batch_size=3, seed=1, initial_epoch=1,
                                                         initial_batch=2).take(4)]
    assert_bitwise(later, batches[5:9])
    pairs = uckpt_tf.epoch_shuffled((x, x * 10), batch_size=5, seed=2)
    a, b = next(iter(pairs))
    assert_bitwise([b.numpy()], [a.numpy() * 10])


# --- dispatch -----------------------------------------------------------------------------------
def test_adapters_are_chosen_by_type():
    by_name = {a.name: a for a in uckpt_tf.ADAPTERS}
    for obj, name in [(small_cnn(), "keras.layer"), (layers.Dense(2), "keras.layer"),
                      (keras.optimizers.SGD(), "keras.optimizer"),
                      (keras.random.SeedGenerator(1), "keras.seed_generator"),
                      (tf.random.Generator.from_seed(1), "tf.random.generator"),
                      (iter(tf.data.Dataset.range(2)), "tf.data.iterator"),
                      (tf.Variable(1.0), "tf.variable"), (keras.Variable(1.0), "tf.variable"),
                      (tf.Module(), "tf.module")]:
        assert next(a for a in uckpt_tf.ADAPTERS if a.handles(obj)) is by_name[name], obj


def test_importing_the_adapter_package_imports_no_framework():
    code = ("import sys, json, uckpt, uckpt_tf; "
            "print(json.dumps([m for m in ('tensorflow', 'keras') if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
