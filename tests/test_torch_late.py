"""Late snapshots (uckpt.saving.late, uckpt.torch.LateSnapshot): parameters and optimizer state
copied after save returns, before the next optimizer step; checkpoints isolated from
later updates; buffers copied at save."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import uckpt
from uckpt.format import FORMAT_VERSION
import uckpt.torch
from uckpt.saving.late import DeferredCopy, Ranges


def _net(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.BatchNorm1d(512),
                                torch.nn.ReLU(), torch.nn.Linear(512, 8))
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    return model, opt


def _step(model, opt, x, y):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


def _expected(model, opt):
    return ({k: v.clone() for k, v in model.state_dict().items()},
            {k: {n: t.clone() for n, t in s.items()} for k, s in opt.state_dict()["state"].items()})


def _check(path, expected):
    model2, opt2 = _net(seed=1)
    _step(model2, opt2, torch.randn(4, 256), torch.randint(0, 8, (4,)))  # state exists
    uckpt.load(path, {"model": model2, "optimizer": opt2}, strict=False)
    exp_model, exp_opt = expected
    for k, v in model2.state_dict().items():
        assert torch.equal(v, exp_model[k]), k
    for k, s in opt2.state_dict()["state"].items():
        for n, t in s.items():
            assert torch.equal(t, exp_opt[k][n]), (k, n)


def test_every_step_saves_hold_the_state_at_save(tmp_path):
    """Each save's checkpoint is the state at save, though the copies of parameters and
    Adam's moments happen later and the next steps (BatchNorm statistics in forward,
    every parameter in the optimizer step) change everything in place."""
    model, opt = _net()
    x, y = torch.randn(64, 256), torch.randint(0, 8, (64,))
    _step(model, opt, x, y)
    expected = {}
    with uckpt.torch.LateSnapshot(opt) as late, \
            uckpt.CheckpointManager(tmp_path, async_save=True, max_inflight=2,
                                    late_snapshot=late) as mgr:
        for step in range(1, 6):
            mgr.save(step, {"model": model, "optimizer": opt, "step": step})
            expected[step] = _expected(model, opt)
            _step(model, opt, x * step, y)  # forward changes BN buffers; step changes the rest
        mgr.wait()
        state_bytes = sum(v.numel() * v.element_size() for v in model.state_dict().values()) \
            + sum(t.numel() * t.element_size() for st in opt.state.values() for t in st.values())
        # extra memory: at most max_inflight staging arenas of about the state's size
        assert 0 < mgr._saver.pool.held_bytes <= 2 * (state_bytes + (1 << 20))
    for step in range(1, 6):
        _check(mgr.path(step), expected[step])


def test_parameters_and_optimizer_state_are_deferred_buffers_are_not(tmp_path):
    """save() leaves exactly the parameters and the optimizer's state to the deferred copy
    (its bytes are theirs); BatchNorm buffers are copied at save; a step finishes the
    copy; flush() finishes it before a change outside the step."""
    model, opt = _net()
    x, y = torch.randn(16, 256), torch.randint(0, 8, (16,))
    _step(model, opt, x, y)
    guarded = sum(p.numel() * p.element_size() for p in model.parameters()) + sum(
        t.numel() * t.element_size() for s in opt.state.values() for t in s.values())
    late = uckpt.torch.LateSnapshot(opt)
    with uckpt.CheckpointManager(tmp_path, async_save=True, late_snapshot=late) as mgr:
        mgr.save(1, {"model": model, "optimizer": opt})
        assert [d.nbytes for d in late._pending] == [guarded]
        with torch.no_grad():
            model[1].running_mean.add_(5.0)        # a buffer: copied at save already
        _step(model, opt, x, y)                    # the pre-hook finishes the copy
        assert not late._pending
        weight = model[0].weight.detach().clone()
        mgr.save(2, {"model": model, "optimizer": opt})
        late.flush()                               # copy now ...
        with torch.no_grad():
            model[0].weight.add_(1.0)              # ... so this change outside a step is safe
        mgr.wait()
    late.close()
    one, two = uckpt.load(mgr.path(1)), uckpt.load(mgr.path(2))
    assert not np.array_equal(one["model"]["1.running_mean"], model[1].running_mean.numpy())
    assert np.array_equal(two["model"]["0.weight"], weight.numpy())


def test_late_snapshot_needs_async_and_optimizers(tmp_path):
    model, opt = _net()
    with pytest.raises(ValueError, match="async_save=True"):
        uckpt.CheckpointManager(tmp_path, late_snapshot=uckpt.torch.LateSnapshot(opt))
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        uckpt.torch.LateSnapshot(model)


def test_close_finishes_pending_copies_and_removes_the_hook(tmp_path):
    model, opt = _net()
    x, y = torch.randn(8, 256), torch.randint(0, 8, (8,))
    _step(model, opt, x, y)
    late = uckpt.torch.LateSnapshot(opt)
    with uckpt.CheckpointManager(tmp_path, async_save=True, late_snapshot=late) as mgr:
        mgr.save(1, {"model": model, "optimizer": opt})
        expected = _expected(model, opt)
    late.close()
    assert not late._hooks and not late._pending
    _step(model, opt, x, y)  # no hook left to call
    _check(mgr.path(1), expected)


def test_deferred_copy_pieces_and_errors():
    src = np.arange(5 << 20, dtype=np.float32)  # 20 MiB: three pieces
    dst = np.empty_like(src)
    d = DeferredCopy([(src, dst)])
    d.finish()
    assert d.done and np.array_equal(src, dst)
    bad = DeferredCopy([(np.zeros(3), np.empty(4))])
    with pytest.raises(ValueError):
        bad.finish()


def test_ranges():
    a = np.zeros(100, np.float64)
    base = a.__array_interface__["data"][0]
    r = Ranges([(base, base + 400), (base + 400, base + 800)])  # merged
    assert r.holds(a) and r.holds(a[10:20])
    assert not Ranges([(base, base + 799)]).holds(a)
    assert not r.holds(np.zeros(3)) and not r.holds(a[:0])


def test_late_incremental_compressed_saves_hold_the_state_at_save(tmp_path):
    """Every option of the manager together: late snapshots, incremental saves and
    compression. A frozen first layer is referred to, not written again; each checkpoint
    is the state at save though the copies and the hashing happen after save returns."""
    model, opt = _net()
    model[0].requires_grad_(False)  # a frozen backbone: never changes
    x, y = torch.randn(64, 256), torch.randint(0, 8, (64,))
    _step(model, opt, x, y)
    expected = {}
    with uckpt.torch.LateSnapshot(opt) as late, \
            uckpt.CheckpointManager(tmp_path, async_save=True, late_snapshot=late,
                                    incremental=True, full_every=3,
                                    save_options=uckpt.SaveOptions(
                                        incremental_chunk_bytes=64 << 10, compression="zstd",
                                        compression_level=1)) as mgr:
        for step in range(1, 5):
            mgr.save(step, {"model": model, "optimizer": opt, "step": step})
            expected[step] = _expected(model, opt)
            _step(model, opt, x * step, y)
    frozen = uckpt.manifest(mgr.path(2)).arrays["model/0.weight"].chunks
    assert frozen and all(c.base == "step_00000001" for c in frozen)
    assert [s for s in range(1, 5) if not uckpt.manifest(mgr.path(s)).bases] == [1, 4]
    for step in range(1, 5):
        assert uckpt.verify(mgr.path(step)).format_version == FORMAT_VERSION
        _check(mgr.path(step), expected[step])
