"""Peak host memory beyond the state of each uckpt operation (issue 29 item 1; the budgets
of docs/memory.md): sync save, async save, load into existing arrays, allocating load,
verify, consolidate, and ``uckpt convert`` between every pair of the file formats.

    PYTHONPATH=$PWD/src python benchmarks/probe_memory_budgets.py DIR [MIB]

Two states of MIB MiB (256 by default) of float32: "many" (64 arrays) and "one" (one
array). Each operation runs in a fresh process (:func:`uckpt.testing.peaks.peak`); the
table gives its peak above the resident memory before it (the state it saves, or the
arrays it loads into, already held) in MiB, and its seconds. Writes under DIR.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np

import uckpt
from uckpt.conversion import convert
from uckpt.testing.peaks import peak

FORMATS = {"uckpt": "", "npz": ".npz", "pickle": ".pt", "hdf5": ".h5",
           "safetensors": ".safetensors"}
STATE = """
import numpy as np, uckpt
n, k = int(mib) << 18, int(arrays)
state = {f"a{i:03d}": np.full(n // k, i, np.float32) for i in range(k)}
"""
OPS = {
    "sync save": (STATE, "uckpt.save(out, state)"),
    "async save": (STATE, "uckpt.save(out, state, blocking=False).wait()"),
    "load into existing": (STATE, "uckpt.load(src, state)"),
    "allocating load": ("import uckpt", "got = uckpt.load(src)"),
    "verify": ("import uckpt", "uckpt.verify(src)"),
    "consolidate": ("import uckpt", "uckpt.consolidate(src, out)"),
    "consolidate zstd": ("import uckpt", "uckpt.consolidate(src, out, compression='zstd')"),
}


def state(mib: int, arrays: int):
    n = mib << 18
    return {f"a{i:03d}": np.full(n // arrays, i, np.float32) for i in range(arrays)}


def main() -> None:
    where = Path(sys.argv[1])
    mib = int(sys.argv[2]) if len(sys.argv) > 2 else 256
    print("| operation | state | peak beyond the state (MiB) | seconds |\n|---|---|---|---|")
    for name, arrays in (("many", 64), ("one", 1)):
        base = where / name
        shutil.rmtree(base, ignore_errors=True)
        base.mkdir(parents=True)
        src = uckpt.save(base / "src", state(mib, arrays))
        files = {"uckpt": str(src)}
        for fmt, ext in FORMATS.items():
            if fmt != "uckpt":
                files[fmt] = str(base / f"src{ext}")
                convert(src, files[fmt])
        rows = []
        for op, (setup, code) in OPS.items():
            shutil.rmtree(base / "out", ignore_errors=True)
            rows.append((op, peak(setup, code, src=str(src), out=str(base / "out"),
                                  mib=str(mib), arrays=str(arrays))))
        shutil.rmtree(base / "out", ignore_errors=True)
        for a in FORMATS:
            for b, ext in FORMATS.items():
                if a != b:
                    out = base / f"out{ext}"
                    rows.append((f"convert {a} -> {b}", peak(
                        "from uckpt.conversion import convert", "convert(src, out)",
                        src=files[a], out=str(out))))
                    shutil.rmtree(out, ignore_errors=True) if out.is_dir() else out.unlink()
        for op, p in rows:
            print(f"| {op} | {name} | {p.mib:.1f}{' ' + p.error if p.error else ''} | "
                  f"{p.seconds:.2f} |", flush=True)
        shutil.rmtree(base)


if __name__ == "__main__":
    main()
