"""The adapter conformance suite (uckpt.testing.adapters) on every built-in adapter and on
the worked example of docs/adapters.md. Each class is what a third party writes for its
own adapter: cases that make, change and (optionally) mismatch an object."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from uckpt.testing.adapters import AdapterCase, AdapterConformance, check_adapter

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "docs" / "examples"))
import estimator_adapter as ex  # noqa: E402


# --- the worked example (docs/examples/estimator_adapter.py) ---------------------------------
def fitted(seed, n_features=4):
    est = ex.SGDRegressor(n_features, seed=seed)
    fit_once(est)
    return est


def fit_once(est):
    g = np.random.default_rng(est.steps)
    x = g.standard_normal((8, est.n_features)).astype(np.float32)
    est.partial_fit(x, x.sum(axis=1))


EXAMPLE = AdapterCase("example.estimator", make=fitted, mutate=fit_once,
                      adapter=ex.SGDRegressorAdapter(),
                      make_mismatched=lambda: fitted(3, n_features=6),
                      make_unbuilt=lambda: ex.SGDRegressor(4, seed=9))


class TestExampleAdapter(AdapterConformance):
    cases = [EXAMPLE]


def test_check_adapter_runs_every_check_without_pytest(tmp_path):
    assert check_adapter(EXAMPLE, tmp_path) == ["round_trip", "dtypes", "snapshot_isolation",
                                                "independence", "strict_keys", "mismatch",
                                                "restore_before_build"]


def test_the_example_rng_provider_round_trips_through_random_state(tmp_path):
    import uckpt
    from uckpt.plugins import register_rng_provider

    register_rng_provider("estimator_adapter", ex.ExampleRNG())
    try:
        uckpt.save(tmp_path / "c", {"rng": uckpt.RandomState()})
        expected = ex.default_rng.integers(1 << 30, size=4)
        uckpt.load(tmp_path / "c", {"rng": uckpt.RandomState()})
        assert (ex.default_rng.integers(1 << 30, size=4) == expected).all()
        assert "estimator_adapter" in uckpt.load(tmp_path / "c")["rng"]
    finally:
        register_rng_provider("estimator_adapter", None)


def test_the_suite_fails_an_adapter_that_breaks_the_contract(tmp_path):
    class Forgetful(ex.SGDRegressorAdapter):  # restores everything but the step counter
        def restore(self, obj, tree):
            super().restore(obj, {**tree, "steps": 0})

    broken = AdapterCase("forgetful", make=fitted, mutate=fit_once, adapter=Forgetful())
    with pytest.raises(AssertionError, match=r"forgetful: restored into a fresh object: "
                                             r"steps: 2 vs 0"):
        check_adapter(broken, tmp_path / "forgetful")

    class Lax(ex.SGDRegressorAdapter):  # checks nothing before restoring
        def prepare(self, obj, spec):
            return None

    lax = AdapterCase("lax", make=fitted, mutate=fit_once, adapter=Lax(),
                      make_mismatched=lambda: fitted(3, n_features=6))
    with pytest.raises(AssertionError, match="lax: restoring into an object of another "
                                             "structure was not refused"):
        check_adapter(lax, tmp_path / "lax")


# --- PyTorch --------------------------------------------------------------------------------
def _torch():
    return pytest.importorskip("torch")


def torch_module(seed, width=3):
    torch = _torch()
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.BatchNorm1d(width),
                            torch.nn.Linear(width, 2).double())
    m.register_buffer("low", torch.randn(5).to(torch.bfloat16))
    return m


def torch_nudge(m):
    torch = _torch()
    with torch.no_grad():
        for t in list(m.parameters()) + [b for b in m.buffers() if b.is_floating_point()]:
            t.add_(torch.ones_like(t))
        m[1].num_batches_tracked += 1


def torch_optimizer(seed, cls_name="Adam", step=True):
    torch = _torch()
    model = torch.nn.Linear(3, 2)
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    opt = getattr(torch.optim, cls_name)(model.parameters(), lr=0.01)
    if step:
        torch_step(opt)
    return opt


def torch_step(opt):
    torch = _torch()
    params = opt.param_groups[0]["params"]
    for p in params:
        p.grad = torch.full_like(p, 0.5) + p.detach()
    opt.step()


class TestTorchAdapters(AdapterConformance):
    cases = [
        AdapterCase("torch.module", make=torch_module, mutate=torch_nudge,
                    make_mismatched=lambda: torch_module(0, width=5)),
        AdapterCase("torch.optimizer", make=torch_optimizer, mutate=torch_step,
                    make_mismatched=lambda: torch_optimizer(0, "SGD"),
                    make_unbuilt=lambda: torch_optimizer(5, step=False)),
    ]


# --- TensorFlow / Keras ---------------------------------------------------------------------
def _keras():
    pytest.importorskip("tensorflow")
    return pytest.importorskip("keras")


def keras_model(seed, filters=4):
    keras = _keras()
    layers = keras.layers
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((6, 6, 1)), layers.Conv2D(filters, 3),
                             layers.BatchNormalization(), layers.Flatten(),
                             layers.Dropout(0.5), layers.Dense(3)])


def keras_nudge(model):
    for v in model.trainable_variables:
        v.assign(v + 0.5)
    model(np.ones((2, 6, 6, 1), np.float32), training=True)  # dropout draws: seed state moves


def keras_optimizer(seed, built=True, cls_name="Adam"):
    keras = _keras()
    import uckpt_tf

    model = keras_model(seed)
    opt = getattr(keras.optimizers, cls_name)(0.01)
    state = uckpt_tf.OptimizerState(opt, model)
    if built:
        keras_step(state)
    return state


def keras_step(state):
    import tensorflow as tf

    model = state.trains
    x = np.random.default_rng(int(state.optimizer.iterations)).standard_normal((4, 6, 6, 1))
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x.astype(np.float32), training=False)))
    grads = tape.gradient(loss, model.trainable_variables)
    state.optimizer.apply_gradients(zip(grads, model.trainable_variables))


def keras_optimizer_state(state):
    from uckpt.testing.adapters import host_copy

    return host_copy({"iterations": int(state.optimizer.iterations),
                      "variables": [v.numpy() for v in state.optimizer.variables]})


class TestKerasAdapters(AdapterConformance):
    cases = [
        AdapterCase("keras.model", make=keras_model, mutate=keras_nudge,
                    make_mismatched=lambda: keras_model(0, filters=6)),
        AdapterCase("keras.optimizer", make=keras_optimizer, mutate=keras_step,
                    state_of=keras_optimizer_state,
                    make_mismatched=lambda: keras_optimizer(0, cls_name="SGD"),
                    make_unbuilt=lambda: keras_optimizer(5, built=False)),
    ]


# --- Chainer --------------------------------------------------------------------------------
def _chainer():
    import uckpt_chainer  # noqa: F401  (before chainer: its NumPy 2 shim)

    return pytest.importorskip("chainer")


def chainer_link(seed, hidden=5, built=True):
    chainer = _chainer()
    L = chainer.links

    class Net(chainer.Chain):
        def __init__(self):
            super().__init__()
            with self.init_scope():
                self.bn = L.BatchNormalization(3)
                self.fc = L.Linear(None, hidden)  # lazily initialized
                self.out = L.Linear(hidden, 2)

    np.random.seed(seed)
    net = Net()
    if built:
        net.fc(np.ones((1, 3), np.float32))
    return net


def chainer_nudge(net):
    for _, p in net.namedparams():
        if p.array is not None:
            p.array += 0.5
    net.bn.avg_mean += 1
    net.bn.N += 1


def chainer_optimizer(seed, cls_name="Adam", step=True):
    chainer = _chainer()
    net = chainer_link(seed)
    opt = getattr(chainer.optimizers, cls_name)()
    opt.setup(net)
    if step:
        chainer_step(opt)
    return opt


def chainer_step(opt):
    import chainer.functions as F

    x = np.ones((2, 3), np.float32) * (opt.t + 1)
    opt.update(lambda: F.sum(opt.target.out(opt.target.fc(opt.target.bn(x)))))


class TestChainerAdapters(AdapterConformance):
    cases = [
        AdapterCase("chainer.link", make=chainer_link, mutate=chainer_nudge,
                    make_mismatched=lambda: chainer_link(0, hidden=7),
                    make_unbuilt=lambda: chainer_link(5, built=False)),
        AdapterCase("chainer.optimizer", make=chainer_optimizer, mutate=chainer_step,
                    make_mismatched=lambda: chainer_optimizer(0, "SGD"),
                    make_unbuilt=lambda: chainer_optimizer(5, step=False)),
    ]


def test_uckpt_testing_is_imported_only_on_request_and_without_pytest():
    import json
    import subprocess

    code = ("import sys, json, uckpt; a = sorted({'uckpt.testing', 'pytest'} & set(sys.modules)); "
            "import uckpt.testing.adapters, uckpt.testing.threads; "
            "print(json.dumps([a, 'pytest' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [[], False]
