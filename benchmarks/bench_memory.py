"""Peak host memory (and time) of loading the same state with uckpt and its peers, same run
(issue 29): uckpt into existing arrays and allocating; ``torch.load`` with and without
``mmap=True`` (allocating, and copied into existing tensors); safetensors ``load_file``
and ``safe_open`` (each tensor copied into an existing one); h5py (allocating, and
``read_direct`` into existing arrays).

    .venv/bin/python benchmarks/bench_memory.py [--mib 512] [--arrays 64] [--repeat 3]

The state: ``--mib`` MiB of float32 in ``--arrays`` equal arrays, saved once per format
into a temporary directory (read from the page cache). Each load runs in a fresh process
(:func:`uckpt.testing.peaks.peak`): the peak is the rise of the resident high-water mark
(``VmHWM``) over what the process held before the load, the destination arrays (for a load
into existing ones) already allocated and touched. File pages a process maps and touches
(``mmap=True``, ``safe_open``) count as resident while mapped. Peak: the most of
``--repeat`` runs; seconds: the median. Results: stdout and
``benchmarks/results/memory.{md,json,png}``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402

from uckpt.testing.peaks import peak  # noqa: E402

#: builds ``dest``: the existing arrays (NumPy) a load fills, touched
NUMPY_DEST = """
import numpy as np
n, k = int(mib) << 18, int(arrays)
dest = {f"a{i:03d}": np.ones(n // k, np.float32) for i in range(k)}
"""
TORCH_DEST = """
import torch
n, k = int(mib) << 18, int(arrays)
dest = {f"a{i:03d}": torch.ones(n // k, dtype=torch.float32) for i in range(k)}
"""
#: name -> (setup, the load); ``path`` is the file of the method's format
METHODS = {
    "uckpt into existing": ("import uckpt" + NUMPY_DEST, "uckpt.load(path, dest)"),
    "uckpt allocating": ("import uckpt", "got = uckpt.load(path)"),
    "torch.load": ("import torch", "got = torch.load(path)"),
    "torch.load into existing": (
        TORCH_DEST, "got = torch.load(path)\nfor k, t in got.items(): dest[k].copy_(t)\n"
                    "del got"),
    "torch.load mmap=True into existing": (
        TORCH_DEST, "got = torch.load(path, mmap=True)\n"
                    "for k, t in got.items(): dest[k].copy_(t)\ndel got"),
    "safetensors load_file": ("from safetensors.numpy import load_file",
                              "got = load_file(path)"),
    "safetensors safe_open into existing": (
        "from safetensors import safe_open" + NUMPY_DEST,
        "with safe_open(path, 'np') as f:\n"
        "    for k in f.keys(): dest[k][...] = f.get_tensor(k)"),
    "h5py allocating": ("import h5py", "with h5py.File(path, 'r') as f:\n"
                                       "    got = {k: f[k][()] for k in f}"),
    "h5py into existing": ("import h5py" + NUMPY_DEST,
                           "with h5py.File(path, 'r') as f:\n"
                           "    for k in f: f[k].read_direct(dest[k])"),
}
FORMAT_OF = {"uckpt": "uckpt", "torch": "pt", "safetensors": "safetensors", "h5py": "h5"}


def write_sources(where: Path, mib: int, arrays: int) -> dict:
    import h5py
    import torch
    from safetensors.numpy import save_file

    import uckpt

    n = mib << 18
    state = {f"a{i:03d}": np.full(n // arrays, i, np.float32) for i in range(arrays)}
    files = {"uckpt": where / "uckpt", "pt": where / "state.pt",
             "safetensors": where / "state.safetensors", "h5": where / "state.h5"}
    uckpt.save(files["uckpt"], state)
    torch.save({k: torch.from_numpy(v) for k, v in state.items()}, files["pt"])
    save_file(state, str(files["safetensors"]))
    with h5py.File(files["h5"], "w") as f:
        for k, v in state.items():
            f[k] = v
    return files


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--arrays", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where the sources are written")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        files = write_sources(Path(tmp), args.mib, args.arrays)
        for name, (setup, op) in METHODS.items():
            path = files[FORMAT_OF[name.split(" ")[0].split(".")[0]]]
            runs = [peak(setup, op, path=str(path), mib=str(args.mib),
                         arrays=str(args.arrays)) for _ in range(args.repeat)]
            errors = [r.error for r in runs if r.error]
            rows.append({"method": name, "peak_mib": max(r.mib for r in runs),
                         "seconds": statistics.median(r.seconds for r in runs),
                         "error": errors[0] if errors else None})
            print(f"{name}: +{rows[-1]['peak_mib']:.1f} MiB, {rows[-1]['seconds']:.3f} s"
                  + (f" ({errors[0]})" if errors else ""), flush=True)
    load = os.getloadavg()[0]
    head = (f"Loading {args.mib} MiB of float32 in {args.arrays} arrays, each load in a fresh "
            f"process, from the page cache; peak resident memory above the process's before "
            f"the load (destination arrays included in 'before'), the most of {args.repeat}; "
            f"seconds: median. {C.machine_line()} Load average {load:.1f}.")
    table = C.markdown_table(["method", "peak beyond (MiB)", "seconds"], [
        (r["method"], f"{r['peak_mib']:.1f}" + (f" ({r['error']})" if r["error"] else ""),
         f"{r['seconds']:.3f}") for r in rows])
    print("\n" + head + "\n\n" + table)
    C.RESULTS_DIR.mkdir(exist_ok=True)
    (C.RESULTS_DIR / "memory.md").write_text(head + "\n\n" + table + "\n")
    C.write_json(C.RESULTS_DIR / "memory.json", {"args": vars(args), "load_average": load,
                                                 "environment": C.environment(), "rows": rows})
    C.bar_plot_or_note(C.RESULTS_DIR / "memory.png", f"peak memory of a {args.mib} MiB load",
                       [r["method"] for r in rows],
                       {"peak beyond (MiB)": [r["peak_mib"] for r in rows]},
                       ylabel="MiB above the process before the load (most of runs)")


if __name__ == "__main__":
    main()
