"""Checkpoint overhead inside a real CPU training loop: async vs sync vs torch.save.

One process trains an MLP whose state (parameters + SGD momentum) is a few hundred MB
and checkpoints every k steps with each method, all in one run:

  none         no checkpointing (the baseline)
  torch.save   torch.save({"model": sd, "optimizer": sd}) + fsync, every k steps
  uckpt-sync   CheckpointManager(...).save, blocking until committed
  uckpt-async  CheckpointManager(..., async_save=True).save: returns after the snapshot
  uckpt-late   the same with late_snapshot=uckpt.torch.LateSnapshot(opt): parameters and
               momentum are copied while the next step's forward/backward run, finished
               in the optimizer's step pre-hook (Checkflow's snapshot-then-offload)
  uckpt-late2  uckpt-late with max_inflight=2: a second staging slot (one more copy of
               the state in host memory), so a save need not wait for the previous
               save's write (not run by default)

Saves happen at steps k, 2k, ... except in the last k steps, so that every save has
k steps of training after it, as in the middle of a long run; the wait for the last
write at the end (the drain) is still inside the total, and reported on its own.
Reported per method and k: total time, the overhead Omega = (T - T_none) / T_none (the
metric of the published checkpointing study; the median over rounds of each round's
ratio to that round's baseline, with the min..max spread), the training stall per save (time spent
inside the save call), and, for reference, the pure memcpy time of the same state
into preallocated host buffers. A second part measures RSS over 1,000 consecutive
async saves of a 50 MB state.

    .venv/bin/python benchmarks/bench_async.py                 # full run (~10 min)
    .venv/bin/python benchmarks/bench_async.py --steps 12 --ks 1 --rss-saves 200   # quick
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (RESULTS_DIR, cleanup, environment, fmt_bytes, malloc_trim,  # noqa: E402
                    markdown_table, rss_bytes, write_json)


def build(width: int, depth: int, seed: int = 0):
    import torch

    torch.manual_seed(seed)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(width, 10))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    return model, opt


def state_tensors(model, opt):
    out = list(model.state_dict().values())
    out += [s["momentum_buffer"] for s in opt.state.values() if "momentum_buffer" in s]
    return out


def memcpy_seconds(model, opt, repeat: int = 5) -> float:
    """Copy every tensor of the state into preallocated (warm) host buffers."""
    src = [t.detach().numpy() for t in state_tensors(model, opt)]
    dst = [np.empty_like(a) for a in src]
    best = float("inf")
    for _ in range(repeat + 1):
        t0 = time.perf_counter()
        for d, s in zip(dst, src):
            np.copyto(d, s)
        best = min(best, time.perf_counter() - t0)
    return best


class Method:
    """A checkpointing method: ``save(step)`` is timed as the training stall."""

    def __init__(self, name, model, opt, workdir: Path):
        import torch

        import uckpt
        import uckpt.torch

        self.name, self.model, self.opt = name, model, opt
        self.dir = workdir / name
        self.dir.mkdir(parents=True)
        self.manager = None
        self.late = uckpt.torch.LateSnapshot(opt) if name.startswith("uckpt-late") else None
        if name.startswith("uckpt"):
            self.manager = self.make_manager(uckpt, name)
        self.torch = torch

    def make_manager(self, uckpt, name: str):
        return uckpt.CheckpointManager(self.dir, keep_last=2,
                                       async_save=name in ("uckpt-async", "uckpt-late",
                                                           "uckpt-late2"),
                                       late_snapshot=self.late,
                                       max_inflight=2 if name == "uckpt-late2" else 1)

    def save(self, step: int) -> None:
        state = {"model": self.model, "optimizer": self.opt, "step": step}
        if self.manager is not None:
            self.manager.save(step, state)
            return
        path = self.dir / f"ckpt_{step}.pt"
        with open(path, "wb") as f:
            self.torch.save({"model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
                             "step": step}, f)
            f.flush()
            os.fsync(f.fileno())
        for old in sorted(self.dir.glob("ckpt_*.pt"), key=lambda p: int(p.stem[5:]))[:-2]:
            old.unlink()  # keep the last two, like the managers

    def finish(self) -> None:
        if self.manager is not None:
            self.manager.close()  # waits for the last async save: counted in the total
        if self.late is not None:
            self.late.close()


def train(method_name, k, steps, width, depth, batch, workdir, method_factory=None):
    """One run: ``steps`` training steps, a save every ``k`` (``method_factory(name,
    model, opt, workdir)`` makes the method; default :class:`Method`)."""
    import torch

    model, opt = build(width, depth)
    x = torch.randn(batch, width, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 10, (batch,), generator=torch.Generator().manual_seed(2))

    def step_fn():
        opt.zero_grad(set_to_none=False)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    step_fn()  # momentum buffers exist from here on; warm-up, untimed
    method = None if method_name == "none" else \
        (method_factory or Method)(method_name, model, opt, workdir)
    if method is not None:  # one untimed save+wait: allocator and staging warm, files created
        method.save(0)
        if method.manager is not None:
            method.manager.wait()
    stalls = []
    malloc_trim()
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        step_fn()
        # no save in the last k steps: as in the middle of a long run, every save has k
        # steps of training after it (the drain at the end is still timed, and reported)
        if method is not None and step % k == 0 and step <= steps - k:
            s0 = time.perf_counter()
            method.save(step)
            stalls.append(time.perf_counter() - s0)
    d0 = time.perf_counter()
    if method is not None:
        method.finish()
    drain = time.perf_counter() - d0
    total = time.perf_counter() - t0
    nbytes = sum(t.numel() * t.element_size() for t in state_tensors(model, opt))
    mc = memcpy_seconds(model, opt)
    if method is not None:
        cleanup(method.dir)
    return {"method": method_name, "k": k, "steps": steps, "total_s": total, "drain_s": drain,
            "stalls_s": stalls, "state_bytes": nbytes, "memcpy_s": mc}


def rss_run(saves: int, mb: int, root: Path):
    import uckpt

    arr = np.random.default_rng(0).standard_normal(mb * (1 << 20) // 8)
    marks = {}
    with uckpt.CheckpointManager(root, keep_last=2, async_save=True) as mgr:
        for i in range(1, saves + 1):
            arr[0] = i  # the state changes between saves
            mgr.save(i, {"w": arr, "i": i})
            if i in (10, 100, saves // 2, saves):
                mgr.wait()
                malloc_trim()
                marks[i] = rss_bytes()
    return marks


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=50, help="training steps per run")
    ap.add_argument("--ks", default="1,10", help="checkpoint intervals to measure")
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--depth", type=int, default=3, help="hidden Linear(width, width) layers")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--methods", default="torch.save,uckpt-sync,uckpt-async,uckpt-late")
    ap.add_argument("--repeat", type=int, default=3,
                    help="rounds; each round runs every (method, k) once; medians are kept")
    ap.add_argument("--dir", default=str(RESULTS_DIR), help="where checkpoints go (same disk as /work)")
    ap.add_argument("--results-dir", default=str(RESULTS_DIR), help="where the .md/.json/.png go")
    ap.add_argument("--rss-saves", type=int, default=1000)
    ap.add_argument("--rss-mb", type=int, default=50)
    ap.add_argument("--rss-dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None,
                    help="where the RSS run's checkpoints go (default /dev/shm: 50 GB of writes)")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    ks = [int(k) for k in args.ks.split(",")]
    work = Path(tempfile.mkdtemp(prefix="async-", suffix=".tmp", dir=args.dir))
    raw = []
    try:
        # rounds interleave the methods, so slow drift of the machine hits all alike
        runs = {}
        configs = [("none", 1)] + [(name, k) for k in ks for name in args.methods.split(",")]
        for rnd in range(args.repeat):
            for name, k in configs[rnd % len(configs):] + configs[:rnd % len(configs)]:
                r = train(name, k, args.steps, args.width, args.depth, args.batch, work)
                runs.setdefault((name, k), []).append(r)
                print(f"round {rnd + 1}: k={k:<3} {name:<12} total {r['total_s']:.2f} s", flush=True)

        def median_run(name, k):
            rs = sorted(runs[(name, k)], key=lambda r: r["total_s"])
            return rs[len(rs) // 2]

        base = median_run("none", 1)
        raw.append(base)
        print(f"baseline: {base['total_s']:.2f} s for {args.steps} steps "
              f"({base['total_s'] / args.steps * 1e3:.0f} ms/step), state {fmt_bytes(base['state_bytes'])}, "
              f"memcpy {base['memcpy_s'] * 1e3:.1f} ms", flush=True)
        for k in ks:
            for name in args.methods.split(","):
                r = median_run(name, k)
                raw.append(r)
                # each round's ratio to the same round's baseline: drift hits both alike
                per_round = [m["total_s"] / b["total_s"] - 1
                             for m, b in zip(runs[(name, k)], runs[("none", 1)])]
                omega = statistics.median(per_round)
                r.update(omega_rounds=per_round)
                stall = statistics.median(r["stalls_s"]) if r["stalls_s"] else float("nan")
                r.update(omega=omega, stall_median_s=stall)
                print(f"k={k:<3} {name:<12} total {r['total_s']:.2f} s  Omega {omega * 100:6.2f}%  "
                      f"stall/save {stall * 1e3:7.1f} ms", flush=True)
        baseline_runs = ", ".join(f"{r['total_s']:.2f}" for r in runs[("none", 1)])
        table = []
        by = {(r["method"], r["k"]): r for r in raw}
        for k in ks:
            sync = by.get(("uckpt-sync", k))
            tsave = by.get(("torch.save", k))
            for name in args.methods.split(","):
                r = by[(name, k)]
                table.append([
                    str(k), name, f"{r['total_s']:.2f}", f"{r['omega'] * 100:.2f}%",
                    f"{min(r['omega_rounds']) * 100:.1f} .. {max(r['omega_rounds']) * 100:.1f}%",
                    str(len(r["stalls_s"])), f"{r['stall_median_s'] * 1e3:.1f}",
                    f"{r['drain_s'] * 1e3:.0f}",
                    f"{r['stall_median_s'] / r['memcpy_s']:.2f}x",
                    f"{r['stall_median_s'] / sync['stall_median_s'] * 100:.1f}%" if sync else "-",
                    f"{r['omega'] / tsave['omega']:.3f}" if tsave and tsave["omega"] > 0 else "-",
                ])
        headers = ["k", "method", "total s", "Omega", "Omega spread", "saves", "stall/save ms", "drain ms",
               "stall / memcpy",
                   "stall / sync stall", "Omega / torch.save Omega"]
        text = ["# Checkpoint overhead in a CPU training loop",
                "",
                f"Model: MLP {args.depth} x Linear({args.width}, {args.width}) + head, SGD momentum; "
                f"state {fmt_bytes(base['state_bytes'])} (parameters + momentum). "
                f"{args.steps} steps of batch {args.batch}; baseline {base['total_s']:.2f} s "
                f"({base['total_s'] / args.steps * 1e3:.0f} ms/step). memcpy of the state into warm "
                f"buffers: {base['memcpy_s'] * 1e3:.1f} ms. Median of {args.repeat} interleaved rounds. "
                f"Baseline runs: {baseline_runs} s. "
                f"Checkpoints to {work} (every save fsynced).",
                "", markdown_table(headers, table), ""]
        if args.rss_saves:
            rss_root = Path(tempfile.mkdtemp(prefix="uckpt-rss-", dir=args.rss_dir))
            try:
                marks = rss_run(args.rss_saves, args.rss_mb, rss_root)
            finally:
                cleanup(rss_root)
            first = marks.get(100)
            text += [f"RSS over {args.rss_saves} consecutive async saves of a {args.rss_mb} MB state "
                     f"(to {args.rss_dir}):", "",
                     markdown_table(["after save", "RSS", "vs after 100"],
                                    [[str(i), fmt_bytes(v), f"{(v / first - 1) * 100:+.1f}%" if first else "-"]
                                     for i, v in sorted(marks.items())]), ""]
            raw.append({"rss_marks": marks})
        text.append("Environment: " + ", ".join(f"{k}={v}" for k, v in environment().items()
                                                 if k in ("cpu_count", "torch", "numpy", "uckpt", "platform")))
        out = "\n".join(text)
        print(out)
        results = Path(args.results_dir)
        results.mkdir(exist_ok=True)
        (results / "async_overhead.md").write_text(out + "\n")
        write_json(results / "async_overhead.json", {"args": vars(args), "runs": raw,
                                                     "environment": environment()})
        _plot(raw, ks, args.methods.split(","), results / "async_overhead.png")
    finally:
        cleanup(work)
    return 0


def _plot(raw, ks, methods, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = {(r.get("method"), r.get("k")): r for r in raw if "method" in r}
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(methods)
    for i, name in enumerate(methods):
        vals = [by[(name, k)]["omega"] * 100 for k in ks]
        ax.bar([j + i * width for j in range(len(ks))], vals, width, label=name)
    ax.set_xticks([j + width * (len(methods) - 1) / 2 for j in range(len(ks))])
    ax.set_xticklabels([f"every {k} step(s)" for k in ks])
    ax.set_ylabel("overhead Omega (%)")
    ax.set_yscale("symlog", linthresh=1)
    ax.legend()
    ax.set_title("Checkpoint overhead in a CPU training loop")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
