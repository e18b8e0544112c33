"""The seed study's experiment, reproduced: checkpoint overhead and size in PyTorch,
TensorFlow/Keras and Chainer, with each framework's own checkpointing and with uckpt.

For each framework and model (ResNet50, VGG16: the real architectures and parameter
counts, trained on CPU with small batches of small synthetic images; see
framework_models.py) one process trains ``--steps`` steps per run, checkpointing every
``--every`` steps with each method: none, the framework's own (torch.save; Keras
ModelCheckpoint to .weights.h5; Chainer extensions.snapshot, i.e. savez_compressed),
uckpt sync and uckpt async. Runs are interleaved over ``--rounds`` rounds after a warm-up
round. Reported per framework, model and method: the median total time, the overhead
Omega = (T_ckpt - T_none) / T_none (the study's metric; median of the per-round ratios,
with their min-max), the stall per save, and the size of one checkpoint, beside the
study's published numbers.

    .venv/bin/python benchmarks/bench_frameworks.py                  # full: ~1 h on 2 cores
    .venv/bin/python benchmarks/bench_frameworks.py --quick          # smoke run: 4 steps, 1 round
    .venv/bin/python benchmarks/bench_frameworks.py --frameworks pytorch --models resnet50

Writes results/frameworks.{md,json,png}. Each (framework, model) runs in its own
process (frameworks do not share a process: thread pools and allocators differ).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (RESULTS_DIR, cleanup, environment, fmt_bytes, markdown_table,  # noqa: E402
                    write_json)

FRAMEWORKS = ("pytorch", "tensorflow", "chainer")
MODELS = ("resnet50", "vgg16")
METHODS = ("none", "own", "uckpt-sync", "uckpt-async")
OWN = {"pytorch": "torch.save (pickle)", "tensorflow": "ModelCheckpoint .weights.h5 (HDF5)",
       "chainer": "extensions.snapshot (savez_compressed)"}
#: the study's published checkpoint sizes, MB (ResNet50, VGG16), and its Omega remarks
STUDY_MB = {"chainer": (146, 238), "pytorch": (180, 1025), "tensorflow": (181, 257)}
STUDY_OMEGA = {"tensorflow": "2.3% (lowest average)", "chainer": "highest; up to 304% at scale",
               "pytorch": "- (not quoted here)"}


def worker(args) -> int:
    """One framework and model in this process: rounds of every method, as JSON to --out."""
    src = Path(__file__).resolve().parent.parent
    sys.path[:0] = [str(src / "src"), str(src / "adapters")]
    from framework_models import RUNNERS

    work = Path(tempfile.mkdtemp(prefix=f"fw-{args.worker}-", suffix=".tmp", dir=args.dir))
    try:
        runner = RUNNERS[args.worker](args.model, args.batch, work)
        methods = args.methods.split(",")
        # untimed: compile (Keras builds its train function in the first fit), allocate,
        # create files; without --warmup only one step of training
        for m in methods if args.warmup else ["none"]:
            runner.run(m, args.every if args.warmup else 1, args.every)
        runs = {m: [] for m in methods}
        for rnd in range(args.rounds):
            order = methods[rnd % len(methods):] + methods[:rnd % len(methods)]
            for m in order:
                r = runner.run(m, args.steps, args.every)
                r["round"] = rnd
                runs[m].append(r)
                print(f"  {args.worker}/{args.model} round {rnd + 1} {m:<12} "
                      f"{r['total_s']:.2f} s", file=sys.stderr, flush=True)
        Path(args.out).write_text(json.dumps({"framework": args.worker, "model": args.model,
                                              "params": int(runner.params), "runs": runs}))
    finally:
        cleanup(work)
    return 0


def summarize(doc: dict) -> dict:
    """Median totals, per-round Omega (median, min, max), stall and size per method."""
    runs = doc["runs"]
    base = {r["round"]: r["total_s"] for r in runs.get("none", [])}
    out = {}
    for m, rs in runs.items():
        omegas = [r["total_s"] / base[r["round"]] - 1 for r in rs if r["round"] in base]
        stalls = [s for r in rs for s in r["stalls_s"]]
        out[m] = {"total_s": statistics.median(r["total_s"] for r in rs),
                  "omega": statistics.median(omegas) if omegas else None,
                  "omega_min": min(omegas) if omegas else None,
                  "omega_max": max(omegas) if omegas else None,
                  "stall_s": statistics.median(stalls) if stalls else None,
                  "ckpt_bytes": max(r["ckpt_bytes"] for r in rs)}
    return out


def _pct(x) -> str:
    return "-" if x is None else f"{x * 100:.1f}%"


def report(results: list, args) -> str:
    rows = []
    for doc in results:
        s = doc["summary"]
        fw, model = doc["framework"], doc["model"]
        for m in doc["runs"]:
            r = s[m]
            name = OWN[fw] if m == "own" else m
            spread = "" if r["omega_min"] is None or m == "none" else \
                f" ({_pct(r['omega_min'])} .. {_pct(r['omega_max'])})"
            rows.append([fw, model, f"{doc['params']:,}", name, f"{r['total_s']:.2f}",
                         ("-" if m == "none" else _pct(r["omega"]) + spread),
                         "-" if r["stall_s"] is None else f"{r['stall_s'] * 1e3:.0f}",
                         "-" if m == "none" else f"{r['ckpt_bytes'] / 1e6:.0f}"])
    study = [[fw, str(STUDY_MB[fw][0]), str(STUDY_MB[fw][1]), STUDY_OMEGA[fw]] for fw in FRAMEWORKS]
    verdict = []
    for doc in results:
        s = doc["summary"]
        if "own" in s and "uckpt-async" in s and s["own"]["omega"] is not None:
            ok = s["uckpt-async"]["omega"] < s["own"]["omega"]
            verdict.append(f"- {doc['framework']}/{doc['model']}: uckpt async Omega "
                           f"{_pct(s['uckpt-async']['omega'])} vs own {_pct(s['own']['omega'])}: "
                           + ("below" if ok else "NOT below"))
    env = environment()
    return "\n".join([
        "# Checkpointing in PyTorch, TensorFlow/Keras and Chainer (the seed study, reproduced)",
        "",
        f"{args.steps} training steps per run (batch {args.batch}, CPU, synthetic data), a "
        f"checkpoint every {args.every} steps; median of {args.rounds} interleaved round(s)"
        + (" after a warm-up round" if args.warmup else " (no warm-up: quick mode)") +
        ". Omega = (T - T_none) / T_none per round (median, min .. max). Every checkpoint is "
        "fsynced. `ckpt MB`: one checkpoint (uckpt: model + optimizer state + counters; Keras "
        "ModelCheckpoint: weights only).",
        "", markdown_table(["framework", "model", "parameters", "method", "total s", "Omega",
                            "stall/save ms", "ckpt MB"], rows),
        "", "uckpt async against each framework's own checkpointing:", "", *verdict,
        "", "The study's published numbers (its scale, GPUs and intervals differ: compare "
        "the ranking, not the values):", "",
        markdown_table(["framework", "ResNet50 MB", "VGG16 MB", "Omega (average)"], study),
        "", "Environment: " + ", ".join(f"{k}={v}" for k, v in env.items()
                                         if k in ("cpu_count", "torch", "numpy", "uckpt",
                                                  "platform")), ""])


def plot(results: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = [m for m in METHODS if m != "none"]
    labels = [f"{d['framework']}\n{d['model']}" for d in results]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / len(methods)
    for i, m in enumerate(methods):
        xs = [j + i * width for j in range(len(results))]
        om = [(d["summary"].get(m) or {}).get("omega") or 0.0 for d in results]
        ax1.bar(xs, [o * 100 for o in om], width, label="own" if m == "own" else m)
        mb = [(d["summary"].get(m) or {}).get("ckpt_bytes", 0) / 1e6 for d in results]
        ax2.bar(xs, mb, width, label=m)
    study = {(fw, model): STUDY_MB[fw][k] for fw in FRAMEWORKS for k, model in enumerate(MODELS)}
    ax2.scatter([j + 0.4 for j in range(len(results))],
                [study.get((d["framework"], d["model"]), float("nan")) for d in results],
                marker="_", s=400, color="k", label="study (own format)", zorder=3)
    for ax, title in ((ax1, "overhead Omega (%)"), (ax2, "one checkpoint (MB)")):
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(results))])
        ax.set_xticklabels(labels, fontsize=8)
        ax.set_title(title)
        ax.legend(fontsize=8)
    ax1.set_yscale("symlog", linthresh=1)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--steps", type=int, default=20, help="training steps per run")
    ap.add_argument("--every", type=int, default=5, help="checkpoint every N steps")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-warmup", dest="warmup", action="store_false")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: --steps 4 --every 2 --rounds 1 --no-warmup --batch 2")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="compute threads of every framework")
    ap.add_argument("--dir", default=str(RESULTS_DIR), help="where checkpoints go")
    ap.add_argument("--results-dir", default=str(RESULTS_DIR))
    ap.add_argument("--timeout", type=float, default=7200, help="seconds per framework/model")
    ap.add_argument("--worker", choices=FRAMEWORKS, help=argparse.SUPPRESS)
    ap.add_argument("--model", choices=MODELS, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.every, args.rounds, args.warmup, args.batch = 4, 2, 1, False, 2
    if "none" not in args.methods.split(","):
        ap.error("--methods must include none (the baseline of Omega)")
    if args.worker:
        return worker(args)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), TF_CPP_MIN_LOG_LEVEL="2",
               TF_NUM_INTRAOP_THREADS=str(args.threads), TF_NUM_INTEROP_THREADS="1")
    results_dir = Path(args.results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="fw-out-") as tmp:
        for fw in args.frameworks.split(","):
            for model in args.models.split(","):
                out = Path(tmp) / f"{fw}-{model}.json"
                cmd = [sys.executable, __file__, "--worker", fw, "--model", model,
                       "--out", str(out), "--methods", args.methods, "--steps", str(args.steps),
                       "--every", str(args.every), "--batch", str(args.batch),
                       "--rounds", str(args.rounds), "--dir", args.dir]
                if not args.warmup:
                    cmd.append("--no-warmup")
                print(f"{fw}/{model} ...", flush=True)
                t0 = time.perf_counter()
                r = subprocess.run(cmd, env=env, timeout=args.timeout)
                if r.returncode != 0 or not out.exists():
                    print(f"{fw}/{model}: failed (exit {r.returncode})", flush=True)
                    continue
                doc = json.loads(out.read_text())
                doc["summary"] = summarize(doc)
                results.append(doc)
                s = doc["summary"]
                print(f"{fw}/{model}: {time.perf_counter() - t0:.0f} s; " + ", ".join(
                    f"{m} Omega {_pct(v['omega'])} {fmt_bytes(v['ckpt_bytes'])}"
                    for m, v in s.items() if m != "none"), flush=True)
    if not results:
        return 1
    text = report(results, args)
    print(text)
    (results_dir / "frameworks.md").write_text(text)
    write_json(results_dir / "frameworks.json", {"args": vars(args), "results": results,
                                                 "environment": environment()})
    plot(results, results_dir / "frameworks.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
