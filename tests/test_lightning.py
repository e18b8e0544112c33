"""uckpt.lightning.CheckpointIO under a real lightning.Trainer (issue 14): a run SIGKILLed mid-run
and resumed from its last checkpoint with ckpt_path= ends bit for bit where an uninterrupted run
ends (weights, optimizer state, learning rate, global step), with blocking saves, the plugin's
own asynchronous saves and Lightning's AsyncCheckpointIO."""
import json
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

import uckpt

# one pytest-xdist worker runs the whole module: its module-scoped launch ran once per
# worker otherwise (see docs/testing.md)
pytestmark = pytest.mark.xdist_group("lightning")

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def forks():
    """A fork server (tests/fork_server.py) that has imported torch and Lightning: each run
    of lightning_train.py is a child forked from it, not a fresh interpreter importing them
    again (most of a run's CPU time; nine runs in this module)."""
    from fork_server import ForkServer

    server = ForkServer.start(preload=("numpy", "torch", "lightning", "lightning.pytorch",
                                       "uckpt", "uckpt.lightning", "runpy"))
    yield server
    server.stop()


def _run(forks, root: Path, mode: str, *args: str) -> subprocess.CompletedProcess:
    """``python lightning_train.py root mode args...`` (forked); its stdout and stderr
    together in ``.stderr``."""
    root.mkdir(exist_ok=True)
    argv = [str(HERE / "lightning_train.py"), str(root), mode, *args]
    with tempfile.TemporaryFile("w+") as out:
        proc = forks.popen(argv, stdout=out, stderr=out)
        try:
            returncode = proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        out.seek(0)
        return subprocess.CompletedProcess(argv, returncode, None, out.read())


def _final(root: Path) -> dict:
    with np.load(root / "final.npz") as f:
        return {k: f[k] for k in f.files}


def _losses(root: Path) -> dict:
    return json.loads((root / "losses.json").read_text())


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory, forks):
    root = tmp_path_factory.mktemp("lightning-ref")
    r = _run(forks, root, "sync")
    assert r.returncode == 0, r.stderr[-3000:]
    return root


@pytest.fixture(scope="module")
def reference(reference_run):
    return _final(reference_run)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async", "lightning-async"])
def test_killed_trainer_resumes_bit_for_bit(tmp_path, forks, reference, mode):
    root = tmp_path / "run"
    killed = _run(forks, root, mode, "--kill-at", "10")  # mid-epoch 2 (4 steps an epoch)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert not (root / "final.npz").exists()
    last = root / "last.ckpt"
    step = uckpt.manifest(last).step  # committed whole, whatever the kill interrupted
    assert step in (4, 8)
    uckpt.verify(last)
    resumed = _run(forks, root, mode, "--resume", str(last))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    got = _final(root)
    assert got.keys() == reference.keys()
    for k in reference:
        assert got[k].dtype == reference[k].dtype and np.array_equal(got[k], reference[k]), k
    assert int(got["global_step"]) == 16


@pytest.mark.slow
def test_native_ckpt_converted_resumes_through_the_plugin(tmp_path, forks, reference_run,
                                                          reference):
    """Lightning's own .ckpt (a torch.save file, written without the plugin) after 2 of 4
    epochs, converted by `uckpt convert`, resumes through the plugin (its arrays given back
    as tensors: state_dict, optimizer state): the next losses and the final state are
    bitwise the uninterrupted run's."""
    from uckpt.conversion import convert

    first = _run(forks, tmp_path / "native", "native", "--epochs", "2")
    assert first.returncode == 0, first.stderr[-3000:]
    ckpt = tmp_path / "native" / "last.ckpt"
    assert ckpt.is_file()  # torch.save's file, not a uckpt checkpoint
    convert(ckpt, tmp_path / "converted")
    resumed = _run(forks, tmp_path / "resumed", "sync", "--resume", str(tmp_path / "converted"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    want, got = _losses(reference_run), _losses(tmp_path / "resumed")
    assert sorted(got, key=int) == [str(step) for step in range(8, 16)]
    assert {step: want[step] for step in got} == got
    final = _final(tmp_path / "resumed")
    assert final.keys() == reference.keys()
    for k in reference:
        assert final[k].dtype == reference[k].dtype and np.array_equal(final[k], reference[k]), k


def test_arrays_of_a_tree_without_tensor_marks_load_as_tensors(tmp_path):
    """A Lightning tree saved by another writer (plain arrays, no torch.tensor marks) loads
    with tensors where torch expects them: the state dict, an RNG state as a ByteTensor
    (torch.set_rng_state refused the NumPy array); NumPy scalars and plain values stay."""
    import torch

    import uckpt.lightning

    rng = torch.get_rng_state().numpy()
    uckpt.save(tmp_path / "c", {"state_dict": {"w": np.arange(4, dtype=np.float32)},
                                "rng": rng, "epoch": 1, "score": np.float32(0.5)})
    back = uckpt.lightning.CheckpointIO().load_checkpoint(tmp_path / "c")
    torch.manual_seed(123)
    torch.set_rng_state(back["rng"])
    assert torch.equal(torch.get_rng_state(), torch.from_numpy(rng))
    assert torch.equal(back["state_dict"]["w"], torch.arange(4, dtype=torch.float32))
    assert back["epoch"] == 1 and type(back["score"]) is np.float32


def test_checkpoint_dict_round_trip(tmp_path):
    """What Lightning hands the plugin comes back with the same types: tensors (dtype, values),
    ints, floats, strings, None, tuples, nested dicts; AttributeDict as a plain dict."""
    import torch
    from lightning.fabric.utilities.data import AttributeDict

    import uckpt.lightning

    ck = {"state_dict": {"a.weight": torch.randn(3, 2), "b": torch.arange(4),
                         "h": torch.randn(2).to(torch.bfloat16)},
          "epoch": 3, "global_step": 7, "lr": 0.5, "name": "x", "none": None,
          "betas": (0.9, 0.99), "hyper_parameters": AttributeDict(width=8),
          "optimizer_states": [{"state": {0: {"step": torch.tensor(3.0)}},
                                "param_groups": [{"params": [0], "lr": 0.1}]}]}
    io = uckpt.lightning.CheckpointIO()
    io.save_checkpoint(ck, tmp_path / "a.ckpt")
    back = io.load_checkpoint(tmp_path / "a.ckpt")
    assert uckpt.manifest(tmp_path / "a.ckpt").step == 7
    for k, v in ck["state_dict"].items():
        assert isinstance(back["state_dict"][k], torch.Tensor)
        assert back["state_dict"][k].dtype == v.dtype and torch.equal(back["state_dict"][k], v)
    assert back["optimizer_states"][0]["state"][0]["step"].dtype == torch.float32
    assert back["betas"] == (0.9, 0.99) and back["none"] is None and back["lr"] == 0.5
    assert back["hyper_parameters"] == {"width": 8}
    # saving again at the same path (Lightning's last.ckpt) replaces it
    io.save_checkpoint({**ck, "global_step": 9}, tmp_path / "a.ckpt")
    assert io.load_checkpoint(tmp_path / "a.ckpt", map_location="cpu")["global_step"] == 9
    io.remove_checkpoint(tmp_path / "a.ckpt")
    assert not (tmp_path / "a.ckpt").exists()
    io.remove_checkpoint(tmp_path / "a.ckpt")  # already gone: nothing to do


def test_async_saves_wait_and_refusals(tmp_path):
    import torch

    import uckpt.lightning
    from uckpt.errors import NotACheckpointError, UnsupportedObjectError

    io = uckpt.lightning.CheckpointIO(blocking=False)
    w = torch.randn(64, 64)
    before = w.clone()
    io.save_checkpoint({"state_dict": {"w": w}, "global_step": 1}, tmp_path / "s1.ckpt")
    w.add_(1)  # after the call: not in the checkpoint (the save took a snapshot)
    io.save_checkpoint({"state_dict": {"w": w}, "global_step": 2}, tmp_path / "s2.ckpt")
    io.remove_checkpoint(tmp_path / "s2.ckpt")  # waits for that save, then removes it
    assert not (tmp_path / "s2.ckpt").exists()
    io.teardown()
    assert torch.equal(io.load_checkpoint(tmp_path / "s1.ckpt")["state_dict"]["w"], before)
    with pytest.raises(UnsupportedObjectError):
        io.save_checkpoint({"obj": object()}, tmp_path / "bad.ckpt")
    assert not (tmp_path / "bad.ckpt").exists()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x").write_text("keep")
    with pytest.raises(NotACheckpointError, match="not removed"):
        io.remove_checkpoint(tmp_path / "other")
    assert (tmp_path / "other" / "x").read_text() == "keep"


def test_save_options_lay_out_the_checkpoints(tmp_path):
    import torch

    import uckpt.lightning

    io = uckpt.lightning.CheckpointIO(save_options=uckpt.SaveOptions(
        chunk_bytes=1024, alignment=8192, compression="zstd"))
    io.save_checkpoint({"state_dict": {"w": torch.zeros(64, 64), "b": torch.ones(3)},
                        "global_step": 1}, tmp_path / "a.ckpt")
    m = uckpt.manifest(tmp_path / "a.ckpt")
    w, b = m.arrays["state_dict/w"].chunks, m.arrays["state_dict/b"].chunks
    assert len(w) == 16 and {c.codec for c in w} == {("bytegroup", "zstd")}
    assert b[0].offset % 8192 == 0 and b[0].offset > 0


def test_import_uckpt_does_not_import_lightning():
    code = "import sys, uckpt; assert 'lightning' not in sys.modules and 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
