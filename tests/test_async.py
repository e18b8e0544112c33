"""Asynchronous saves: snapshot consistency, bounded staging, errors never lost."""
import subprocess
import sys
import threading
import traceback

import numpy as np
import pytest
import torch

import uckpt
from conftest import mount_tmpfs
from uckpt import errors
from uckpt.saving.engine import AsyncSaver
from uckpt.tree.flatten import flatten


def test_in_place_mutation_after_save_does_not_leak(tmp_path):
    w = np.zeros((256, 256), np.float32)
    mgr = uckpt.CheckpointManager(tmp_path, async_save=True, max_inflight=2)
    handles = []
    for step in range(1, 6):
        w[...] = step
        handles.append(mgr.save(step, {"w": w, "step": step}))
        w[...] = -1  # training mutates the tensor right after save() returns
    mgr.close()
    assert all(h.done() for h in handles)
    for step in range(1, 6):
        out = uckpt.load(mgr.path(step))
        assert out["step"] == step and (out["w"] == step).all()


def test_torch_training_step_right_after_async_save(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 64), torch.randint(0, 4, (32,))

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    step()
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    expected_opt = {k: {n: t.clone() for n, t in s.items()} for k, s in opt.state_dict()["state"].items()}
    handle = uckpt.save(tmp_path / "ck", {"model": model, "optimizer": opt}, blocking=False)
    for _ in range(3):
        step()  # in-place parameter and optimizer-state updates while the write runs
    handle.wait()
    model2 = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt2 = torch.optim.Adam(model2.parameters(), lr=0.1)
    uckpt.load(tmp_path / "ck", {"model": model2, "optimizer": opt2})
    for k, v in model2.state_dict().items():
        assert torch.equal(v, expected[k]), k
    for k, s in opt2.state_dict()["state"].items():
        for n, t in s.items():
            assert torch.equal(t, expected_opt[k][n]), (k, n)


def test_handle_api(tmp_path):
    h = uckpt.save(tmp_path / "c", {"a": np.arange(10)}, blocking=False)
    assert h.wait() == (tmp_path / "c").absolute() and h.done() and h.result() == h.wait()
    assert h.exception() is None and "done" in repr(h)
    with pytest.raises(errors.CheckpointExistsError):  # input errors raise at once
        uckpt.save(tmp_path / "c", {"a": np.arange(10)}, blocking=False)
    with pytest.raises(errors.UnsupportedObjectError):
        uckpt.save(tmp_path / "d", {"a": object()}, blocking=False)


def test_staging_is_reused_and_bounded(tmp_path):
    saver = AsyncSaver(max_inflight=2)
    state = {"a": np.ones(300_000, np.float32), "b": np.ones((100, 100))}
    arenas = set()
    for i in range(20):
        h = saver.submit(flatten(state), lambda s: sum(a.nbytes for a in s.flat.arrays.values()),
                         f"job {i}")
        assert h.wait() == 1_280_000
        arenas.update(id(a) for a in saver.pool._free)
    assert len(saver.pool._free) <= 2 and len(arenas) <= 2
    assert saver.pool.held_bytes <= 2 * (1_280_000 + 2 * 64)


def test_max_inflight_blocks_the_next_snapshot():
    saver = AsyncSaver(max_inflight=1)
    release = threading.Event()
    first = saver.submit(flatten({"a": np.ones(10)}), lambda f: release.wait(30), "blocked job")
    returned = threading.Event()

    def second():
        saver.submit(flatten({"a": np.ones(10)}), lambda f: None, "second job").wait()
        returned.set()

    t = threading.Thread(target=second)
    t.start()
    assert not returned.wait(0.5), "the second snapshot must wait for a free staging slot"
    release.set()
    assert first.wait() is True
    t.join(30)
    assert returned.is_set()


@pytest.fixture
def tiny_fs(tmp_path):
    yield from mount_tmpfs(tmp_path / "tiny", "2m")


def test_background_failure_raised_on_next_save_and_previous_restores(tiny_fs):
    mgr = uckpt.CheckpointManager(tiny_fs / "ck", async_save=True)
    mgr.save(1, {"w": np.full(1000, 1.0)})
    mgr.wait()
    h = mgr.save(2, {"w": np.full(1_000_000, 2.0)})  # 8 MB into a 2 MB file system
    assert isinstance(h.exception(30), errors.StorageFullError)
    with pytest.raises(errors.StorageFullError) as ei:
        mgr.save(3, {"w": np.full(1000, 3.0)})
    text = "".join(traceback.format_exception(ei.value))
    assert "write_data_file" in text and "background save of step 2" in text  # original traceback
    w = np.zeros(1000)
    assert mgr.restore({"w": w}) == 1 and (w == 1).all()
    mgr.close()


def test_background_failure_raised_by_wait_and_close(tiny_fs):
    mgr = uckpt.CheckpointManager(tiny_fs / "ck", async_save=True)
    mgr.save(1, {"w": np.full(1_000_000, 1.0)})
    with pytest.raises(errors.StorageFullError):
        mgr.wait()
    mgr.save(2, {"w": np.full(1_000_000, 2.0)})
    with pytest.raises(errors.StorageFullError):
        mgr.close()


def test_read_only_tier_error_surfaces(tiny_fs):
    mgr = uckpt.CheckpointManager(tiny_fs / "ck", async_save=True)
    mgr.save(1, {"w": np.arange(10)})
    mgr.wait()
    subprocess.run(["mount", "-o", "remount,ro", str(tiny_fs)], check=True)
    try:
        with pytest.raises(OSError):  # at save (its temporary directory) or at wait
            mgr.save(2, {"w": np.arange(10)})
            mgr.wait()
        out = np.zeros(10, np.int64)
        assert mgr.restore({"w": out}) == 1 and out.tolist() == list(range(10))
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(tiny_fs)], check=True)


def test_normal_exit_finishes_in_flight_save(tmp_path):
    code = f"""
import numpy as np, uckpt
mgr = uckpt.CheckpointManager({str(tmp_path)!r}, async_save=True)
mgr.save(7, {{"w": np.full((2048, 1024), 7.0)}})
print("returned", flush=True)
# no wait(), no close(): the interpreter exits with the write still running
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "returned" in out.stdout
    assert uckpt.CheckpointManager(tmp_path).steps() == [7]
    uckpt.verify(tmp_path / "step_00000007")


def test_unreported_background_failure_is_printed_at_exit(tiny_fs):
    code = f"""
import numpy as np, uckpt
mgr = uckpt.CheckpointManager({str(tiny_fs / 'ck')!r}, async_save=True)
mgr.save(1, {{"w": np.ones(1_000_000)}})
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "background save failed and was never reported" in out.stderr
    assert "StorageFullError" in out.stderr


def test_functional_async_error_is_raised_by_the_next_save(tiny_fs):
    h = uckpt.save(tiny_fs / "big", {"w": np.ones(1_000_000)}, blocking=False)
    while not h.done():
        threading.Event().wait(0.01)
    with pytest.raises(errors.StorageFullError):  # nobody called h.wait(): the next save says it
        uckpt.save(tiny_fs / "small", {"w": np.ones(10)})
    uckpt.save(tiny_fs / "small", {"w": np.ones(10)})  # reported once, not again
    assert (uckpt.load(tiny_fs / "small")["w"] == 1).all()
    h2 = uckpt.save(tiny_fs / "big2", {"w": np.ones(1_000_000)}, blocking=False)
    with pytest.raises(errors.StorageFullError):
        h2.wait()  # seen here ...
    uckpt.save(tiny_fs / "small2", {"w": np.ones(10)})  # ... so not raised again


def test_functional_async_error_nobody_saw_is_printed_at_exit(tiny_fs):
    code = f"""
import numpy as np, uckpt
uckpt.save({str(tiny_fs / 'big')!r}, {{"w": np.ones(1_000_000)}}, blocking=False)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "background save failed and was never reported" in out.stderr
    assert "StorageFullError" in out.stderr
