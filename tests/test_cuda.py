"""CUDA snapshot path: pinned staging, side-stream copies (runs only where CUDA exists)."""
import numpy as np
import pytest
import torch

import uckpt
from uckpt.adapter import DeviceArray

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(),
                               torch.nn.Linear(512, 10)).cuda()


@cuda
def test_extract_gives_device_arrays():
    from uckpt_torch.module import ModuleAdapter

    tree = ModuleAdapter().extract(_model())
    assert all(isinstance(v, DeviceArray) for v in tree.values())


@cuda
def test_async_snapshot_is_consistent_while_training_continues(tmp_path):
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    x = torch.randn(256, 512, device="cuda")
    y = torch.randint(0, 10, (256,), device="cuda")

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    step()
    expected = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    mgr = uckpt.CheckpointManager(tmp_path, async_save=True)
    mgr.save(1, {"model": model, "optimizer": opt})
    for _ in range(5):
        step()  # queued right behind the side-stream copies
    mgr.close()
    arena = mgr._saver.pool._free[0]
    assert arena.pinned
    out = uckpt.load(mgr.path(1))
    for k, v in expected.items():
        np.testing.assert_array_equal(out["model"][k], v.numpy())
    model2 = _model()
    opt2 = torch.optim.Adam(model2.parameters(), lr=0.1)
    uckpt.load(mgr.path(1), {"model": model2, "optimizer": opt2})
    for k, v in model2.state_dict().items():
        assert torch.equal(v.cpu(), expected[k])


@cuda
def test_sync_save_of_cuda_bfloat16(tmp_path):
    t = torch.randn(64, 64, device="cuda").to(torch.bfloat16)
    uckpt.save(tmp_path / "c", {"t": t})
    back = torch.zeros_like(t)
    uckpt.load(tmp_path / "c", {"t": back})
    assert torch.equal(back, t)
