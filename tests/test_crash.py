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

import incremental_common
import uckpt
from conftest import entries

KILLS = int(os.environ.get("UCKPT_CRASH_KILLS", "50"))
SAVER = Path(__file__).with_name("crash_saver.py")


def check_step(path: Path, step: int) -> None:
    a = np.zeros((512, 1024), np.float32)
    out = uckpt.load(path, {"a": a, "b": None, "small": None, "step": None})
    assert out["step"] == step and (a == step).all() and (out["b"] == -step).all()
    uckpt.verify(path)


def run_kills(roots, extra_args, rnd, kills):
    env = dict(os.environ, UCKPT_CHUNK_BYTES=str(256 << 10),
               UCKPT_INCREMENTAL_CHUNK_BYTES=str(incremental_common.CHUNK_BYTES))
    last, interrupted = 0, 0
    for i in range(kills):
        p = subprocess.Popen([sys.executable, str(SAVER), *map(str, roots), *extra_args],
                             stdout=subprocess.PIPE, text=True, env=env)
        assert p.stdout.readline().strip() == "ready"
        if i == 0:  # make sure a first checkpoint exists
            assert p.stdout.readline().split() == ["committed", "1"]
            last = 1
        time.sleep(rnd.uniform(0.0, 0.25))
        p.send_signal(signal.SIGKILL)
        for line in p.stdout.read().splitlines():
            words = line.split()  # the last line may be torn by the kill: "committed"
            if len(words) == 2 and words[0] == "committed" and words[1].isdigit():
                last = max(last, int(words[1]))
        p.wait()
        interrupted += any(q.startswith(".") for r in roots if r.exists() for q in entries(r))
        yield last
    assert interrupted >= kills // 4, f"only {interrupted} kills landed inside a save"


@pytest.mark.timeout(600)
def test_sigkill_at_random_moments(tmp_path):
    root = tmp_path / "ck"
    previous = 0
    for last in run_kills([root], [], random.Random(1234), KILLS):
        mgr = uckpt.CheckpointManager(root, role="writer")  # removes debris of the killed save
        latest = mgr.latest_step()
        # everything reported as committed is visible; at most one more (committed, not
        # printed) past what this round reported or the previous round left
        assert last <= latest <= max(last, previous) + 1
        previous = latest
        check_step(mgr.path(latest), latest)
        assert not [p for p in entries(root) if p.startswith(".")]
        mgr.close()


@pytest.mark.timeout(600)
def test_sigkill_async_saves_with_two_tiers(tmp_path):
    fast, durable = tmp_path / "fast", tmp_path / "durable"
    previous = 0
    for last in run_kills([fast, durable], ["--async"], random.Random(99), KILLS // 2):
        mgr = uckpt.CheckpointManager(tiers=[fast, durable])
        # up to max_inflight saves committed but not yet reported
        assert last <= mgr.latest_step() <= max(last, previous) + 2
        previous = mgr.latest_step()
        for i in (0, 1):  # every committed copy on every tier is whole
            for s in uckpt.CheckpointManager(mgr.tiers[i].path).steps():
                check_step(mgr.path(s, i), s)
        holder = {"a": np.zeros((512, 1024), np.float32), "b": None, "small": None, "step": None}
        assert mgr.restore(holder) == mgr.latest_step() == holder["step"]
        mgr.close()
    assert uckpt.CheckpointManager(durable).steps(), "nothing ever reached the durable tier"


@pytest.mark.timeout(600)
def test_sigkill_during_incremental_saves_and_retention(tmp_path):
    """Kills land in incremental saves and in retention (keep_last=2 deletes after every
    save, newest first): every checkpoint left visible loads bitwise and verifies, its
    bases included, and restore gives the newest."""
    root = tmp_path / "ck"
    previous = 0
    for last in run_kills([root], ["--incremental"], random.Random(77), KILLS // 2):
        mgr = uckpt.CheckpointManager(root, role="writer")
        latest = mgr.latest_step()
        assert last <= latest <= max(last, previous) + 1
        previous = latest
        for s in mgr.steps():
            incremental_common.check(uckpt.load(mgr.path(s)), s)
            uckpt.verify(mgr.path(s))
        out = incremental_common.empty_state()
        assert mgr.restore(out) == latest
        incremental_common.check(out, latest)
        mgr.close()
