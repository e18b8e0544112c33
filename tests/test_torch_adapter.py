"""The PyTorch adapters on real torch objects, driven the way the core drives them.

``load_into`` plays the core's part: the extracted tree is deep-copied (what
storage would hold), ``prepare`` sees it as ArraySpecs, the stored bytes are
read into the returned targets in place (fresh arrays elsewhere), then
``restore`` gets the loaded tree.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import uckpt  # noqa: E402
import uckpt_torch  # noqa: E402
from uckpt.adapter import ArraySpec  # noqa: E402
from uckpt.dtypes import name_of  # noqa: E402
from uckpt.errors import (DtypeMismatchError, KeyMismatchError, ShapeMismatchError,  # noqa: E402
                          StateMismatchError, UnsupportedDtypeError)
from uckpt_torch.convert import from_numpy, same_memory, to_numpy, writable_view  # noqa: E402


# --- playing the core ---------------------------------------------------------------------
def adapter_for(obj):
    return next(a for a in uckpt_torch.ADAPTERS if a.handles(obj))


def stored_copy(tree):
    """What storage gives back: every array copied, containers rebuilt with their types."""
    if isinstance(tree, np.ndarray):
        return np.array(tree, copy=True)
    if isinstance(tree, dict):
        return {k: stored_copy(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(stored_copy(v) for v in tree)
    return tree


def as_spec(tree):
    if isinstance(tree, np.ndarray):
        return ArraySpec(name_of(tree.dtype), tuple(tree.shape))
    if isinstance(tree, dict):
        return {k: as_spec(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(as_spec(v) for v in tree)
    return tree


def read(stored, target):
    """Read stored arrays into the in-place targets the adapter returned, or fresh arrays."""
    if isinstance(stored, np.ndarray):
        if target is None:
            return np.array(stored, copy=True)
        assert target.flags.writeable and target.flags.c_contiguous
        assert target.shape == stored.shape and target.dtype == stored.dtype
        np.copyto(target, stored)
        return target
    if isinstance(stored, dict):
        target = target or {}
        return {k: read(v, target.get(k)) for k, v in stored.items()}
    if isinstance(stored, (list, tuple)):
        target = target or [None] * len(stored)
        return type(stored)(read(v, t) for v, t in zip(stored, target))
    return stored


def load_into(obj, stored):
    adapter = adapter_for(obj)
    targets = adapter.prepare(obj, as_spec(stored))
    adapter.restore(obj, read(stored, targets))
    return targets


def save(obj):
    return stored_copy(adapter_for(obj).extract(obj))


def assert_same(a, b):
    """Bitwise equality of two state trees (tensors: same dtype and bits; tuples stay tuples)."""
    assert type(a) is type(b) or (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(bits(a), bits(b))
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b)
    else:
        assert a == b


def bits(t):
    """The tensor's bits as integers, so NaNs and signed zeros compare exactly."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bool:
        return t
    if t.is_complex():
        t = torch.view_as_real(t)
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.view(ints[t.element_size()])


# --- models and training ------------------------------------------------------------------
class Net(nn.Module):
    """A small CNN with batch norm, dropout and two tied linear layers."""

    def __init__(self, classes=3):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(64, 16)
        self.drop = nn.Dropout(0.25)
        self.proj = nn.Linear(16, 16)
        self.back = nn.Linear(16, 16)
        self.back.weight = self.proj.weight  # tied
        self.head = nn.Linear(16, classes)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2).flatten(1)
        x = self.drop(torch.relu(self.fc(x)))
        return self.head(self.back(torch.relu(self.proj(x))))


def batches(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, 1, 8, 8, generator=g), torch.randint(0, 3, (8,), generator=g))
            for _ in range(n)]


def train_step(model, opt, batch, sched=None, scaler=None):
    x, y = batch
    model.train()
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    if scaler is None:
        loss.backward()
        opt.step()
    else:
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    if sched is not None:
        sched.step()
    return loss.detach()


def fresh_net(seed):
    torch.manual_seed(seed)
    return Net()


OPTIMIZERS = {
    "sgd-momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-3),
    "adam-amsgrad": lambda p: torch.optim.Adam(p, lr=1e-3, amsgrad=True),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.1),
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=1e-3, momentum=0.5, centered=True),
    "adagrad": lambda p: torch.optim.Adagrad(p, lr=1e-2),
    "adadelta": lambda p: torch.optim.Adadelta(p),
    "adamax": lambda p: torch.optim.Adamax(p, lr=1e-3),
    "nadam": lambda p: torch.optim.NAdam(p, lr=1e-3),
    "radam": lambda p: torch.optim.RAdam(p, lr=1e-3),
    "rprop": lambda p: torch.optim.Rprop(p, lr=1e-3),
    "asgd": lambda p: torch.optim.ASGD(p, lr=1e-2),
}
if hasattr(torch.optim, "Adafactor"):
    OPTIMIZERS["adafactor"] = lambda p: torch.optim.Adafactor(p, lr=1e-2)
SCHEDULERS = {
    "steplr": lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5),
    "onecycle": lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.01, total_steps=20),
}


# --- nn.Module ----------------------------------------------------------------------------
def test_module_roundtrip_with_batchnorm_and_tied_weights():
    model = fresh_net(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for b in batches(3):
        train_step(model, opt, b)
    tree = adapter_for(model).extract(model)
    assert set(tree) == set(model.state_dict())
    assert {"bn.running_mean", "bn.running_var", "bn.num_batches_tracked"} <= set(tree)
    assert tree["bn.num_batches_tracked"].dtype == np.int64 and tree["bn.num_batches_tracked"] == 3
    assert tree["proj.weight"] is tree["back.weight"]  # tied: one array, stored once
    assert same_memory(tree["conv.weight"], model.conv.weight)  # a view, not a copy

    other = fresh_net(1)
    targets = load_into(other, stored_copy(tree))
    assert same_memory(targets["fc.weight"], other.fc.weight)  # the core read into the parameter
    assert other.back.weight is other.proj.weight  # still tied
    assert_same(model.state_dict(), other.state_dict())
    x = batches(1, seed=5)[0][0]
    model.eval(), other.eval()
    assert torch.equal(model(x), other(x))


def test_module_restore_copies_when_not_read_in_place():
    model, other = fresh_net(0), fresh_net(1)
    adapter = adapter_for(model)
    adapter.restore(other, stored_copy(adapter.extract(model)))
    assert other.back.weight is other.proj.weight
    assert_same(model.state_dict(), other.state_dict())


class WithExtraState(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.extra = {"calls": 0, "note": "", "table": torch.zeros(3)}

    def get_extra_state(self):
        return self.extra

    def set_extra_state(self, state):
        self.extra = state


def test_module_extra_state_passes_through():
    model = WithExtraState()
    model.extra = {"calls": 7, "note": "warm", "table": torch.arange(3.0)}
    other = WithExtraState()
    load_into(other, save(model))
    assert other.extra["calls"] == 7 and other.extra["note"] == "warm"
    assert torch.equal(other.extra["table"], torch.arange(3.0))
    assert torch.equal(other.lin.weight, model.lin.weight)


def test_module_loads_into_lazy_module():
    torch.manual_seed(0)
    model, lazy = nn.Linear(5, 3), nn.LazyLinear(3)
    load_into(lazy, save(model))
    assert torch.equal(lazy.weight, model.weight) and torch.equal(lazy.bias, model.bias)


# --- tensors and dtypes -------------------------------------------------------------------
DTYPES = ["float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64",
          "uint8", "uint16", "uint32", "uint64", "bool", "complex64", "complex128",
          "float8_e4m3fn", "float8_e5m2"]


def sample(dtype, shape=(3, 5), seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point or dtype.is_complex:
        return (torch.randn(shape, generator=g, dtype=torch.complex128 if dtype.is_complex
                            else torch.float64) * 10).to(dtype)
    return torch.randint(0, 100, shape, generator=g).to(dtype)


@pytest.mark.parametrize("name", DTYPES)
def test_tensor_leaf_every_dtype(name):
    dtype = getattr(torch, name, None)
    if dtype is None:
        pytest.skip(f"this torch has no {name}")
    t = sample(dtype)
    arr = to_numpy(t)
    assert name_of(arr.dtype) == name and arr.shape == (3, 5)
    assert same_memory(arr, t)
    back = from_numpy(np.array(arr, copy=True))
    assert back.dtype == dtype and torch.equal(bits(back), bits(t))

    dest = torch.zeros((3, 5), dtype=dtype)
    target = load_into(dest, save(t))
    assert same_memory(target, dest)  # read in place
    assert torch.equal(bits(dest), bits(t))


@pytest.mark.parametrize("name", ["float32", "bfloat16", "int64", "complex64"])
def test_non_contiguous_tensors(name):
    dtype = getattr(torch, name)
    base = sample(dtype, (6, 8))
    for view in (base.t(), base[1:, ::3], base[2:5].t()[::2]):
        arr = to_numpy(view)
        assert not view.is_contiguous() and arr.shape == tuple(view.shape)
        assert np.array_equal(np.ascontiguousarray(arr).view(np.uint8),
                              to_numpy(view.contiguous()).view(np.uint8))
        assert writable_view(view) is None
        dest = torch.zeros(view.shape[::-1], dtype=dtype).t()
        assert load_into(dest, save(view)) is None  # not in place: restore copies
        assert torch.equal(bits(dest), bits(view))


def test_conjugate_and_negative_views_are_resolved():
    z = sample(torch.complex64, (2, 3))
    assert np.array_equal(to_numpy(z.conj()), np.conj(to_numpy(z)))
    assert writable_view(z.conj()) is None
    dest = torch.zeros(2, 3, dtype=torch.complex64)
    load_into(dest, save(z.conj()))
    assert torch.equal(dest, z.conj())


def test_parameter_leaf_keeps_requires_grad():
    p = nn.Parameter(torch.randn(4, 2))
    q = nn.Parameter(torch.zeros(4, 2))
    load_into(q, save(p))
    assert q.requires_grad and torch.equal(p, q)


def test_from_numpy_copies_what_torch_cannot_share():
    ro = np.arange(6, dtype=np.float32)
    ro.flags.writeable = False
    t = from_numpy(ro)
    assert torch.equal(t, torch.arange(6, dtype=torch.float32))
    assert not np.shares_memory(t.numpy(), ro)
    big = np.arange(4, dtype=">i4")
    assert torch.equal(from_numpy(big), torch.arange(4, dtype=torch.int32))
    assert torch.equal(from_numpy(np.arange(5)[::-1]), torch.arange(5).flip(0))
    writable = np.arange(3, dtype=np.int16)
    assert np.shares_memory(from_numpy(writable).numpy(), writable)


def test_unsupported_dtypes_are_named():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized tensors are deprecated
        q = torch.quantize_per_tensor(torch.randn(3), 0.1, 0, torch.quint8)
    with pytest.raises(UnsupportedDtypeError, match="quint8"):
        to_numpy(q)
    if hasattr(torch, "float8_e4m3fnuz"):
        with pytest.raises(UnsupportedDtypeError, match="float8_e4m3fnuz"):
            adapter_for(torch.zeros(2)).extract(torch.zeros(2).to(torch.float8_e4m3fnuz))


# --- optimizers, schedulers, scaler -------------------------------------------------------
@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
def test_optimizer_roundtrip_into_fresh_optimizer(opt_name):
    make = OPTIMIZERS[opt_name]
    model = fresh_net(0)
    opt = make(model.parameters())
    data = batches(6)
    for b in data[:3]:
        train_step(model, opt, b)
    tree = adapter_for(opt).extract(opt)
    assert tree["class"] == f"{type(opt).__module__}.{type(opt).__name__}"
    if "betas" in tree["param_groups"][0]:
        assert isinstance(tree["param_groups"][0]["betas"], tuple)
    if opt_name.startswith("adam"):
        assert tree["state"][0]["step"].dtype == np.float32 and tree["state"][0]["step"].shape == ()
    stored_model, stored_opt = save(model), stored_copy(tree)

    other = fresh_net(1)
    other_opt = make(other.parameters())
    load_into(other, stored_model)
    load_into(other_opt, stored_opt)
    assert_same(opt.state_dict(), other_opt.state_dict())

    rng = torch.get_rng_state()  # dropout draws from it: both continuations start alike
    expected = [train_step(model, opt, b) for b in data[3:]]
    torch.set_rng_state(rng)
    got = [train_step(other, other_opt, b) for b in data[3:]]
    assert all(torch.equal(a, b) for a, b in zip(expected, got))
    assert_same(model.state_dict(), other.state_dict())


@pytest.mark.parametrize("sched_name", sorted(SCHEDULERS))
def test_training_continues_bitwise_after_restore(sched_name):
    """Model + optimizer + scheduler + torch RNG restored into fresh objects: dropout
    masks, learning rates and updates all continue exactly as the originals."""
    rng = uckpt_torch.RNG_PROVIDERS[0]
    data = batches(7)
    model = fresh_net(0)
    opt = OPTIMIZERS["adamw"](model.parameters())
    sched = SCHEDULERS[sched_name](opt)
    for b in data[:4]:
        train_step(model, opt, b, sched)
    stored = {name: save(obj) for name, obj in (("m", model), ("o", opt), ("s", sched))}
    stored_rng = stored_copy(rng.get())
    expected = [train_step(model, opt, b, sched) for b in data[4:]]

    other = fresh_net(1)
    other_opt = OPTIMIZERS["adamw"](other.parameters())
    other_sched = SCHEDULERS[sched_name](other_opt)
    load_into(other, stored["m"])
    load_into(other_opt, stored["o"])
    load_into(other_sched, stored["s"])
    rng.set(stored_rng)
    got = [train_step(other, other_opt, b, other_sched) for b in data[4:]]
    for a, b in zip(expected, got):
        assert torch.equal(a, b)
    assert_same(model.state_dict(), other.state_dict())
    assert_same(opt.state_dict(), other_opt.state_dict())
    assert_same(sched.state_dict(), other_sched.state_dict())


def test_reduce_lr_on_plateau_roundtrip():
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(2))], lr=1.0)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0)
    for metric in (1.0, 2.0, 3.0):
        sched.step(metric)
    other_opt = torch.optim.SGD([nn.Parameter(torch.zeros(2))], lr=1.0)
    other = torch.optim.lr_scheduler.ReduceLROnPlateau(other_opt, patience=0)
    load_into(other, save(sched))
    assert_same(sched.state_dict(), other.state_dict())
    assert other.state_dict()["mode_worse"] == math.inf


def test_grad_scaler_roundtrip():
    model = fresh_net(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=2)
    for b in batches(3):
        train_step(model, opt, b, scaler=scaler)
    assert scaler.state_dict()["scale"] != 2.0 ** 10  # it grew
    other = torch.amp.GradScaler("cpu")
    load_into(other, save(scaler))
    assert other.state_dict() == scaler.state_dict()
    assert other.get_scale() == scaler.get_scale()


def test_grad_scaler_refuses_state_of_disabled_scaler():
    disabled = torch.amp.GradScaler("cpu", enabled=False)
    with pytest.raises(StateMismatchError, match="disabled"):
        load_into(torch.amp.GradScaler("cpu"), save(disabled))


# --- random state -------------------------------------------------------------------------
def test_generator_roundtrip():
    g = torch.Generator().manual_seed(42)
    torch.rand(10, generator=g)
    tree = adapter_for(g).extract(g)
    assert tree["device"] == "cpu" and tree["state"].dtype == np.uint8
    stored = stored_copy(tree)
    expected = torch.rand(10, generator=g)
    other = torch.Generator().manual_seed(0)
    load_into(other, stored)
    assert torch.equal(torch.rand(10, generator=other), expected)


def test_generator_refuses_other_device():
    g = torch.Generator()
    stored = save(g)
    stored["device"] = "cuda"
    with pytest.raises(StateMismatchError, match="cuda generator"):
        load_into(g, stored)


def test_rng_provider_restores_global_state():
    rng = uckpt_torch.RNG_PROVIDERS[0]
    assert rng.name == "torch"
    torch.manual_seed(3)
    torch.rand(5)
    state = stored_copy(rng.get())
    assert state["cpu"].dtype == np.uint8
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        assert "cuda" not in state
    expected = torch.randn(20)
    torch.rand(100)
    rng.set(state)
    assert torch.equal(torch.randn(20), expected)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_rng_provider_warns_about_cuda_state_without_cuda():
    rng = uckpt_torch.RNG_PROVIDERS[0]
    state = stored_copy(rng.get())
    state["cuda"] = [np.zeros(16, np.uint8)]
    with pytest.warns(RuntimeWarning, match="1 CUDA device"):
        rng.set(state)


# --- refusals -----------------------------------------------------------------------------
class Wider(Net):
    def __init__(self):
        super().__init__(classes=5)
        self.extra = nn.Linear(2, 2)


def test_module_key_mismatch_lists_everything_and_changes_nothing():
    target = fresh_net(1)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    stored = save(Wider())
    with pytest.raises(KeyMismatchError) as info:
        adapter_for(target).prepare(target, as_spec(stored))
    msg = str(info.value)
    assert "unexpected in the checkpoint (2): extra.bias, extra.weight" in msg
    assert "head.weight: shape [5, 16] in the checkpoint, [3, 16] in the object" in msg
    assert "head.bias: shape [5]" in msg
    assert info.value.unexpected == ["extra.bias", "extra.weight"]
    assert_same(before, dict(target.state_dict()))

    del stored["bn.running_mean"]
    with pytest.raises(KeyMismatchError,
                       match=r"missing from the checkpoint \(1\): bn.running_mean"):
        adapter_for(target).restore(target, stored)
    assert_same(before, dict(target.state_dict()))


def test_module_shape_and_dtype_mismatch():
    stored = save(nn.Linear(4, 3))
    with pytest.raises(ShapeMismatchError, match=r"weight: shape \[3, 4\] in the checkpoint, "
                                                   r"\[5, 4\] in the object"):
        load_into(nn.Linear(4, 5), stored)
    half = nn.Linear(4, 3).half()
    before = half.weight.clone()
    with pytest.raises(DtypeMismatchError, match="dtype float32 in the checkpoint, float16"):
        load_into(half, stored)
    assert torch.equal(half.weight, before)


def test_tensor_shape_mismatch():
    with pytest.raises(ShapeMismatchError, match=r"shape \[2, 3\] in the checkpoint, \[3, 2\]"):
        load_into(torch.zeros(3, 2), save(torch.ones(2, 3)))
    with pytest.raises(DtypeMismatchError, match="int64 in the checkpoint, float32"):
        load_into(torch.zeros(2), save(torch.ones(2, dtype=torch.int64)))


def test_optimizer_refusals():
    model = fresh_net(0)
    adam = torch.optim.Adam(model.parameters())
    train_step(model, adam, batches(1)[0])
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(StateMismatchError,
                       match=r"torch\.optim\.adam\.Adam but the optimizer to restore is a "
                             r"torch\.optim\.sgd\.SGD"):
        load_into(sgd, save(adam))
    assert sgd.state_dict()["state"] == {}

    fewer = torch.optim.Adam(list(model.parameters())[:3])
    with pytest.raises(StateMismatchError, match=r"1 parameter group\(s\) of \[\d+\] parameters"):
        load_into(fewer, save(adam))
    groups = torch.optim.Adam([{"params": list(model.parameters())[:3]},
                               {"params": list(model.parameters())[3:]}])
    with pytest.raises(StateMismatchError, match="2 of"):
        load_into(groups, save(adam))


def test_scheduler_class_mismatch():
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    step = torch.optim.lr_scheduler.StepLR(opt, 2)
    with pytest.raises(StateMismatchError, match="StepLR.*ExponentialLR"):
        load_into(torch.optim.lr_scheduler.ExponentialLR(opt, 0.9), save(step))


def test_adapters_are_chosen_by_type():
    model = fresh_net(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cases = [(model, "torch.module"), (model.fc.weight, "torch.tensor"),
             (torch.zeros(1), "torch.tensor"), (opt, "torch.optimizer"),
             (torch.optim.lr_scheduler.StepLR(opt, 1), "torch.lr_scheduler"),
             (torch.amp.GradScaler("cpu"), "torch.grad_scaler"),
             (torch.Generator(), "torch.generator")]
    for obj, name in cases:
        assert adapter_for(obj).name == name


# --- end to end through uckpt.save / uckpt.load ----------------------------------------------


def _torch_rng_registered():
    from uckpt.registry import rng_providers

    return "torch" in rng_providers()


def _setup(seed, sched_name="onecycle"):
    model = fresh_net(seed)
    opt = OPTIMIZERS["adam"](model.parameters())
    sched = SCHEDULERS[sched_name](opt)
    return model, opt, sched, torch.amp.GradScaler("cpu", init_scale=2.0 ** 8, growth_interval=2)


def test_e2e_save_load_continues_bitwise(tmp_path):
    data = batches(6)
    model, opt, sched, scaler = _setup(0)
    for b in data[:3]:
        train_step(model, opt, b, sched, scaler)
    uckpt.save(tmp_path / "ck", {"model": model, "optimizer": opt, "scheduler": sched,
                                 "scaler": scaler, "rng": uckpt.RandomState()})
    rng = torch.get_rng_state()
    expected = [train_step(model, opt, b, sched, scaler) for b in data[3:]]

    model2, opt2, sched2, scaler2 = _setup(1)
    uckpt.load(tmp_path / "ck", {"model": model2, "optimizer": opt2, "scheduler": sched2,
                                 "scaler": scaler2, "rng": uckpt.RandomState()})
    assert model2.back.weight is model2.proj.weight
    torch.set_rng_state(rng)  # the torch RNG itself is covered by the next test
    got = [train_step(model2, opt2, b, sched2, scaler2) for b in data[3:]]
    assert all(torch.equal(a, b) for a, b in zip(expected, got))
    assert_same(model.state_dict(), model2.state_dict())
    assert_same(opt.state_dict(), opt2.state_dict())
    assert_same(sched.state_dict(), sched2.state_dict())
    assert scaler.state_dict() == scaler2.state_dict()
    # tied weights are stored once
    assert "model/proj.weight" in uckpt.manifest(tmp_path / "ck").arrays
    assert "model/back.weight" not in uckpt.manifest(tmp_path / "ck").arrays


@pytest.mark.skipif("not _torch_rng_registered()",
                    reason="the 'uckpt.rng' entry point 'torch' is not installed")
def test_e2e_random_state_includes_torch(tmp_path):
    torch.manual_seed(11)
    uckpt.save(tmp_path / "ck", {"rng": uckpt.RandomState()})
    expected = torch.randn(10)
    uckpt.load(tmp_path / "ck", {"rng": uckpt.RandomState()})
    assert torch.equal(torch.randn(10), expected)


def test_e2e_load_without_state_gives_numpy(tmp_path):
    model, opt, sched, _ = _setup(0)
    train_step(model, opt, batches(1)[0], sched)
    uckpt.save(tmp_path / "ck", {"model": model, "optimizer": opt, "scheduler": sched})
    tree = uckpt.load(tmp_path / "ck")
    for key, value in model.state_dict().items():
        assert isinstance(tree["model"][key], np.ndarray)
        assert np.array_equal(tree["model"][key], value.numpy())
    state = tree["optimizer"]["state"]
    assert sorted(state) == list(range(len(list(model.parameters()))))
    assert state[0]["step"].dtype == np.float32 and state[0]["step"].shape == ()
    assert tree["optimizer"]["param_groups"][0]["betas"] == opt.param_groups[0]["betas"]
    assert tree["optimizer"]["class"] == "torch.optim.adam.Adam"
    assert tree["scheduler"]["last_epoch"] == 1


def test_e2e_dtypes_leaves_and_generators(tmp_path):
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3)).to(torch.bfloat16)
    leaf = sample(torch.float16, (5, 6)).t()
    gen = torch.Generator().manual_seed(5)
    uckpt.save(tmp_path / "ck", {"model": model, "leaf": leaf, "gen": gen})
    expected = torch.rand(4, generator=gen)

    model2 = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3)).to(torch.bfloat16)
    leaf2, gen2 = torch.zeros(6, 5, dtype=torch.float16), torch.Generator()
    uckpt.load(tmp_path / "ck", {"model": model2, "leaf": leaf2, "gen": gen2})
    assert_same(model.state_dict(), model2.state_dict())
    assert torch.equal(leaf2, leaf)
    assert torch.equal(torch.rand(4, generator=gen2), expected)


def test_e2e_refusals_change_nothing(tmp_path):
    model, opt, _, _ = _setup(0)
    train_step(model, opt, batches(1)[0])
    uckpt.save(tmp_path / "ck", {"model": model, "optimizer": opt})

    other = Net(classes=5)
    before = {k: v.clone() for k, v in other.state_dict().items()}
    sgd = torch.optim.SGD(other.parameters(), lr=0.1)
    with pytest.raises(ShapeMismatchError, match=r"head.weight: shape \[3, 16\]"):
        uckpt.load(tmp_path / "ck", {"model": other, "optimizer": sgd})
    assert_same(before, dict(other.state_dict()))

    same = fresh_net(1)
    before = {k: v.clone() for k, v in same.state_dict().items()}
    with pytest.raises(StateMismatchError, match=r"Adam but the optimizer to restore is a .*SGD"):
        uckpt.load(tmp_path / "ck", {"model": same,
                                     "optimizer": torch.optim.SGD(same.parameters(), lr=0.1)})
    assert_same(before, dict(same.state_dict()))
