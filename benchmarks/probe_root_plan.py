"""Rank 0's planning of a first save of several ranks, on one thread: the whole plan from
every rank's gathered metadata and each rank's share of it (what ``saving/root_plan.py``
computes before it scatters), for bench_scale.py's state (2,000 row-sharded tensors, 100
replicated ones).

    PYTHONPATH=$PWD/src python benchmarks/probe_root_plan.py --ranks 16,64,256 [--profile]

Prints the median CPU seconds per rank count (and, with ``--profile``, a cProfile of the
largest). The gathered list is built as a save builds it: each rank's
:func:`~uckpt.saving.global_plan.local_metadata`, ``compact``-ed, then ``expand``-ed. On a
tree without ``global_columns`` (before issue 27 item 3) it times ``global_plan`` and the
loop that made the shares from its items.
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import os
import pickle
import pstats
import statistics
import time
from typing import Any, Dict, List

import numpy as np

import uckpt
from uckpt.runtime.gcpause import paused
from uckpt.saving import global_plan as G
from uckpt.saving.global_plan import compact, expand, local_metadata
from uckpt.tree.flatten import flatten


def gathered_for(world: int, tensors: int, replicated: int) -> List[Dict[str, Any]]:
    """Every rank's metadata as rank 0 holds it after the gather (replicated lists shared)."""
    out = []
    norms = {f"norm.{j}": np.full(16, j, dtype=np.float32) for j in range(replicated)}
    for rank in range(world):
        model = {f"layers.{i}.weight": uckpt.Shard(np.zeros((2, 4), np.float32),
                                                   (2 * world, 4), (2 * rank, 0))
                 for i in range(tensors)}
        meta = local_metadata(flatten({"model": model, "norms": norms, "step": 1}, rank))
        meta["key"] = str(rank)
        out.append(compact(meta, rank))
    expand(out)
    return out


def plan_at_root(gathered: List[Dict[str, Any]]) -> int:
    """Rank 0's planning; returns the number of chunks."""
    if hasattr(G, "global_columns"):
        _, columns = G.global_columns(gathered)
        return sum(len(paths) for paths, *_ in columns.shares())
    gp = G.global_plan(gathered, 0)
    shares: List[List[Any]] = [[] for _ in gathered]
    for it in gp.plan.items:
        shares[it.rank].append([it.path, it.start, it.shape, it.offset, it.length])
    return sum(len(s) for s in shares)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="16,64,256")
    p.add_argument("--tensors", type=int, default=2000)
    p.add_argument("--replicated", type=int, default=100)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--collector", choices=("paused", "running"), default="paused",
                   help="Python's garbage collector during the planning: paused, as in a "
                        "save by uckpt.save or a CheckpointManager (uckpt.runtime.gcpause), "
                        "or running (default paused)")
    p.add_argument("--cache", metavar="DIR",
                   help="keep the gathered metadata in DIR (pickles made by this script), so "
                        "that runs of two trees plan the very same input without rebuilding it")
    args = p.parse_args()
    for world in [int(x) for x in args.ranks.split(",")]:
        cached = os.path.join(args.cache or "", f"gathered-{world}-{args.tensors}-"
                              f"{args.replicated}.pickle")
        if args.cache and os.path.exists(cached):
            with open(cached, "rb") as f:
                gathered = pickle.load(f)  # written by this script (--cache)
        else:
            gathered = gathered_for(world, args.tensors, args.replicated)
            if args.cache:
                with open(cached, "wb") as f:
                    pickle.dump(gathered, f)
        times = []
        for _ in range(args.repeat):
            with paused() if args.collector == "paused" else contextlib.nullcontext():
                t = time.process_time()
                chunks = plan_at_root(gathered)
                times.append(time.process_time() - t)
        print(f"ranks {world}: rank 0's planning, CPU s median {statistics.median(times):.3f} "
              f"(runs {', '.join(f'{x:.3f}' for x in times)}; {chunks} chunks; collector "
              f"{args.collector}; "
              f"load average {os.getloadavg()[0]:.1f})", flush=True)
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        plan_at_root(gathered)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
