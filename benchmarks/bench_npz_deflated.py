"""Reading a deflated NPZ (Chainer's ``save_npz(compression=True)`` default) with ``uckpt convert``
against ``np.load`` (issue 14).

The source is ``np.savez_compressed`` of arrays with VGG16's shapes (138,357,544 float32
parameters, 553 MB before compression; ``--scale 0.25`` keeps a quarter of each first axis).
Each measurement runs in a fresh process; times are medians of ``--repeat`` rounds after one
warm-up, from the page cache:

* ``np.load``: every member read (``np.load(path)[name]`` for each name);
* ``uckpt read``: ``open_checkpoint`` and every leaf read (no output);
* ``uckpt convert -> uckpt``: the CLI, output fsynced.

    .venv/bin/python benchmarks/bench_npz_deflated.py --repeat 3
    .venv/bin/python benchmarks/bench_npz_deflated.py --scale 0.1 --repeat 1   # quick
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

VGG16 = [((64, 3, 3, 3), (64,)), ((64, 64, 3, 3), (64,)), ((128, 64, 3, 3), (128,)),
         ((128, 128, 3, 3), (128,)), ((256, 128, 3, 3), (256,)), ((256, 256, 3, 3), (256,)),
         ((256, 256, 3, 3), (256,)), ((512, 256, 3, 3), (512,)), ((512, 512, 3, 3), (512,)),
         ((512, 512, 3, 3), (512,)), ((512, 512, 3, 3), (512,)), ((512, 512, 3, 3), (512,)),
         ((512, 512, 3, 3), (512,)), ((4096, 25088), (4096,)), ((4096, 4096), (4096,)),
         ((1000, 4096), (1000,))]

NP_LOAD = "import numpy as np,sys\nf=np.load(sys.argv[1])\nfor k in f.files: f[k]"
UCKPT_READ = ("import sys\nfrom uckpt.conversion import open_checkpoint\n"
              "from uckpt.conversion.interchange import unique_leaves\n"
              "with open_checkpoint(sys.argv[1]) as t:\n"
              "    for _, leaf in unique_leaves(t.root): leaf.read()")


def make(path: str, scale: float) -> int:
    rng = np.random.default_rng(0)
    arrays = {}
    for i, (w, b) in enumerate(VGG16):
        w = (max(1, int(w[0] * scale)),) + w[1:]
        arrays[f"l{i}/W"] = rng.standard_normal(w, dtype=np.float32)
        arrays[f"l{i}/b"] = rng.standard_normal(b, dtype=np.float32)
    np.savez_compressed(path, **arrays)
    return sum(a.nbytes for a in arrays.values())


def timed(cmd) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    work = tempfile.mkdtemp(dir=args.dir, prefix="bench-npz-")
    try:
        src = os.path.join(work, "snapshot.npz")
        nbytes = make(src, args.scale)
        print(f"source: {nbytes / 1e6:.0f} MB of arrays, {os.path.getsize(src) / 1e6:.0f} MB "
              "deflated")
        out = os.path.join(work, "out")
        runs = {"np.load": [sys.executable, "-c", NP_LOAD, src],
                "uckpt read": [sys.executable, "-c", UCKPT_READ, src],
                "uckpt convert -> uckpt": [sys.executable, "-m", "uckpt", "convert", "-q", "-f",
                                           src, out]}
        for name, cmd in runs.items():
            times = [timed(cmd) for _ in range(args.repeat + 1)][1:]
            print(f"{name:24s} {statistics.median(times):7.2f} s  (median of {args.repeat})")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
