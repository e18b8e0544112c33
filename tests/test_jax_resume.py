"""Acceptance of the JAX adapters: a Flax NNX + Optax training loop with dropout, killed
with SIGKILL while an asynchronous save is in flight and resumed from its
CheckpointManager, ends bit for bit where an uninterrupted run does, on one device and on
an 8-device mesh (one process); the checkpoint of the mesh run loads onto 4 devices with
the same values. Each run is a real process (tests/jax_train_worker.py), given its number
of CPU devices through XLA_FLAGS before it imports JAX."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

WORKER = Path(__file__).resolve().parent / "jax_train_worker.py"
STEPS, KILL_AT = 5, 3


def _run(root, kill_at, out, devices):
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
               JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, str(WORKER), str(root), str(STEPS), str(kill_at),
                           str(out), str(devices)], env=env, capture_output=True, text=True,
                          timeout=400)


@pytest.mark.parametrize("devices", [1, 8])
def test_killed_training_resumes_bit_for_bit(tmp_path, devices):
    root, out = tmp_path / "root", tmp_path / "out.npz"
    killed = _run(root, KILL_AT, out, devices)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    resumed = _run(root, -1, out, devices)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    with np.load(out) as z:
        arrays = dict(z)
    fresh = {k[len("fresh"):]: v for k, v in arrays.items() if k.startswith("fresh")}
    got = {k[len("resumed"):]: v for k, v in arrays.items() if k.startswith("resumed")}
    assert set(got) == set(fresh) and len(got) > 10
    for k in fresh:
        assert got[k].dtype == fresh[k].dtype and got[k].tobytes() == fresh[k].tobytes(), k
    assert any("rngs" in k for k in got)  # the dropout key and its counter are restored
    if devices > 1:
        four = {k[len("four"):]: v for k, v in arrays.items() if k.startswith("four")}
        assert set(four) == set(got)
        for k in got:
            assert four[k].tobytes() == got[k].tobytes(), k


def test_eight_shards_of_one_process_saved_once_and_placed_on_four_devices(tmp_path):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
               JAX_PLATFORMS="cpu")
    run = subprocess.run([sys.executable, str(WORKER.parent / "jax_mesh_worker.py"),
                          str(tmp_path / "c")], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-3000:]
