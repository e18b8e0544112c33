"""The bitwise restart proof for PyTorch: SIGKILL a training run between checkpoints,
resume it from its last checkpoint, and get the float32 loss of every step after the
restart bit for bit as in a run never interrupted.

The run (tests/torch_restart_train.py) is a small CNN with BatchNorm and dropout,
Adam and StepLR, on shuffled mini-batches from a DataLoader over a ResumableSampler,
with per-sample noise drawn from torch's global RNG: each step depends on the
parameters, the optimizer moments, the schedule, the global RNG and the data order.

Its four runs are children forked from a fork server (tests/fork_server.py) that has
imported torch, not fresh interpreters (the import was most of each run's CPU time); the
torch demo of tests/test_demo.py resumes in fresh interpreters.
"""
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from fork_server import reap

TRAIN = Path(__file__).resolve().parent / "torch_restart_train.py"
STEPS, EVERY, KILL_AFTER = 26, 5, 17     # 10 batches an epoch: restored at 15, mid-epoch 1,
#                                          the resumed steps 16-26 cross into epoch 2


@pytest.fixture(scope="module")
def forks():
    """A fork server that has imported torch and uckpt.torch (torch_restart_train.py's
    imports)."""
    from fork_server import ForkServer

    server = ForkServer.start(preload=("numpy", "torch", "torch.nn.functional",
                                       "torch.utils.data", "uckpt", "uckpt.torch", "runpy"))
    yield server
    server.stop()


def train(forks, root, log, *extra, timeout=60):
    """``python torch_restart_train.py root log ...`` (forked) to its end: its stdout."""
    argv = [TRAIN, root, log, "--steps", STEPS, "--every", EVERY, *extra]
    with tempfile.TemporaryFile("w+") as err:
        proc = forks.popen(argv, stdout=subprocess.PIPE, stderr=err)
        try:
            out, _ = proc.communicate(timeout=timeout)
        finally:
            reap(proc)
        err.seek(0)
        assert proc.returncode == 0, out + err.read()
    return out


def train_and_kill(forks, root, log):
    argv = [TRAIN, root, log, "--steps", STEPS, "--every", EVERY, "--pause-after", KILL_AFTER]
    with tempfile.TemporaryFile("w+") as err:
        proc = forks.popen(argv, stdout=subprocess.PIPE, stderr=err)
        try:
            for line in proc.stdout:
                if line.startswith(f"paused after step {KILL_AFTER}"):
                    proc.send_signal(signal.SIGKILL)
                    break
            proc.wait(timeout=60)
        finally:
            reap(proc)
            proc.stdout.close()
        err.seek(0)
        assert proc.returncode == -signal.SIGKILL, err.read()


def losses(log):
    """{step: float32 bit pattern}; a later line for a step wins."""
    out = {}
    for line in Path(log).read_text().splitlines():
        step, bits = line.split()
        out[int(step)] = bits
    return out


def restored_step(stdout):
    return int(stdout.split("restored ", 1)[1].split()[0])


def final_digest(stdout):
    return stdout.split(" params ", 1)[1].split()[0]


@pytest.mark.timeout(120)
def test_sigkilled_run_resumes_bitwise_identical(tmp_path, forks):
    out_a = train(forks, tmp_path / "a", tmp_path / "a.log")
    a = losses(tmp_path / "a.log")
    assert sorted(a) == list(range(1, STEPS + 1))

    train_and_kill(forks, tmp_path / "bc", tmp_path / "b.log")
    b = losses(tmp_path / "b.log")
    assert sorted(b) == list(range(1, KILL_AFTER + 1))
    assert b == {s: a[s] for s in b}               # the same run up to the kill
    shutil.copytree(tmp_path / "bc", tmp_path / "control")

    out_c = train(forks, tmp_path / "bc", tmp_path / "c.log")
    restart = restored_step(out_c)
    assert restart == KILL_AFTER // EVERY * EVERY  # the last checkpoint before the kill
    c = losses(tmp_path / "c.log")
    assert sorted(c) == list(range(restart + 1, STEPS + 1))
    assert c == {s: a[s] for s in c}               # every step after the restart, bit for bit
    assert final_digest(out_c) == final_digest(out_a)

    # Control: the same resume without the sampler's state restarts the data order, and
    # the losses part ways at once, so the comparison above can fail.
    out_x = train(forks, tmp_path / "control", tmp_path / "x.log", "--forget-sampler")
    assert restored_step(out_x) == restart
    x = losses(tmp_path / "x.log")
    assert x[restart + 1] != a[restart + 1]
