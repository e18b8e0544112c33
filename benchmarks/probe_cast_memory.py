"""Peak resident memory of a load that casts: N float32 values loaded into a bfloat16
destination with ``cast=`` (converted while read, :mod:`uckpt.loading.castread`), against
an allocating load followed by a copy (what a caller does without ``cast=``).

    PYTHONPATH=$PWD/src python benchmarks/probe_cast_memory.py DIR [N]

Saves the array to ``DIR`` (N = 64 Mi values, 256 MiB, by default), then runs each way
twice in a fresh process and prints its peak (``VmHWM`` after ``clear_refs``) above what
the process held before the call (the destination included) and its seconds.
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np

import uckpt

CHILD = r"""
import sys, time, ml_dtypes, numpy as np, uckpt
def status(f):
    for line in open("/proc/self/status"):
        if line.startswith(f + ":"):
            return int(line.split()[1]) * 1024
path, n, how = sys.argv[1], int(sys.argv[2]), sys.argv[3]
dest = np.ones(n, ml_dtypes.bfloat16)
open("/proc/self/clear_refs", "w").write("5")
before, t = status("VmRSS"), time.perf_counter()
if how == "cast":
    uckpt.load(path, {"x": dest}, cast={"x": "bfloat16"})
else:
    dest[...] = uckpt.load(path)["x"]
print((status("VmHWM") - before) / 2**20, time.perf_counter() - t)
"""


def main() -> None:
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 64 << 20
    path = uckpt.save(sys.argv[1], {"x": (np.arange(n) % 200).astype(np.float32)},
                      overwrite=True)
    for how in ("cast", "load+copy") * 2:
        out = subprocess.run([sys.executable, "-c", CHILD, str(path), str(n), how],
                             capture_output=True, text=True, check=True).stdout.split()
        print(f"{how:10} +{float(out[0]):.1f} MiB {float(out[1]):.3f} s")


if __name__ == "__main__":
    main()
