"""Processes of tests/test_shared_root.py: one saver and readers sharing a root.

    shared_root_worker.py save MODE N START ROOT [DURABLE]   save steps START..N-1
    shared_root_worker.py read STOPFILE OUT ROOT [DURABLE]   open, list, restore every 50 ms

A ROOT may be an s3:// URL (tests/test_s3_tier.py), its endpoint and credentials in the
standard AWS_* environment variables.

MODE is sync, async or tiers. The saver prints "acked S" once step S is
committed (sync: when save returns; async and tiers: when its handle, or the
copy to the durable tier, is done). A reader writes a JSON summary to OUT when
STOPFILE appears: how many restores it did and every error it saw.
"""
import json
import sys
import time
import traceback
import warnings
from pathlib import Path

import numpy as np

import uckpt

ROWS = 64  # the "w" array: ROWS x 256 float32 (64 KiB), step number in every element


def state_for(step: int) -> dict:
    return {"w": np.full((ROWS, 256), step, np.float32), "meta": {"step": step, "lr": 0.1 * step}}


def check(holder: dict, step: int) -> None:
    if not (holder["w"] == step).all() or holder["meta"] != {"step": step, "lr": 0.1 * step}:
        raise AssertionError(f"restored step {step} does not hold that step's values")


def manager(roots, **kw):
    if len(roots) == 1:
        return uckpt.CheckpointManager(roots[0], **kw)
    return uckpt.CheckpointManager(tiers=roots, **kw)


def save(mode: str, n: int, start: int, roots) -> None:
    keep = {"sync": {}, "async": {"keep_last": 5}, "tiers": {}}[mode]
    tiers = roots if mode != "tiers" else [uckpt.Tier(roots[0], keep=2), uckpt.Tier(roots[1])]
    mgr = manager(tiers, async_save=mode != "sync", **keep)
    pending = []
    for step in range(start, n):
        out = mgr.save(step, state_for(step))
        if mode == "sync":
            print("acked", step, flush=True)
            continue
        pending.append((step, out))
        if mode == "tiers":  # a copy counts once it is on the durable tier: wait for it
            mgr.wait()
        while pending and pending[0][1].done():
            s, h = pending.pop(0)
            h.result()
            print("acked", s, flush=True)
    mgr.close()
    for s, h in pending:
        h.result()
        print("acked", s, flush=True)
    print("done", flush=True)


def read(stop: Path, out: Path, roots) -> None:
    summary = {"restores": 0, "empty": 0, "errors": [], "warnings": []}
    while not stop.exists():
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                mgr = manager(roots)
                mgr.steps()
                holder = {"w": np.zeros((ROWS, 256), np.float32), "meta": None}
                step = mgr.restore(holder)
                if step is None:
                    summary["empty"] += 1
                else:
                    check(holder, step)
                    summary["restores"] += 1
                mgr.close()
            summary["warnings"] += [str(w.message) for w in caught]
        except Exception as e:  # noqa: BLE001 - every error is reported to the test
            summary["errors"].append(f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
        time.sleep(0.05)
    out.write_text(json.dumps(summary))


def _roots(args):
    """Paths, or s3:// URLs (their endpoint and credentials from the AWS_* variables)."""
    return [p if p.startswith("s3://") else Path(p) for p in args]


if __name__ == "__main__":
    if sys.argv[1] == "save":
        save(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), _roots(sys.argv[5:]))
    else:
        read(Path(sys.argv[2]), Path(sys.argv[3]), _roots(sys.argv[4:]))
