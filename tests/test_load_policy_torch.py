"""Issue 29's dtype policy and ``strict=False`` report with real PyTorch modules and
optimizers: float32 master weights into a bfloat16 model and back, refused without
``cast=``; a model that gained or lost layers loaded partly, with its keys reported."""
import pytest
import torch
from torch import nn

import uckpt
from uckpt.errors import DtypeMismatchError, KeyMismatchError, ShapeMismatchError


def _model(*extra):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 6), nn.BatchNorm1d(6), *extra)


def _saved(tmp_path, model):
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    return uckpt.save(tmp_path / "ck", {"model": model, "optim": opt})


def test_float32_into_bfloat16_is_refused_without_cast(tmp_path):
    path = _saved(tmp_path, _model())
    half = _model().to(torch.bfloat16)
    before = {k: v.clone() for k, v in half.state_dict().items()}
    with pytest.raises(DtypeMismatchError) as e:
        uckpt.load(path, {"model": half}, strict=False)
    msg = str(e.value)
    assert "'model'" in msg and "0.weight: dtype float32 in the checkpoint, bfloat16 in " \
                                "the object" in msg
    assert "cast={'model/" in msg
    assert all(torch.equal(v, before[k]) for k, v in half.state_dict().items())


def test_float32_master_weights_into_a_bfloat16_model_in_place(tmp_path):
    full = _model()
    path = _saved(tmp_path, full)
    half = _model().to(torch.bfloat16)
    ptrs = {k: v.data_ptr() for k, v in half.state_dict().items()}
    report = uckpt.LoadReport()
    uckpt.load(path, {"model": half}, strict=False, report=report,
               cast={"model/*": "bfloat16"})
    assert report.unexpected_keys == ["optim"] and report.missing_keys == []
    for k, v in half.state_dict().items():
        assert torch.equal(v, full.state_dict()[k].to(v.dtype)), k
        assert v.data_ptr() == ptrs[k], k  # converted into the parameters' own memory


def test_a_bfloat16_checkpoint_into_a_float32_model_with_a_safe_rule(tmp_path):
    half = _model().to(torch.bfloat16)
    path = uckpt.save(tmp_path / "ck", {"model": half, "t": torch.ones(3, dtype=torch.bfloat16)})
    full, t = _model(nn.Identity()), torch.zeros(3)
    with torch.no_grad():
        for p in full.parameters():
            p.zero_()
    uckpt.load(path, {"model": full, "t": t}, cast="safe")
    assert full[0].weight.dtype == torch.float32
    for k, v in full.state_dict().items():
        assert torch.equal(v, half.state_dict()[k].to(v.dtype)), k
    assert torch.equal(t, torch.ones(3))


def test_manager_restores_float32_into_bfloat16_with_cast(tmp_path):
    full = _model()
    manager = uckpt.CheckpointManager(tmp_path / "root")
    manager.save(3, {"model": full})
    manager.wait()
    half = _model().to(torch.bfloat16)
    with pytest.raises(DtypeMismatchError, match="cast="):
        manager.restore({"model": half})
    assert manager.restore({"model": half}, cast={"model/*": "bfloat16"}) == 3
    assert torch.equal(half[0].weight, full[0].weight.to(torch.bfloat16))
    manager.close()


def test_strict_false_loads_the_shared_parameters_and_reports_the_rest(tmp_path):
    """A model with a new head (missing from the checkpoint) and without a layer the
    checkpoint holds (unexpected): the shared entries load, the head keeps its values,
    the optimizer the state leaves out is reported."""
    old = _model(nn.ReLU(), nn.Linear(6, 2))
    path = _saved(tmp_path, old)
    new = _model(nn.ReLU(), nn.Identity(), nn.Linear(6, 3))
    with torch.no_grad():
        for p in new.parameters():
            p.fill_(0.5)
    head = new[4].weight.clone()
    report = uckpt.LoadReport()
    uckpt.load(path, {"model": new}, strict=False, report=report)
    assert report.missing_keys == ["model/4.bias", "model/4.weight"]
    assert report.unexpected_keys == ["model/3.bias", "model/3.weight", "optim"]
    assert torch.equal(new[0].weight, old[0].weight)
    assert torch.equal(new[1].running_mean, old[1].running_mean)
    assert torch.equal(new[4].weight, head)
    with pytest.raises(KeyMismatchError) as e:
        uckpt.load(path, {"model": new, "optim": torch.optim.Adam(new.parameters())})
    assert e.value.missing == ["4.bias", "4.weight"]
    assert e.value.unexpected == ["3.bias", "3.weight"]


def test_strict_false_still_refuses_a_shape_mismatch(tmp_path):
    path = _saved(tmp_path, _model())
    wider = nn.Sequential(nn.Linear(8, 7), nn.BatchNorm1d(7))
    with pytest.raises(ShapeMismatchError, match=r"0.weight: shape \[6, 8\] in the checkpoint"):
        uckpt.load(path, {"model": wider}, strict=False)


def test_optimizer_state_is_not_narrowed_to_its_parameters_dtype_without_cast(tmp_path):
    """torch's load_state_dict casts a floating parameter's state to its dtype: a float32
    Adam state into a bfloat16 model's optimizer is a narrowing, refused unless cast=
    names it; 'step' is never cast (torch keeps it as saved)."""
    full = _model()
    path = _saved(tmp_path, full)
    ref = torch.optim.Adam(full.parameters())
    uckpt.load(path, {"optim": ref}, strict=False)
    half = _model().to(torch.bfloat16)
    opt = torch.optim.Adam(half.parameters())
    with pytest.raises(DtypeMismatchError) as e:
        uckpt.load(path, {"model": half, "optim": opt}, cast={"model/*": "bfloat16"})
    assert "'optim'" in str(e.value)
    assert "state/0/exp_avg: dtype float32 in the checkpoint, bfloat16 in its parameter" \
        in str(e.value)
    assert "cast={'optim/state/*': 'bfloat16'}" in str(e.value)
    assert not opt.state
    uckpt.load(path, {"model": half, "optim": opt}, cast={"*": "bfloat16"})
    got, want = opt.state_dict()["state"][0], ref.state_dict()["state"][0]
    assert got["exp_avg"].dtype == torch.bfloat16
    assert torch.equal(got["exp_avg"], want["exp_avg"].to(torch.bfloat16))
    assert got["step"].dtype == torch.float32 and torch.equal(got["step"], want["step"])
