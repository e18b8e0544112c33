"""SIGKILL a process that saves in a loop at random moments; the newest committed
checkpoint must always load and verify, and no uncommitted one is ever returned."""
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import uckpt

KILLS = int(os.environ.get("UCKPT_CRASH_KILLS", "50"))


def expect_consistent(root: Path, last_reported: int) -> int:
    mgr = uckpt.CheckpointManager(root)  # also removes debris of the killed save
    steps = mgr.steps()
    assert steps, "no committed checkpoint survived"
    latest = steps[-1]
    # everything reported as committed is visible; at most one more (committed, not yet printed)
    assert last_reported <= latest <= last_reported + 1
    a = np.zeros((512, 1024), np.float32)
    out = uckpt.load(mgr.path(latest), {"a": a, "b": None, "small": None, "step": None})
    assert out["step"] == latest and (a == latest).all() and (out["b"] == -latest).all()
    uckpt.verify(mgr.path(latest))
    assert mgr.restore({"a": a, "b": None, "small": None, "step": None}) == latest
    assert not [p for p in root.iterdir() if p.name.startswith(".")]
    return latest


@pytest.mark.timeout(600)
def test_sigkill_at_random_moments(tmp_path):
    rnd = random.Random(1234)
    root = tmp_path / "ck"
    env = dict(os.environ, UCKPT_CHUNK_BYTES=str(256 << 10))
    saver = Path(__file__).with_name("crash_saver.py")
    last, interrupted = 0, 0
    for i in range(KILLS):
        p = subprocess.Popen([sys.executable, str(saver), str(root)], stdout=subprocess.PIPE,
                             text=True, env=env)
        assert p.stdout.readline().strip() == "ready"
        if i == 0:  # make sure a first checkpoint exists
            assert p.stdout.readline().split() == ["committed", "1"]
            last = 1
        time.sleep(rnd.uniform(0.0, 0.25))
        p.send_signal(signal.SIGKILL)
        for line in p.stdout.read().splitlines():
            if line.startswith("committed"):
                last = max(last, int(line.split()[1]))
        p.wait()
        interrupted += any(q.name.startswith(".") for q in root.iterdir())
        last = expect_consistent(root, last)
    assert interrupted >= KILLS // 4, f"only {interrupted} kills landed inside a save"
