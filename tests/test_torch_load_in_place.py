"""A load that reads every tensor in place restores the module and optimizer without
copying or wrapping them again, and still runs whatever customises loading.

``uckpt.load`` reads straight into the live tensors' memory. The module adapter then
skips ``load_state_dict`` (it would only copy each tensor onto itself) unless a hook,
a module's own ``_load_from_state_dict``/``set_extra_state``, an overridden
``load_state_dict`` or torch's swap-tensors mode could make it do more; the optimizer
adapter hands ``load_state_dict`` its live state tensors back.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import uckpt  # noqa: E402


def net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 6 * 6, 5))


def trained(seed: int = 0):
    model = net(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(seed)
    for _ in range(2):
        loss = model(torch.randn(2, 3, 8, 8, generator=g)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    return model, opt


@pytest.fixture
def calls(monkeypatch):
    """How often ``nn.Module.load_state_dict`` runs (torch's own, called through)."""
    count = []
    real = nn.Module.load_state_dict

    def counted(self, *a, **k):
        count.append(type(self).__name__)
        return real(self, *a, **k)

    monkeypatch.setattr(nn.Module, "load_state_dict", counted)
    return count


def saved(tmp_path, seed: int = 0):
    model, opt = trained(seed)
    path = tmp_path / "ck"
    uckpt.save(path, {"model": model, "optimizer": opt})
    return path, model, opt


def assert_same_state(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert sa[key].dtype == sb[key].dtype and torch.equal(sa[key], sb[key]), key


def test_in_place_load_skips_load_state_dict_and_keeps_the_tensors(tmp_path, calls):
    path, model, opt = saved(tmp_path)
    other, other_opt = trained(seed=1)
    before = {k: v for k, v in other.state_dict(keep_vars=True).items()}
    moments = {id(p): other_opt.state[p]["momentum_buffer"] for p in other.parameters()}
    other_opt.param_groups[0]["lr"] = 0.5
    uckpt.load(path, {"model": other, "optimizer": other_opt})
    assert calls == []  # every tensor was read in place: nothing left to copy
    after = other.state_dict(keep_vars=True)
    assert all(after[k] is before[k] for k in before)  # the same Parameter/buffer objects
    assert_same_state(model, other)
    assert other_opt.param_groups[0]["lr"] == 0.1  # hyperparameters still restored
    for p, q in zip(model.parameters(), other.parameters()):
        live = other_opt.state[q]["momentum_buffer"]
        assert live is moments[id(q)]  # the optimizer keeps its own (refilled) tensors
        assert torch.equal(live, opt.state[p]["momentum_buffer"])


def test_load_hooks_still_run(tmp_path, calls):
    path, model, _ = saved(tmp_path)
    other = net(1)
    seen = []
    other[1].register_load_state_dict_post_hook(lambda module, keys: seen.append("post"))
    other[4]._register_load_state_dict_pre_hook(lambda *a: seen.append("pre"))
    uckpt.load(path, {"model": other}, strict=False)
    assert calls == ["Sequential"] and sorted(seen) == ["post", "pre"]
    assert_same_state(model, other)


class OwnLoading(nn.Linear):
    """A module with its own ``_load_from_state_dict``: scales its weight as it loads."""

    def _load_from_state_dict(self, state_dict, prefix, *args):
        super()._load_from_state_dict(state_dict, prefix, *args)
        with torch.no_grad():
            self.weight.mul_(2)


def test_own_load_from_state_dict_still_runs(tmp_path, calls):
    torch.manual_seed(0)
    model = nn.Sequential(OwnLoading(3, 2))
    uckpt.save(tmp_path / "ck", {"model": model})
    other = nn.Sequential(OwnLoading(3, 2))
    uckpt.load(tmp_path / "ck", {"model": other})
    assert calls == ["Sequential"]
    assert torch.equal(other[0].weight, model[0].weight * 2)
    assert torch.equal(other[0].bias, model[0].bias)


class OwnLoadStateDict(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.loaded = 0

    def load_state_dict(self, state_dict, strict=True, assign=False):
        self.loaded += 1
        return super().load_state_dict(state_dict, strict=strict, assign=assign)


def test_overridden_load_state_dict_still_runs(tmp_path):
    model, other = OwnLoadStateDict(), OwnLoadStateDict()
    uckpt.save(tmp_path / "ck", {"model": model})
    uckpt.load(tmp_path / "ck", {"model": other})
    assert other.loaded == 1
    assert torch.equal(other.lin.weight, model.lin.weight)


def test_swap_tensors_mode_goes_through_load_state_dict(tmp_path, calls):
    path, model, _ = saved(tmp_path)
    other = net(1)
    old = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        uckpt.load(path, {"model": other}, strict=False)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(old)
    assert calls == ["Sequential"]
    assert_same_state(model, other)


def test_not_in_place_is_copied_by_load_state_dict(tmp_path, calls):
    """A parameter that cannot be read into (not contiguous) is copied by torch."""
    path, model, _ = saved(tmp_path)
    other = net(1)
    w = other[4].weight
    other[4].weight = nn.Parameter(torch.zeros(w.shape[1], w.shape[0]).t())
    assert not other[4].weight.is_contiguous()
    uckpt.load(path, {"model": other}, strict=False)
    assert calls == ["Sequential"]
    assert_same_state(model, other)
