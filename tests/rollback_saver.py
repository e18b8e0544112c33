"""The rollback pattern of the crash tests (crash_saver.py ROOT --rollback): saves forever
and, at random, goes back to an earlier step of its live line and continues from there on
a new line. A state holds its step and line, so a restore tells which line it came from."""
import os
import random
import sys
import time

import numpy as np

import uckpt


def state(step: int, line: int) -> dict:
    return {"a": np.full((128, 256), step, np.float32) + np.float32(line % 1000) / 1000,
            "b": np.full(5000, line, np.int64), "step": step, "line": line}


def empty() -> dict:
    return {"a": np.zeros((128, 256), np.float32), "b": np.zeros(5000, np.int64),
            "step": None, "line": None}


def same(out: dict, step: int, line: int) -> bool:
    want = state(step, line)
    return out["step"] == step and out["line"] == line and \
        np.array_equal(out["a"], want["a"]) and np.array_equal(out["b"], want["b"])


def run(root: str, save_options=None) -> None:
    rnd = random.Random(os.getpid() ^ time.time_ns())
    archive = rnd.random() < 0.5  # roll back by the save itself, or by rollback()
    mgr = uckpt.CheckpointManager(root, keep_last=3, save_options=save_options,
                                  on_rollback="archive" if archive else "refuse")
    out = empty()
    latest = mgr.restore(out)
    line = out["line"] if latest is not None else rnd.getrandbits(30)
    step = (latest or 0) + 1
    print("ready", flush=True)
    while True:
        live = mgr.steps()
        if len(live) >= 2 and rnd.random() < 0.5:
            to, line = rnd.choice(live[:-1]), rnd.getrandbits(30)
            mgr.restore(out, step=to)
            print("rollback", to, line, flush=True)
            if not archive:
                mgr.rollback(to=to)
                print("rolledback", to, line, flush=True)
            step = to + 1
        mgr.save(step, state(step, line))
        print("committed", step, line, flush=True)
        step += 1
    sys.exit(0)
