"""``uckpt convert`` on a VGG16-sized ``torch.save`` file: time and peak memory, against doing
the same with the frameworks directly.

The source is ``torch.save(model.state_dict())`` of a module with torchvision's VGG16 names
and shapes (138,357,544 float32 parameters in 32 tensors, 553 MB; the largest tensor,
``classifier.0.weight``, is 411 MB). Each measurement runs in a fresh process, started by a
small wrapper that reports the process's wall time and its peak RSS
(``getrusage(RUSAGE_CHILDREN).ru_maxrss``); every output is fsynced before the process
ends, inside the timed region. Sources are read from the page cache (they were just written).
Each measurement has one untimed warm-up round; times are medians, peak RSS the maximum.

    .venv/bin/python benchmarks/bench_convert.py               # 3 rounds each (~3 min)
    .venv/bin/python benchmarks/bench_convert.py --repeat 1    # quick
    .venv/bin/python benchmarks/bench_convert.py --dir /mnt/nvme/tmp

Conversions (``uckpt convert`` CLI, as users run it): torch.save -> uckpt, uckpt -> Pickle,
torch.save -> HDF5, HDF5 -> Pickle. Baselines: torch.load + torch.save, torch.load + h5py
writes, h5py reads + torch.save; and the cost of starting each tool doing nothing (its
imports). Results: stdout and ``benchmarks/results/convert_vgg16.{md,json}``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402

REPO = C.BENCH_DIR.parent
PY = sys.executable

#: runs argv[1:] and prints its exit status, wall time and peak RSS as JSON
WRAPPER = """
import json, resource, subprocess, sys, time
t = time.perf_counter()
rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode
print(json.dumps({"rc": rc, "seconds": time.perf_counter() - t,
                  "peak_rss": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}))
"""

FSYNC = "import os\ndef fsync(p):\n    fd = os.open(p, os.O_RDONLY)\n    os.fsync(fd)\n    os.close(fd)\n"

TORCH_RESAVE = FSYNC + """
import sys, torch
sd = torch.load(sys.argv[1], weights_only=True)
torch.save(sd, sys.argv[2])
fsync(sys.argv[2])
"""

TORCH_TO_H5 = FSYNC + """
import sys, h5py, torch
sd = torch.load(sys.argv[1], weights_only=True)
with h5py.File(sys.argv[2], "w") as f:
    for name, t in sd.items():
        f.create_dataset(name, data=t.numpy())
fsync(sys.argv[2])
"""

H5_TO_TORCH = FSYNC + """
import sys, h5py, torch
with h5py.File(sys.argv[1], "r") as f:
    sd = {name: torch.from_numpy(f[name][()]) for name in f}
torch.save(sd, sys.argv[2])
fsync(sys.argv[2])
"""

IMPORT_TORCH = "import torch, h5py"


def uckpt_cli(*args) -> List[str]:
    return [PY, "-m", "uckpt.cli.main", *map(str, args)]


def measure(cmd: List[str], out: Path, repeat: int) -> Dict[str, object]:
    """One untimed warm-up round, then ``repeat`` measured ones."""
    runs = []
    for _ in range(repeat + 1):
        C.cleanup(out)
        proc = subprocess.run([PY, "-c", WRAPPER, *cmd], capture_output=True, text=True,
                              cwd=REPO)
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        if result["rc"] != 0:
            raise RuntimeError(f"{' '.join(map(str, cmd))} failed: {proc.stderr}")
        runs.append(result)
    runs = runs[1:]
    size = C.tree_nbytes(out) if out.exists() else None
    return {"seconds": [r["seconds"] for r in runs],
            "median_s": statistics.median(r["seconds"] for r in runs),
            "peak_rss": max(r["peak_rss"] for r in runs), "output_bytes": size}


def build_source(path: Path) -> int:
    import torch

    spec = C.vgg16_spec()
    sd = C.build_module(spec).state_dict()
    torch.save(sd, path)
    C.fsync_path(path)
    return sum(t.numel() * t.element_size() for t in sd.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=str(C.RESULTS_DIR))
    ap.add_argument("--results-dir", default=str(C.RESULTS_DIR))
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="convert-", suffix=".tmp", dir=args.dir))
    try:
        run(work, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(work: Path, args) -> None:
    src = work / "vgg16.pt"
    nbytes = build_source(src)
    p = {name: work / name for name in ("out_uckpt", "back_uckpt.pt", "out.h5", "back_h5.pt",
                                        "resaved.pt", "torch.h5", "h5_torch.pt", "dry")}
    rows = [
        # (label, kind, command, output); outputs of earlier rows are inputs of later ones
        ("torch.save -> uckpt", "uckpt convert", uckpt_cli("convert", src, p["out_uckpt"]),
         p["out_uckpt"]),
        ("uckpt -> Pickle", "uckpt convert", uckpt_cli("convert", p["out_uckpt"],
                                                       p["back_uckpt.pt"]), p["back_uckpt.pt"]),
        ("torch.save -> HDF5", "uckpt convert", uckpt_cli("convert", src, p["out.h5"]),
         p["out.h5"]),
        ("HDF5 -> Pickle", "uckpt convert", uckpt_cli("convert", p["out.h5"], p["back_h5.pt"]),
         p["back_h5.pt"]),
        ("torch.load + torch.save", "baseline", [PY, "-c", TORCH_RESAVE, src, p["resaved.pt"]],
         p["resaved.pt"]),
        ("torch.load + h5py write", "baseline", [PY, "-c", TORCH_TO_H5, src, p["torch.h5"]],
         p["torch.h5"]),
        ("h5py read + torch.save", "baseline", [PY, "-c", H5_TO_TORCH, p["torch.h5"],
                                                p["h5_torch.pt"]], p["h5_torch.pt"]),
        ("start only: uckpt convert --dry-run", "startup",
         uckpt_cli("convert", src, p["dry"], "--dry-run"), p["dry"]),
        ("start only: import torch, h5py", "startup", [PY, "-c", IMPORT_TORCH], p["dry"]),
    ]
    results = []
    for label, kind, cmd, out in rows:
        r = measure(cmd, out, args.repeat)
        r.update(label=label, kind=kind)
        results.append(r)
        print(f"{label:40s} {r['median_s']:7.2f} s  {r['peak_rss'] / 1e6:8.0f} MB", flush=True)

    sys.path[:0] = [str(REPO / "src")]
    from uckpt.conversion import diff

    for out in (p["out_uckpt"], p["back_uckpt.pt"], p["out.h5"], p["back_h5.pt"]):
        report = diff(src, out)
        if not report.identical:
            raise RuntimeError(f"{out}: {[d.text() for d in report.differences]}")

    table = C.markdown_table(
        ["operation", "tool", "time (median)", "peak RSS", "output"],
        [[r["label"], r["kind"], f"{r['median_s']:.2f} s", f"{r['peak_rss'] / 1e6:.0f} MB",
          C.fmt_bytes(r["output_bytes"]) if r["kind"] != "startup" else "-"]
         for r in results])
    header = (f"VGG16 state dict: {nbytes:,} bytes ({nbytes / 1e6:.0f} MB) in 32 float32 tensors, "
              f"largest 411 MB; one warm-up and {args.repeat} timed round(s) each, a fresh "
              "process per round, outputs fsynced; every conversion verified bit-exact with "
              "`uckpt diff` afterwards.")
    text = f"# uckpt convert, VGG16-sized torch.save file\n\n{header}\n\n{table}\n"
    print()
    print(text)
    results_dir = Path(args.results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / "convert_vgg16.md").write_text(text)
    C.write_json(results_dir / "convert_vgg16.json",
                 {"source_bytes": nbytes, "repeat": args.repeat, "results": results,
                  "environment": C.environment()})


if __name__ == "__main__":
    main()
