"""SIGKILL a Chainer training run between checkpoints, resume it in a new process, and
compare every loss after the restart with an uninterrupted run, bit for bit; then read
a Chainer checkpoint where Chainer cannot be imported."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import uckpt_chainer  # noqa: F401  (before chainer: the NumPy 2 shim)

pytest.importorskip("chainer")

SCRIPT = Path(__file__).resolve().parent / "chainer_train.py"
ITERS = 30
ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
           PYTHONWARNINGS="ignore")


def train(mode, root, log, *args, killed=False):
    proc = subprocess.run([sys.executable, str(SCRIPT), mode, str(root), str(log),
                           "--iters", str(ITERS), *map(str, args)],
                          capture_output=True, text=True, timeout=120, env=ENV)
    if killed:
        assert proc.returncode == -9, proc.stdout + proc.stderr
    else:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def losses(log):
    """{iteration: float32 bit pattern (hex)}; the killed run's lines and the resumed
    run's are in separate files."""
    out = {}
    for line in Path(log).read_text().splitlines():
        it, hexbits = line.split()
        out[int(it)] = hexbits
    return out


def said(stdout, key):
    return next(line.split()[-1] for line in stdout.splitlines() if line.startswith(key))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode,every,kill_at,restarts", [
    # own loop: a checkpoint every 4 iterations (sync), killed after 14: resumes from 12,
    # mid-epoch (5 iterations per epoch), so the order sampler's generator matters
    ("loop", 4, 14, {12}),
    # Trainer + uckpt.chainer.snapshot every epoch (5 iterations), async saves: resumes
    # from 10 (or 5, should the save of 10 not have been committed before the kill)
    ("trainer", 5, 14, {10, 5}),
])
def test_killed_run_resumes_bitwise(tmp_path, mode, every, kill_at, restarts):
    a_out = train(mode, tmp_path / "a", tmp_path / "a.log", "--every", every)
    train(mode, tmp_path / "b", tmp_path / "b.log", "--every", every, "--kill-at", kill_at,
          killed=True)
    c_out = train(mode, tmp_path / "b", tmp_path / "c.log", "--every", every)

    a, b, c = losses(tmp_path / "a.log"), losses(tmp_path / "b.log"), losses(tmp_path / "c.log")
    restart = int(said(c_out, "resumed from"))
    assert restart in restarts and restart % every == 0
    assert sorted(a) == list(range(1, ITERS + 1))
    assert sorted(b) == list(range(1, kill_at + 1))  # killed right after kill_at
    assert sorted(c) == list(range(restart + 1, ITERS + 1))
    assert {i: b[i] for i in b} == {i: a[i] for i in b}
    different = {i: (a[i], c[i]) for i in c if a[i] != c[i]}
    assert not different, f"losses differ after resuming from {restart}: {different}"
    assert said(c_out, "digest") == said(a_out, "digest")  # parameters and BN statistics

    if mode == "trainer":  # LogReport's log, restored and continued (elapsed time aside)
        def log_report(run):
            entries = json.loads((tmp_path / run / "out" / "log").read_text())
            return [{k: v for k, v in e.items() if k != "elapsed_time"} for e in entries]
        assert log_report("b") == log_report("a") and len(log_report("a")) == ITERS // 3


@pytest.mark.timeout(120)
def test_load_without_chainer_returns_numpy_arrays(tmp_path):
    train("trainer", tmp_path / "r", tmp_path / "r.log", "--every", 5)
    path = tmp_path / "r" / f"step_{ITERS:08d}"
    code = f"""
import json, sys
sys.modules["chainer"] = None  # import chainer now fails
import numpy as np, uckpt
try:
    import chainer
except ImportError:
    pass
else:
    raise SystemExit("chainer was importable")
tree = uckpt.load({str(path)!r})
up = tree["trainer"]["updater"]
w = up["model:main"]["predictor"]["conv"]["W"]
m = up["optimizer:main"]["predictor"]["conv"]["W"]["m"]
leaves = []
def walk(x):
    if isinstance(x, dict):
        for v in x.values():
            walk(v)
    else:
        leaves.append(type(x).__module__ + "." + type(x).__name__)
walk(tree)
print(json.dumps({{"w": [str(w.dtype), list(w.shape)], "m": [type(m).__name__, list(m.shape)],
                  "iteration": up["iteration"], "order": list(up["iterator:main"]["order"].shape),
                  "avg_mean": type(up["model:main"]["predictor"]["bn"]["avg_mean"]).__name__,
                  "types": sorted(set(leaves)), "chainer": sys.modules["chainer"] is None}}))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=ENV)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["w"] == ["float32", [4, 1, 3, 3]] and got["m"] == ["ndarray", [4, 1, 3, 3]]
    assert got["iteration"] == ITERS and got["order"] == [80] and got["chainer"]
    assert got["avg_mean"] == "ndarray"
    assert set(got["types"]) <= {"numpy.ndarray", "builtins.int", "builtins.float",
                                 "builtins.bool", "builtins.str", "builtins.NoneType",
                                 "numpy.float32", "numpy.float64", "numpy.int64"}, got["types"]
