"""Latency tails of loads and async-save stalls, with and without uckpt's garbage-collector pause.

A training process holds a few hundred thousand objects that Python's cyclic collector
tracks (torch alone brings most of them). A ``uckpt.load`` allocates a few thousand
short-lived containers (the parsed manifest, the match, the read plan); without a pause,
CPython's thresholds now and then make one of them set off a full collection of the
whole heap inside the call. ``uckpt.runtime.gcpause`` keeps the collector paused while a save or
load runs on the caller's thread (``knobs.pause_gc``); this script measures both ways in
one process, in interleaved rounds, on the ResNet50- or VGG16-sized state of bench_sync:

- ``load``: ``uckpt.load(path, state)`` in place, from the page cache;
- ``async stall``: ``CheckpointManager(async_save=True).save`` (the part that blocks
  training), each save waited for, untimed, before the next.

For each: median, mean, p90, p99 and max latency, and the collections of each generation
that ran inside the timed calls (``gc.callbacks``).

    .venv/bin/python benchmarks/bench_gc_pause.py                  # ResNet50, 10 rounds of 20
    .venv/bin/python benchmarks/bench_gc_pause.py --rounds 3 --calls 10 --heap 500000

Results: stdout and ``results/gc_pause_<size>.{md,json,png}``.
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402

REPO = C.BENCH_DIR.parent
for _p in (REPO / "src", REPO / "adapters"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import uckpt  # noqa: E402
from uckpt import knobs  # noqa: E402

MODES = {"paused (default)": 1, "not paused": 0}


class Collections:
    """Counts the collections of each generation that start while ``active``."""

    def __init__(self) -> None:
        self.active = False
        self.counts = [0, 0, 0]

    def __call__(self, phase: str, info: dict) -> None:
        if self.active and phase == "start":
            self.counts[info["generation"]] += 1


def _timed_calls(fn: Callable[[], object], calls: int, seen: Collections,
                 into: List[float], after: Callable[[object], None] = lambda r: None) -> None:
    for _ in range(calls):
        seen.active = True
        t = time.perf_counter()
        result = fn()
        dt = time.perf_counter() - t
        seen.active = False
        into.append(dt)
        after(result)


def run(args) -> str:
    spec = C.SPECS[args.size]()
    model, opt = C.build_state(spec, seed=0, lr=0.1)
    model2, opt2 = C.build_state(spec, seed=1, lr=0.05)
    src = C.flat_tensors(model, opt)
    heap = [{"i": i, "more": [i]} for i in range(args.heap)]  # long-lived, like an app's own
    work = Path(tempfile.mkdtemp(prefix="gc-pause-", dir=args.dir))
    times: Dict[str, List[float]] = {}
    seen = {key: Collections() for key in
            [f"{op}, {mode}" for op in ("load", "async stall") for mode in MODES]}
    for s in seen.values():
        gc.callbacks.append(s)
    manager = None
    try:
        ck = work / "ck"
        uckpt.save(ck, {"model": model, "optimizer": opt})
        state = {"model": model2, "optimizer": opt2}
        manager = uckpt.CheckpointManager(work / "async", async_save=True, keep_last=2)
        step = [0]

        def stall():
            step[0] += 1
            return manager.save(step[0], {"model": model, "optimizer": opt})

        ops = {"load": (lambda: uckpt.load(ck, state), lambda r: None),
               "async stall": (stall, lambda handle: handle.wait())}
        for name, (fn, after) in ops.items():  # warm-up, collector left as it is
            after(fn())
        tracked = len(gc.get_objects())
        for r in range(args.rounds):
            order = list(MODES.items())
            if r % 2:
                order.reverse()
            for mode, flag in order:
                knobs.pause_gc = flag
                for op, (fn, after) in ops.items():
                    key = f"{op}, {mode}"
                    _timed_calls(fn, args.calls, seen[key], times.setdefault(key, []), after)
        knobs.pause_gc = 1
        problem = C.verify_same(src, C.flat_tensors(model2, opt2))
        if problem:
            raise SystemExit(f"the loaded state differs: {problem}")
    finally:
        knobs.pause_gc = 1
        for s in seen.values():
            gc.callbacks.remove(s)
        if manager is not None:
            manager.close()
        C.cleanup(work)
    del heap
    return report(args, tracked, times, {k: s.counts for k, s in seen.items()})


def _pct(values: List[float], q: float) -> float:
    return float(np.percentile(values, q))


def report(args, tracked: int, times: Dict[str, List[float]], collections) -> str:
    head = ["call, collector", "median ms", "mean ms", "p90 ms", "p99 ms", "max ms",
            "collections in the calls (gen 0/1/2)"]
    rows = [[k, f"{statistics.median(v) * 1e3:.1f}", f"{statistics.mean(v) * 1e3:.1f}",
             f"{_pct(v, 90) * 1e3:.1f}", f"{_pct(v, 99) * 1e3:.1f}", f"{max(v) * 1e3:.1f}",
             "/".join(str(n) for n in collections[k])] for k, v in times.items()]
    text = "\n".join([
        f"# uckpt's garbage-collector pause: latency of loads and async-save stalls, {args.size}",
        "",
        f"{tracked} objects tracked by the collector (heap of {args.heap} extra); "
        f"{args.rounds} interleaved rounds of {args.calls} calls per row.",
        C.machine_line(),
        "",
        C.markdown_table(head, rows),
        "",
    ])
    rd = Path(args.results_dir)
    rd.mkdir(parents=True, exist_ok=True)
    (rd / f"gc_pause_{args.size}.md").write_text(text)
    C.write_json(rd / f"gc_pause_{args.size}.json", {
        "benchmark": "gc_pause", "size": args.size, "tracked_objects": tracked,
        "heap": args.heap, "rounds": args.rounds, "calls": args.calls,
        "environment": C.environment(), "seconds": times, "collections": collections})
    names = list(times)
    C.bar_plot_or_note(rd / f"gc_pause_{args.size}.png",
                       f"loads and async stalls, {args.size}: mean (bar) and median (tick)",
                       names, {"mean": [statistics.mean(times[k]) for k in names]},
                       mins={"mean": [statistics.median(times[k]) for k in names]},
                       ylabel="seconds (mean; tick = median)")
    return text


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="resnet50", choices=sorted(C.SPECS))
    p.add_argument("--rounds", type=int, default=10, help="interleaved rounds (default 10)")
    p.add_argument("--calls", type=int, default=20, help="timed calls per row and round")
    p.add_argument("--heap", type=int, default=0,
                   help="extra long-lived tracked objects, beside torch's own (default 0)")
    p.add_argument("--dir", default=str(C.RESULTS_DIR),
                   help="where the temporary checkpoints go (removed afterwards)")
    p.add_argument("--results-dir", default=str(C.RESULTS_DIR))
    args = p.parse_args(argv)
    if args.rounds < 1 or args.calls < 1 or args.heap < 0:
        p.error("--rounds and --calls must be at least 1, --heap at least 0")
    print(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
