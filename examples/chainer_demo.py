"""The Chainer part of resume_demo.py: kill a Chainer run with SIGKILL, resume it,
compare bit for bit.

    python examples/resume_demo.py --framework chainer

The training is tests/chainer_train.py (a small CNN with BatchNorm and dropout on
shuffled mini-batches), run in its own process three times per mode, as in the
PyTorch demo: A uninterrupted; B SIGKILLed right after iteration ``kill_at`` (not a
checkpoint iteration); C started again on B's checkpoints. Each process logs every
iteration's loss as the bit pattern of the float32.

* ``loop``: a hand-written loop, a checkpoint every 4 iterations, killed after 14.
* ``trainer``: Chainer's Trainer with ``uckpt.chainer.snapshot`` every epoch (5
  iterations, asynchronous saves), killed after 14.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "tests" / "chainer_train.py"
ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
           PYTHONWARNINGS="ignore")
MODES = {"loop": {"every": 4, "kill_at": 14}, "trainer": {"every": 5, "kill_at": 14}}


def _train(mode, root, log, iters, every, kill_at=-1):
    cmd = [sys.executable, str(SCRIPT), mode, str(root), str(log), "--iters", str(iters),
           "--every", str(every), "--kill-at", str(kill_at)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ENV)
    expected = -signal.SIGKILL if kill_at > 0 else 0
    if proc.returncode != expected:
        raise RuntimeError(f"training process exited with {proc.returncode}, expected "
                           f"{expected}: {' '.join(cmd)}\n{(proc.stdout + proc.stderr)[-4000:]}")
    return proc.stdout


def _losses(log):
    """{iteration: float32 bit pattern (hex)}; a later line for an iteration wins."""
    out = {}
    for line in Path(log).read_text().splitlines():
        it, hexbits = line.split()
        out[int(it)] = hexbits
    return out


def _said(stdout, key):
    for line in stdout.splitlines():
        if line.startswith(key):
            return line.split()[-1]
    raise RuntimeError(f"a training process did not print {key!r}")


def demo(mode, workdir, *, iters=30, verbose=True):
    """Run A, B (killed) and C for ``mode``; return the comparison as a dict."""
    every, kill_at = MODES[mode]["every"], MODES[mode]["kill_at"]
    workdir = Path(workdir)
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    a_out = _train(mode, workdir / "a", workdir / "a.log", iters, every)
    _train(mode, workdir / "b", workdir / "b.log", iters, every, kill_at)
    c_out = _train(mode, workdir / "b", workdir / "c.log", iters, every)

    a, b, c = (_losses(workdir / f"{run}.log") for run in "abc")
    restart = int(_said(c_out, "resumed from"))
    after = range(restart + 1, iters + 1)
    same = [i for i in after if i in a and c.get(i) == a[i]]
    result = {"mode": mode, "restart": restart, "compared": len(after), "same": len(same),
              "before_kill_same": all(b[i] == a.get(i) for i in b),
              "digests_equal": _said(a_out, "digest") == _said(c_out, "digest")}
    if verbose:
        print(f"[{mode}] uninterrupted run: iterations 1-{iters}; interrupted run SIGKILLed "
              f"after iteration {kill_at}; resumed from checkpoint {restart}")
        print(f"{'iter':>6}  {'uninterrupted':>13}  {'resumed':>9}")
        for i in range(max(1, restart - 1), iters + 1):
            ours = c.get(i, b.get(i))
            mark = "==" if ours == a.get(i) else "!="
            note = "   <- resumed here" if i == restart + 1 else ""
            print(f"{i:>6}  {a.get(i, '-'):>13}  {ours or '-':>9}  {mark}{note}")
        print(f"bitwise identical: {len(same)}/{len(after)} steps after restart; final weights "
              f"{'identical' if result['digests_equal'] else 'DIFFERENT'}")
    return result

