"""The Chainer adapters: exact round trips into fresh objects, and clear errors that
leave the objects untouched."""
import warnings

import numpy as np
import pytest

import uckpt
import uckpt_chainer  # noqa: F401  (before chainer: the NumPy 2 shim)
from uckpt.errors import (DtypeMismatchError, KeyMismatchError, ShapeMismatchError,
                          StateMismatchError)

chainer = pytest.importorskip("chainer")
import chainer.functions as F  # noqa: E402
import chainer.links as L  # noqa: E402
from chainer import optimizer_hooks, training  # noqa: E402
from chainer.iterators import SerialIterator  # noqa: E402
from chainer.training import extensions  # noqa: E402
import uckpt_chainer.checks  # noqa: E402  (the submodules the tests use by name, imported
import uckpt_chainer.optim  # noqa: E402  here, not by whichever test happened to run first)

pytestmark = pytest.mark.filterwarnings("ignore:pkg_resources is deprecated")


class Net(chainer.Chain):
    def __init__(self, hidden=5, bn_name="bn"):
        super().__init__()
        with self.init_scope():
            self.conv = L.Convolution2D(1, 3, ksize=3)
            setattr(self, bn_name, L.BatchNormalization(3))
            self.fc = L.Linear(None, hidden)  # lazily initialized
            self.out = L.Linear(hidden, 2)
        self.bn_name = bn_name

    def forward(self, x):
        h = F.relu(getattr(self, self.bn_name)(self.conv(x)))
        return self.out(F.dropout(F.relu(self.fc(h)), 0.3))


def data(n=8, seed=0):
    rs = np.random.RandomState(seed)
    return rs.standard_normal((n, 1, 5, 5)).astype(np.float32), rs.randint(0, 2, n).astype(np.int32)


def bits(a):
    if a is None:
        return None
    a = np.asarray(a)
    return a.view(np.uint8).tobytes() + str(a.dtype).encode() + str(a.shape).encode()


def params(link):
    out = {name: bits(p.array) for name, p in link.namedparams()}
    for name, sub in link.namedlinks():
        if isinstance(sub, L.BatchNormalization):
            out[name + "/avg_mean"] = bits(sub.avg_mean)
            out[name + "/avg_var"] = bits(sub.avg_var)
            out[name + "/N"] = (sub.N, type(sub.N))
    return out


def train(model, opt, steps=3, seed=1):
    x, t = data(seed=seed)
    for _ in range(steps):
        opt.update(lambda: F.softmax_cross_entropy(model(x), t))


def make(opt_cls=chainer.optimizers.Adam, seed=0, hooks=True, **kw):
    np.random.seed(seed)
    model = Net(**kw)
    opt = opt_cls()
    opt.setup(model)
    if hooks:
        opt.add_hook(optimizer_hooks.WeightDecay(1e-4))
        opt.add_hook(optimizer_hooks.GradientClipping(5.0))
    return model, opt


def test_link_round_trip_is_bitwise_into_a_fresh_lazily_initialized_model(tmp_path):
    model, opt = make()
    train(model, opt)
    model.bn.N = 7  # a persistent plain value
    uckpt.save(tmp_path / "c", {"model": model})
    fresh, _ = make(seed=99)
    assert fresh.fc.W.array is None
    uckpt.load(tmp_path / "c", {"model": fresh})
    assert params(fresh) == params(model)
    assert type(fresh.bn.N) is int and fresh.bn.N == 7


def test_restoring_lazy_parameters_does_not_shift_the_restored_generator(tmp_path):
    model, opt = make()
    train(model, opt)
    np.random.seed(77)
    uckpt.save(tmp_path / "c", {"rng": uckpt.RandomState(), "model": model})
    expected = np.random.rand(3)
    fresh, _ = make(seed=5)  # fc is lazy: restoring initializes it, and initializers draw
    uckpt.load(tmp_path / "c", {"rng": uckpt.RandomState(), "model": fresh})  # rng first
    assert (np.random.rand(3) == expected).all()


def test_loads_read_straight_into_the_parameters(tmp_path):
    model, opt = make()
    train(model, opt)
    uckpt.save(tmp_path / "c", {"model": model})
    other, opt2 = make(seed=5)
    train(other, opt2)
    w = other.conv.W.array
    uckpt.load(tmp_path / "c", {"model": other})
    assert other.conv.W.array is w  # same memory, new values
    assert bits(w) == bits(model.conv.W.array)


def test_chainlist_and_sequential_paths(tmp_path):
    np.random.seed(0)
    chain = chainer.ChainList(L.Linear(3, 4), chainer.Sequential(L.Linear(4, 2), F.relu))
    uckpt.save(tmp_path / "c", {"m": chain})
    tree = uckpt.load(tmp_path / "c")["m"]
    assert set(tree) == {"0", "1"} and set(tree["1"]["0"]) == {"W", "b"}
    np.random.seed(1)
    other = chainer.ChainList(L.Linear(3, 4), chainer.Sequential(L.Linear(4, 2), F.relu))
    uckpt.load(tmp_path / "c", {"m": other})
    assert params(other) == params(chain)


@pytest.mark.parametrize("opt_cls", [chainer.optimizers.MomentumSGD, chainer.optimizers.Adam])
def test_optimizer_round_trip_continues_bitwise(tmp_path, opt_cls):
    model, opt = make(opt_cls)
    train(model, opt)
    opt.new_epoch()
    rate = "lr" if opt_cls is chainer.optimizers.MomentumSGD else "alpha"
    setattr(opt.hyperparam, rate, 0.0123)  # changed by the training loop: restored too
    hook = dict(uckpt_chainer.optim.hooks(opt))["WeightDecay"]
    hook.rate = 3e-4
    uckpt.save(tmp_path / "c", {"model": model, "opt": opt, "rng": uckpt.RandomState()})

    model2, opt2 = make(opt_cls, seed=42)  # fresh: no optimizer state yet
    uckpt.load(tmp_path / "c", {"model": model2, "opt": opt2, "rng": uckpt.RandomState()})
    assert (opt2.t, opt2.epoch) == (opt.t, opt.epoch)
    assert getattr(opt2.hyperparam, rate) == 0.0123
    assert dict(uckpt_chainer.optim.hooks(opt2))["WeightDecay"].rate == 3e-4
    for (n1, p1), (n2, p2) in zip(sorted(model.namedparams()), sorted(model2.namedparams())):
        assert n1 == n2 and p1.update_rule.t == p2.update_rule.t
        assert {k: bits(v) for k, v in p1.update_rule.state.items()} == \
               {k: bits(v) for k, v in p2.update_rule.state.items()}
    # the same next steps (dropout draws from the restored global generator)
    state = np.random.get_state()
    train(model, opt, steps=2, seed=3)
    np.random.set_state(state)
    train(model2, opt2, steps=2, seed=3)
    assert params(model2) == params(model)


def test_restore_into_a_running_optimizer_reads_state_in_place(tmp_path):
    model, opt = make(chainer.optimizers.MomentumSGD)
    train(model, opt)
    uckpt.save(tmp_path / "c", {"opt": opt})
    v = model.conv.W.update_rule.state["v"]
    saved = bits(v)
    train(model, opt)
    uckpt.load(tmp_path / "c", {"opt": opt})
    assert model.conv.W.update_rule.state["v"] is v and bits(v) == saved


def test_loss_scaling_state_round_trips(tmp_path):
    model, opt = make(chainer.optimizers.SGD)
    opt.loss_scaling(interval=10)
    opt._loss_scale = 512.0
    opt._loss_scaling_isnan_ever = True
    uckpt.save(tmp_path / "c", {"opt": opt})
    _, opt2 = make(chainer.optimizers.SGD)
    opt2.loss_scaling(interval=10)
    uckpt.load(tmp_path / "c", {"opt": opt2})
    assert opt2._loss_scale == 512.0 and opt2._loss_scaling_isnan_ever is True


def test_renamed_link_lists_missing_and_unexpected_paths_and_changes_nothing(tmp_path):
    model, opt = make()
    train(model, opt)
    uckpt.save(tmp_path / "c", {"model": model})
    other, _ = make(seed=3, bn_name="norm")
    train(other, other_opt(other))
    before = params(other)
    with pytest.raises(KeyMismatchError) as e:
        uckpt.load(tmp_path / "c", {"model": other})
    entries = ("gamma", "beta", "avg_mean", "avg_var", "N")
    assert set(e.value.missing) == {f"norm/{k}" for k in entries}
    assert set(e.value.unexpected) == {f"bn/{k}" for k in entries}
    assert "missing from the checkpoint" in str(e.value) and "hint" in str(e.value)
    assert isinstance(e.value, ValueError)
    assert params(other) == before


def other_opt(model):
    opt = chainer.optimizers.SGD()
    opt.setup(model)
    return opt


def test_shape_and_dtype_mismatches_change_nothing(tmp_path):
    model, opt = make()
    train(model, opt)
    uckpt.save(tmp_path / "c", {"model": model})

    wider, wopt = make(hidden=6, seed=3)
    train(wider, wopt)
    before = params(wider)
    with pytest.raises(ShapeMismatchError) as e:
        uckpt.load(tmp_path / "c", {"model": wider})
    assert "fc/W: shape [5, 27] in the checkpoint, [6, 27] in the object" in str(e.value)
    assert params(wider) == before

    double, dopt = make(seed=3)
    double.to_device("@numpy")
    for p in double.params():
        p.array = p.array.astype(np.float64) if p.array is not None else None
    double.fc.W.array = np.zeros((5, 27))
    with pytest.raises(DtypeMismatchError,
                       match="conv/W: dtype float32 in the checkpoint, float64"):
        uckpt.load(tmp_path / "c", {"model": double})


def test_optimizer_class_and_hook_mismatches(tmp_path):
    model, opt = make(chainer.optimizers.Adam)
    train(model, opt)
    uckpt.save(tmp_path / "c", {"opt": opt})
    _, sgd = make(chainer.optimizers.MomentumSGD)
    with pytest.raises(StateMismatchError,
                       match="holds the state of a chainer.optimizers.adam.Adam"):
        uckpt.load(tmp_path / "c", {"opt": sgd})
    _, nohooks = make(chainer.optimizers.Adam, hooks=False)
    with pytest.raises(KeyMismatchError) as e:
        uckpt.load(tmp_path / "c", {"opt": nohooks})
    assert "uckpt:hooks/WeightDecay/rate" in e.value.unexpected
    assert "uckpt:hooks/GradientClipping/threshold" in e.value.unexpected
    _, wider = make(chainer.optimizers.Adam, hidden=6)  # fresh: no state, checked all the same
    with pytest.raises(ShapeMismatchError) as e:
        uckpt.load(tmp_path / "c", {"opt": wider})
    assert "out/W/m: shape [2, 5] in the checkpoint, [2, 6] for the parameter" in str(e.value)
    assert wider.target.out.W.update_rule.state is None


def test_serial_iterator_continues_with_the_same_batches(tmp_path):
    dataset = np.arange(10)
    np.random.seed(0)
    it = SerialIterator(dataset, 3)
    for _ in range(5):  # into the second epoch
        it.next()
    uckpt.save(tmp_path / "c", {"it": it, "rng": uckpt.RandomState()})
    expected = [it.next() for _ in range(8)]  # crosses into the next epochs: new shuffles

    np.random.seed(123)
    fresh = SerialIterator(dataset, 3)
    uckpt.load(tmp_path / "c", {"it": fresh, "rng": uckpt.RandomState()})
    assert (fresh.epoch, fresh.current_position) == (1, 5)
    assert [fresh.next() for _ in range(8)] == expected

    shorter = SerialIterator(np.arange(9), 3)
    with pytest.raises(ShapeMismatchError,
                       match="order: shape \\[10\\] in the checkpoint, \\[9\\]"):
        uckpt.load(tmp_path / "c", {"it": shorter, "rng": uckpt.RandomState()})


def test_variables_and_parameters(tmp_path):
    w = chainer.Parameter(np.arange(6, dtype=np.float32).reshape(2, 3))
    uckpt.save(tmp_path / "c", {"w": w, "v": chainer.Variable(np.ones(2, np.float64))})
    target = chainer.Parameter(chainer.initializers.Zero(), (2, 3))
    lazy = chainer.Parameter(chainer.initializers.Zero())
    uckpt.load(tmp_path / "c", {"w": target, "v": chainer.Variable(np.zeros(2, np.float64))},
               strict=False)
    uckpt.load(tmp_path / "c", {"w": lazy}, strict=False)
    assert bits(target.array) == bits(w.array) == bits(lazy.array)
    with pytest.raises(ShapeMismatchError):
        uckpt.load(tmp_path / "c", {"w": chainer.Parameter(np.zeros((3, 2), np.float32))},
                   strict=False)


def build_trainer(out, *, extra_extension=False, log_report=True):
    np.random.seed(0)
    model = L.Classifier(Net())
    opt = chainer.optimizers.MomentumSGD(lr=0.05)
    opt.setup(model)
    opt.add_hook(optimizer_hooks.WeightDecay(1e-4))
    x, t = data(16)
    it = SerialIterator(chainer.datasets.TupleDataset(x, t), 4)
    trainer = training.Trainer(training.updaters.StandardUpdater(it, opt), (6, "iteration"),
                               out=str(out))
    if log_report:
        trainer.extend(extensions.LogReport(trigger=(2, "iteration")))
    trainer.extend(extensions.ExponentialShift("lr", 0.5), trigger=(3, "iteration"))
    if extra_extension:
        trainer.extend(extensions.LogReport(trigger=(1, "iteration")), name="second")
    return trainer, model


def test_trainer_tree_is_what_save_npz_saves_plus_optimizer_additions(tmp_path):
    trainer, model = build_trainer(tmp_path / "out")
    trainer.run()
    uckpt.save(tmp_path / "c", {"trainer": trainer})
    tree = uckpt.load(tmp_path / "c")["trainer"]
    ours = set(uckpt_chainer.checks.flatten(tree))
    npz = set(chainer.serializers.npz.serialize(trainer))
    additions = {p for p in ours if "uckpt:" in p}
    assert ours - additions == npz
    assert additions == {"updater/optimizer:main/uckpt:class",
                         "updater/optimizer:main/uckpt:hooks/WeightDecay/rate"}
    assert tree["updater"]["iteration"] == 6
    assert isinstance(tree["extensions"]["LogReport"]["_log"], str)


def test_trainer_round_trip_into_a_fresh_trainer(tmp_path):
    trainer, model = build_trainer(tmp_path / "out")
    trainer.run()
    uckpt.save(tmp_path / "c", {"trainer": trainer})
    fresh, fresh_model = build_trainer(tmp_path / "out2")
    w = fresh_model.predictor.conv.W.array
    uckpt.load(tmp_path / "c", {"trainer": fresh})
    assert fresh_model.predictor.conv.W.array is w  # read in place
    assert fresh.updater.iteration == 6 and fresh.updater.epoch == trainer.updater.epoch
    assert params(fresh_model) == params(model)
    assert fresh.get_extension("LogReport").log == trainer.get_extension("LogReport").log
    shift = fresh.get_extension("ExponentialShift")
    assert (shift._t, shift._last_value) == (2, 0.05 * 0.25)
    assert fresh._snapshot_elapsed_time == trainer.elapsed_time


def test_trainer_extension_mismatches(tmp_path):
    trainer, _ = build_trainer(tmp_path / "out")
    trainer.run()
    uckpt.save(tmp_path / "c", {"trainer": trainer})
    more, model = build_trainer(tmp_path / "o2", extra_extension=True)
    before = params(model)
    with pytest.raises(KeyMismatchError) as e:
        uckpt.load(tmp_path / "c", {"trainer": more})
    assert "extensions/second" in e.value.missing
    assert "register extensions added for the resumed run after restoring" in str(e.value)
    assert params(model) == before and more.updater.iteration == 0
    fewer, _ = build_trainer(tmp_path / "o3", log_report=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        uckpt.load(tmp_path / "c", {"trainer": fewer})
    assert any("extensions state for LogReport" in str(w.message) for w in caught)
    assert fewer.updater.iteration == 6


def test_trainer_with_renamed_model_links(tmp_path):
    trainer, _ = build_trainer(tmp_path / "out")
    uckpt.save(tmp_path / "c", {"trainer": trainer})  # before run(): elapsed time 0
    np.random.seed(0)
    model = L.Classifier(Net(bn_name="norm"))
    opt = chainer.optimizers.MomentumSGD(lr=0.05)
    opt.setup(model)
    opt.add_hook(optimizer_hooks.WeightDecay(1e-4))
    x, t = data(16)
    it = SerialIterator(chainer.datasets.TupleDataset(x, t), 4)
    other = training.Trainer(training.updaters.StandardUpdater(it, opt), (6, "iteration"))
    other.extend(extensions.LogReport(trigger=(2, "iteration")))
    other.extend(extensions.ExponentialShift("lr", 0.5), trigger=(3, "iteration"))
    with pytest.raises(KeyMismatchError) as e:
        uckpt.load(tmp_path / "c", {"trainer": other})
    assert "updater/model:main/predictor/norm/gamma" in e.value.missing
    assert "updater/model:main/predictor/bn/gamma" in e.value.unexpected


def test_snapshot_extension_saves_by_trigger_and_resume_restores(tmp_path):
    trainer, model = build_trainer(tmp_path / "out")
    with uckpt.CheckpointManager(tmp_path / "ckpt") as manager:
        trainer.extend(uckpt_chainer.snapshot(manager, trigger=(2, "iteration"),
                                              metrics=["main/loss"]))
        trainer.run()
        assert manager.steps() == [2, 4, 6]
        assert "main/loss" in uckpt.manifest(manager.path(6)).metadata["metrics"]
        fresh, fresh_model = build_trainer(tmp_path / "out2")
        snap = uckpt_chainer.snapshot(manager, trigger=(2, "iteration"))
        fresh.extend(snap)
        assert snap.resume(fresh, step=4) == 4
        assert fresh.updater.iteration == 4
        assert uckpt_chainer.resume(manager, fresh) == 6
        assert params(fresh_model) == params(model)
    with pytest.raises(ValueError, match="must not use the key 'rng'"):
        uckpt_chainer.snapshot(manager, extra={"rng": 1})


def test_snapshot_saves_on_a_preemption_signal_then_exits(tmp_path):
    import os
    import signal

    trainer, model = build_trainer(tmp_path / "out")

    @training.make_extension(trigger=(1, "iteration"))
    def preempt(t):
        if t.updater.iteration == 3:
            os.kill(os.getpid(), signal.SIGUSR1)

    manager = uckpt.CheckpointManager(tmp_path / "ckpt",
                                      save_policy=uckpt.OnSignal(signal.SIGUSR1))
    trainer.extend(preempt)
    trainer.extend(uckpt_chainer.snapshot(manager, trigger=(100, "iteration")))
    with pytest.raises(SystemExit) as e:
        trainer.run()
    assert e.value.code == 0 and manager.steps() == [3]


def test_public_module(tmp_path):
    import uckpt.chainer as uc

    assert uc.snapshot is uckpt_chainer.snapshot and uc.resume is uckpt_chainer.resume


class FakeCupy:
    """Just enough of CuPy's global-generator API for the provider: an opaque stream."""

    class RandomState:
        def __init__(self, seed=0, method=100):
            self.method = method
            self.seed(seed)

        def seed(self, seed):
            self._rs = np.random.RandomState(int(seed) % 2**32)

        def tomaxint(self):
            return np.int64(self._rs.randint(0, 2**62))

        def rand(self):
            return self._rs.rand()

    def __init__(self, devices=2):
        import types

        gen = types.SimpleNamespace(_random_states={})
        self.random = types.SimpleNamespace(
            _generator=gen, get_random_state=lambda: gen._random_states.setdefault(
                self.current, FakeCupy.RandomState()),
            set_random_state=lambda rs: gen._random_states.__setitem__(self.current, rs),
            RandomState=FakeCupy.RandomState)
        self.current = 0
        fake = self

        class Device:
            def __init__(self, index=None):
                self.id = fake.current if index is None else index

            def __enter__(self):
                self.prev, fake.current = fake.current, self.id

            def __exit__(self, *exc):
                fake.current = self.prev

        self.cuda = types.SimpleNamespace(Device=Device, runtime=types.SimpleNamespace(
            getDeviceCount=lambda: devices))


def test_cupy_provider_reseeds_so_a_restored_stream_continues(monkeypatch):
    fake = FakeCupy()
    monkeypatch.setitem(__import__("sys").modules, "cupy", fake)
    provider = uckpt_chainer.CupyRNG()
    for device in (0, 1):
        with fake.cuda.Device(device):
            fake.random.get_random_state().seed(device + 10)
    state = provider.get()
    assert set(state) == {"0", "1"} and all(v["method"] == 100 for v in state.values())
    expected = [fake.random._generator._random_states[d].rand() for d in (0, 1)]
    for device in (0, 1):
        with fake.cuda.Device(device):
            fake.random.get_random_state().seed(999)  # the stream moves on
    provider.set(state)
    assert [fake.random._generator._random_states[d].rand() for d in (0, 1)] == expected
    with pytest.warns(RuntimeWarning, match="device\\(s\\) \\[5\\]"):
        provider.set({"5": {"method": 100, "seed": 1}})
