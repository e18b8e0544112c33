"""PyTorch's own files restored through the adapters (issue 14): a ``torch.save`` training
file converted to uckpt restores into a live module, optimizer and scheduler, and the next
step is bit for bit torch's own resume; ``torch.compile``'s ``_orig_mod.`` prefix is mapped
both ways."""
import logging

import pytest
import torch

import uckpt
from uckpt.conversion import convert
from uckpt.errors import KeyMismatchError, StateMismatchError


def _parts(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
                                torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    return model, opt, sched


def _step(model, opt, sched, i):
    g = torch.Generator().manual_seed(100 + i)
    x, y = torch.randn(16, 6, generator=g), torch.randn(16, 2, generator=g)
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    sched.step()
    return loss.detach()


def _same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


@pytest.fixture
def training_file(tmp_path):
    torch.use_deterministic_algorithms(True)
    model, opt, sched = _parts()
    for i in range(3):
        _step(model, opt, sched, i)
    path = tmp_path / "train.pth"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                "scheduler": sched.state_dict(), "epoch": 3}, path)
    return path


def _torch_resume(path):
    model, opt, sched = _parts(seed=1)
    ck = torch.load(path, weights_only=True)
    model.load_state_dict(ck["model"])
    opt.load_state_dict(ck["optimizer"])
    sched.load_state_dict(ck["scheduler"])
    return model, opt, sched


@pytest.mark.parametrize("via", ["api", "cli"])
def test_torch_save_file_restores_through_adapters(tmp_path, training_file, via, caplog):
    """torch.save training file -> uckpt -> uckpt.load into module + optimizer + scheduler;
    one more step equals the same step after torch's own load_state_dict resume."""
    out = tmp_path / "ck"
    if via == "api":
        convert(training_file, out)
    else:
        import subprocess
        import sys

        r = subprocess.run([sys.executable, "-m", "uckpt.cli", "convert", str(training_file),
                            str(out)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    model, opt, sched = _parts(seed=1)
    with caplog.at_level(logging.INFO, logger="uckpt.torch"):
        loaded = uckpt.load(out, {"model": model, "optimizer": opt, "scheduler": sched,
                                  "epoch": None})
    assert loaded["epoch"] == 3
    assert "plain state_dict" in caplog.text
    ref = _torch_resume(training_file)
    _same(model.state_dict(), ref[0].state_dict())
    assert sched.state_dict() == ref[2].state_dict()
    assert opt.param_groups[0]["lr"] == ref[1].param_groups[0]["lr"]
    la, lb = _step(model, opt, sched, 3), _step(*ref, 3)
    assert torch.equal(la, lb)
    _same(model.state_dict(), ref[0].state_dict())
    for (a, b) in zip(opt.state.values(), ref[1].state.values()):
        _same(a, b)
    assert opt.state_dict()["param_groups"] == ref[1].state_dict()["param_groups"]


def test_plain_state_dict_of_another_kind_is_refused(tmp_path, training_file):
    """The optimizer handed the model's entry (a plain mapping of other keys): a specific
    error naming both key sets, nothing changed."""
    out = tmp_path / "ck"
    convert(training_file, out)
    model, opt, sched = _parts(seed=1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(StateMismatchError, match=r"expects uckpt's optimizer state or its own "
                       r"state_dict\(\) \(keys \['param_groups', 'state'\]\)"):
        uckpt.load(out, {"model": opt}, strict=False)
    with pytest.raises(StateMismatchError, match="learning-rate scheduler"):
        uckpt.load(out, {"optimizer": sched}, strict=False)
    _same(model.state_dict(), before)
    # the groups must still fit: one group of 8 parameters saved, here one of 1
    with pytest.raises(StateMismatchError, match="parameter group"):
        uckpt.load(out, {"optimizer": torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])},
                   strict=False)


def test_uckpt_optimizer_state_still_checks_its_class(tmp_path):
    model, opt, _ = _parts()
    uckpt.save(tmp_path / "ck", {"optimizer": opt})
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(StateMismatchError, match="AdamW"):
        uckpt.load(tmp_path / "ck", {"optimizer": sgd})


@pytest.mark.parametrize("saved_compiled", [True, False])
def test_compiled_prefix_both_ways(tmp_path, saved_compiled, caplog):
    """A checkpoint of torch.compile(model) (keys '_orig_mod.*') loads into the plain module,
    and the reverse, with a logged note; an ordinary key mismatch is still refused."""
    src, _, _ = _parts(seed=0)
    dst, _, _ = _parts(seed=1)
    saved = torch.compile(src) if saved_compiled else src
    target = dst if saved_compiled else torch.compile(dst)
    assert any(k.startswith("_orig_mod.") for k in
               (saved if saved_compiled else target).state_dict())
    uckpt.save(tmp_path / "ck", {"model": saved})
    with caplog.at_level(logging.INFO, logger="uckpt.torch"):
        uckpt.load(tmp_path / "ck", {"model": target})
    assert "_orig_mod." in caplog.text and "renamed" in caplog.text
    _same(dst.state_dict(), src.state_dict())
    # a state_dict saved through torch.save and converted: same mapping
    torch.save({"model": saved.state_dict()}, tmp_path / "sd.pt")
    convert(tmp_path / "sd.pt", tmp_path / "conv")
    fresh, _, _ = _parts(seed=2)
    uckpt.load(tmp_path / "conv", {"model": fresh if saved_compiled else torch.compile(fresh)})
    _same(fresh.state_dict(), src.state_dict())
    other = torch.nn.Sequential(torch.nn.Linear(6, 8))
    with pytest.raises(KeyMismatchError):
        uckpt.load(tmp_path / "ck", {"model": torch.compile(other)})
