"""Distributed saves: every rank writes its part (uckpt) vs rank 0 writes everything.

    .venv/bin/python benchmarks/bench_distributed.py [--sizes resnet50,vgg16]
        [--ranks 1,2,4] [--repeat 3] [--dir DIR]

For each model size and each N, launches ``mpiexec -n N`` ranks that all hold
the same (replicated, data-parallel) model + SGD-momentum state and time, in
interleaved rounds:

* ``rank0 torch.save``: what frameworks do today: rank 0 ``torch.save``s the
  whole state (and fsyncs it) while the others wait at a barrier;
* ``uckpt``: ``uckpt.save(..., comm=MPI.COMM_WORLD)``, every rank writing its
  share and fsyncing it, one atomic commit;
* ``uckpt async``: the same with ``blocking=False``: training stalls only for
  the snapshot; the write finishes in the background.

Reported per method: the slowest rank's wall time (until the checkpoint is
durable), the training stall (how long the slowest rank is blocked), and the
bytes each rank wrote. Results: ``benchmarks/results/distributed.{md,json,png}``.
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
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402

METHODS = ("rank0 torch.save", "uckpt", "uckpt async")


def worker(size: str, directory: str, repeat: int) -> None:
    from mpi4py import MPI
    import torch

    import uckpt

    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    model, opt = C.build_state(C.SPECS[size]())
    state = {"model": model, "optimizer": opt}
    uckpt.comm.get_communicator(comm)  # set up (a collective Dup) outside the timings
    rows = []
    for rnd in range(repeat + 1):  # round 0 warms up (page cache, staging memory)
        for method in METHODS:
            target = os.path.join(directory, f"{method.replace(' ', '_')}-{rnd}")
            comm.Barrier()
            t0 = time.perf_counter()
            written = 0
            if method == "rank0 torch.save":
                if rank == 0:
                    with open(target + ".pt", "wb") as f:
                        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, f)
                        f.flush()
                        os.fsync(f.fileno())
                    written = os.path.getsize(target + ".pt")
                busy = time.perf_counter() - t0
                comm.Barrier()  # everyone waits for rank 0
                stall = done = time.perf_counter() - t0
            elif method == "uckpt":
                uckpt.save(target, state, comm=comm)
                stall = done = busy = time.perf_counter() - t0
                written = os.path.getsize(os.path.join(target, f"data-{rank:05d}.bin"))
            else:
                handle = uckpt.save(target, state, comm=comm, blocking=False)
                stall = time.perf_counter() - t0
                handle.wait()
                done = busy = time.perf_counter() - t0
                written = os.path.getsize(os.path.join(target, f"data-{rank:05d}.bin"))
            got = comm.gather({"stall": stall, "done": done, "busy": busy, "bytes": written}, root=0)
            if rank == 0 and rnd > 0:
                rows.append({"method": method, "round": rnd, "ranks": got})
            comm.Barrier()
            if rank == 0:
                shutil.rmtree(target, ignore_errors=True)
                if os.path.exists(target + ".pt"):
                    os.remove(target + ".pt")
                # settle the file system (the deletion's journal commit and writeback),
                # so that no method's fsync pays for the previous one's clean-up
                os.sync()
                time.sleep(0.2)
    if rank == 0:
        nbytes = C.state_nbytes(C.flat_tensors(model, opt))
        print("BENCH " + json.dumps({"size": size, "n": n, "state_bytes": nbytes, "rows": rows}),
              flush=True)


def summarize(run: dict) -> dict:
    out = {}
    for method in METHODS:
        rows = [r["ranks"] for r in run["rows"] if r["method"] == method]
        out[method] = {
            "slowest_s": statistics.median(max(x["done"] for x in ranks) for ranks in rows),
            "stall_s": statistics.median(max(x["stall"] for x in ranks) for ranks in rows),
            "bytes_per_rank": [statistics.median(ranks[i]["bytes"] for ranks in rows)
                               for i in range(run["n"])],
        }
    return out


def report(results: list, env: dict, args) -> str:
    lines = ["# Distributed saves: every rank writes its part vs rank 0 writes everything", "",
             f"Command: `.venv/bin/python benchmarks/bench_distributed.py --sizes {args.sizes} "
             f"--ranks {args.ranks} --repeat {args.repeat}`; `mpiexec -n N` (MPICH), one "
             f"machine, {os.cpu_count()} cores, directory on {C.filesystem_of(args.dir)}. "
             f"Medians of {args.repeat} interleaved rounds after a warm-up round; every save "
             "is fsynced, and the file system is synced after each method's clean-up. \"slowest rank\": until the checkpoint is durable on the slowest "
             "rank; \"stall\": how long the slowest rank is blocked from training.", "",
             "| state | N | method | slowest rank (s) | stall (s) | MB written per rank "
             "(max / min) | slowest ÷ rank0 torch.save |", "|---|---|---|---|---|---|---|"]
    for res in results:
        s = res["summary"]
        base = s["rank0 torch.save"]["slowest_s"]
        for method in METHODS:
            m = s[method]
            per = m["bytes_per_rank"]
            lines.append(f"| {res['size']} ({res['state_bytes'] / C.GB:.3f} GB) | {res['n']} | "
                         f"{method} | {m['slowest_s']:.3f} | {m['stall_s']:.3f} | "
                         f"{max(per) / 1e6:.1f} / {min(per) / 1e6:.1f} | "
                         f"{m['slowest_s'] / base:.2f} |")
    lines += ["", f"Environment: `{json.dumps(env)}`"]
    return "\n".join(lines)


def plot(results: list, path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    sizes = sorted({r["size"] for r in results}, key=[r["size"] for r in results].index)
    fig, axes = plt.subplots(1, len(sizes), figsize=(5 * len(sizes), 4), squeeze=False)
    for ax, size in zip(axes[0], sizes):
        runs = [r for r in results if r["size"] == size]
        ns = [r["n"] for r in runs]
        for method in METHODS:
            ax.plot(ns, [r["summary"][method]["slowest_s"] for r in runs], marker="o",
                    label=f"{method}: slowest rank")
        ax.plot(ns, [r["summary"]["uckpt async"]["stall_s"] for r in runs], marker="x",
                linestyle="--", label="uckpt async: stall")
        ax.set_xticks(ns)
        ax.set_xlabel("ranks (N)")
        ax.set_ylabel("seconds")
        ax.set_title(f"{size} state")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="resnet50,vgg16")
    p.add_argument("--ranks", default="1,2,4")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--dir", default=str(C.BENCH_DIR))
    p.add_argument("--results-dir", default=str(C.RESULTS_DIR))
    p.add_argument("--worker", nargs=3, metavar=("SIZE", "DIR", "REPEAT"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args.worker[0], args.worker[1], int(args.worker[2]))
        return 0
    mpiexec = Path(sys.executable).with_name("mpiexec")
    workdir = Path(tempfile.mkdtemp(prefix="dist-", suffix=".tmp", dir=args.dir))
    results = []
    try:
        for size in args.sizes.split(","):
            for n in map(int, args.ranks.split(",")):
                t0 = time.perf_counter()
                out = subprocess.run([str(mpiexec), "-n", str(n), sys.executable, __file__,
                                      "--worker", size, str(workdir), str(args.repeat)],
                                     capture_output=True, text=True, timeout=3600)
                line = next((x for x in out.stdout.splitlines() if x.startswith("BENCH ")), None)
                if out.returncode or line is None:
                    print(out.stdout[-3000:], out.stderr[-3000:], file=sys.stderr)
                    raise SystemExit(f"{size} N={n}: the ranks failed (exit {out.returncode})")
                run = json.loads(line[6:])
                run["summary"] = summarize(run)
                results.append(run)
                s = run["summary"]
                print(f"[{size} N={n}] " + ", ".join(
                    f"{m}: {s[m]['slowest_s']:.3f} s (stall {s[m]['stall_s']:.3f})" for m in METHODS)
                    + f" [{time.perf_counter() - t0:.0f} s]", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    env = C.environment()
    text = report(results, env, args)
    print("\n" + text)
    out_dir = Path(args.results_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "distributed.md").write_text(text + "\n")
    (out_dir / "distributed.json").write_text(json.dumps({"env": env, "results": results}, indent=1))
    plot(results, out_dir / "distributed.png")
    print(f"wrote {out_dir / 'distributed'}.{{md,json,png}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
