"""Acceptance: model + optimizer + scheduler + GradScaler + RNG through real files,
restored bitwise into fresh objects, and readable without torch."""
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

import uckpt
from test_torch_adapter import OPTIMIZERS, SCHEDULERS, assert_same, batches, fresh_net, train_step


def _objects(seed, opt_name):
    model = fresh_net(seed)
    opt = OPTIMIZERS[opt_name](model.parameters())
    sched = SCHEDULERS["steplr"](opt)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8, growth_interval=2)
    return model, opt, sched, scaler


@pytest.mark.parametrize("opt_name", ["sgd-momentum", "adam", "adamw"])
def test_full_state_restores_bitwise_into_fresh_objects(tmp_path, opt_name):
    data = batches(7, seed=3)
    model, opt, sched, scaler = _objects(0, opt_name)
    torch.manual_seed(42)
    for b in data[:4]:
        train_step(model, opt, b, sched, scaler)
    state = {"model": model, "optimizer": opt, "scheduler": sched, "scaler": scaler,
             "rng": uckpt.RandomState(), "step": 4}
    uckpt.save(tmp_path / "ck", state, step=4)
    expected = [train_step(model, opt, b, sched, scaler) for b in data[4:]]  # dropout uses RNG

    model2, opt2, sched2, scaler2 = _objects(1, opt_name)
    torch.manual_seed(999)  # the restore must bring the RNG back, not this seed
    fresh = {"model": model2, "optimizer": opt2, "scheduler": sched2, "scaler": scaler2,
             "rng": uckpt.RandomState(), "step": 0}
    uckpt.load(tmp_path / "ck", fresh)
    assert fresh["step"] == 4
    got = [train_step(model2, opt2, b, sched2, scaler2) for b in data[4:]]
    assert [x.item() for x in got] == [x.item() for x in expected]
    assert all(torch.equal(a, b) for a, b in zip(expected, got))
    assert_same(model.state_dict(), model2.state_dict())
    assert_same(opt.state_dict(), opt2.state_dict())
    assert_same(sched.state_dict(), sched2.state_dict())
    assert scaler.state_dict() == scaler2.state_dict()


def test_load_without_torch_gives_the_same_arrays(tmp_path):
    model, opt, sched, scaler = _objects(0, "adamw")
    train_step(model, opt, batches(1)[0], sched, scaler)
    uckpt.save(tmp_path / "ck", {"model": model, "optimizer": opt})
    expected = {k: v.numpy() for k, v in model.state_dict().items()}
    expected.update({f"opt/{i}/{k}": v.numpy() for i, s in opt.state_dict()["state"].items()
                     for k, v in s.items()})
    np.savez(tmp_path / "expected.npz", **expected)
    code = f"""
import sys, json
sys.modules["torch"] = None  # any attempt to import torch now fails
import numpy as np, uckpt
tree = uckpt.load({str(tmp_path / 'ck')!r})
exp = np.load({str(tmp_path / 'expected.npz')!r})
got = dict(tree["model"])
got.update({{f"opt/{{i}}/{{k}}": v for i, s in tree["optimizer"]["state"].items() for k, v in s.items()}})
same = sorted(exp.files) == sorted(got) and all(
    got[k].dtype == exp[k].dtype and got[k].tobytes() == exp[k].tobytes() for k in exp.files)
print(json.dumps({{"same": bool(same), "n": len(exp.files), "torch": "torch" in sys.modules and sys.modules["torch"] is not None}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"same": True, "n": len(expected), "torch": False}


def test_restore_into_running_optimizer_reads_in_place(tmp_path):
    model, opt, sched, scaler = _objects(0, "adam")
    train_step(model, opt, batches(1)[0])
    uckpt.save(tmp_path / "ck", {"model": model, "optimizer": opt})
    model2, opt2, _, _ = _objects(1, "adam")
    train_step(model2, opt2, batches(1, seed=5)[0])  # opt2 has state tensors already
    ptrs = {n: t.data_ptr() for s in opt2.state.values() for n, t in s.items() if t.dim()}
    params2 = {p.data_ptr() for p in model2.parameters()}
    uckpt.load(tmp_path / "ck", {"model": model2, "optimizer": opt2})
    assert {n: t.data_ptr() for s in opt2.state.values() for n, t in s.items() if t.dim()} == ptrs
    assert {p.data_ptr() for p in model2.parameters()} == params2
    assert_same(opt.state_dict(), opt2.state_dict())
    assert_same(model.state_dict(), model2.state_dict())
