"""Listing a local root: ``Store.steps()`` and ``Store.entries()`` of a root holding N
committed checkpoints (one real one saved, the others hard-linked copies of it), against
the floor of a Python listing (one ``os.scandir`` of the root and one ``lstat`` of each
step's manifest, what the local store before the blob seam did).

    .venv/bin/python benchmarks/bench_listing.py                 # 1,000 steps, 200 runs
    .venv/bin/python benchmarks/bench_listing.py --steps 100 --runs 50

Prints the median and minimum of each, in milliseconds. The uckpt measured is the one on
``PYTHONPATH`` if any (``PYTHONPATH=/other/tree/src`` measures another tree), else this
checkout's.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

try:  # the uckpt on PYTHONPATH (to measure another tree), else this checkout's
    import uckpt
except ImportError:
    sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "src")]
    import uckpt
from uckpt.storage import open_store

STEP = re.compile(r"^step_(\d+)$")


def floor(root: str) -> list[int]:
    """One scandir of the root, one lstat of each step's manifest."""
    out = []
    with os.scandir(root) as it:
        for e in it:
            m = STEP.match(e.name)
            if m and e.is_dir(follow_symlinks=False) and \
                    os.path.lexists(os.path.join(e.path, "manifest.json")):
                out.append(int(m.group(1)))
    return sorted(out)


def timed(fn, runs: int) -> tuple[float, float]:
    fn()  # warm-up
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3, min(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--dir", default=None, help="where the root is made (a temporary directory)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp) / "root"
        first = root / "step_00000000"
        uckpt.save(first, {"w": np.arange(16, dtype=np.float32)})
        for i in range(1, args.steps):
            d = root / f"step_{i:08d}"
            d.mkdir()
            for f in first.iterdir():
                os.link(f, d / f.name)
        store = open_store(root)
        assert store.steps() == floor(str(root)) == list(range(args.steps))
        assert len(store.entries()) == args.steps
        print(f"{args.steps} committed steps, {args.runs} runs, uckpt from {uckpt.__file__}")
        for what, fn in (("steps()", store.steps), ("entries()", store.entries),
                         ("floor (scandir + lstat)", lambda: floor(str(root)))):
            med, low = timed(fn, args.runs)
            print(f"{what:26s} median {med:8.2f} ms   min {low:8.2f} ms")


if __name__ == "__main__":
    main()
