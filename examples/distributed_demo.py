"""Data-parallel training on 4 ranks that checkpoints with every rank, loses a rank,
resumes exactly, and loads its checkpoint on 2 ranks.

    .venv/bin/python examples/distributed_demo.py [--ranks 4] [--steps 20]

Runs torch.distributed (gloo, CPU) ranks as local processes:

1. a reference run of ``--steps`` steps, uninterrupted;
2. the same run, checkpointing asynchronously every 5 steps (every rank writes
   its share of the replicated model and optimizer, and its own RNG state);
   one rank is SIGKILLed mid-run, which ends the job (1 and 2 are one job: each rank
   trains the reference, then starts over from the same seeds with checkpoints, so
   the ranks start once);
3. a new job of the same size restores the newest checkpoint on every rank
   (nobody broadcasts anything) and finishes: its losses are compared bit for
   bit with the reference run;
4. a job of half the size loads the final checkpoint and checks every rank sees
   the same model as the reference.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = str(Path(__file__).resolve().parent.parent / "src")
EVERY = 5


def worker(mode: str, root: str, steps: int, kill_at: int) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if mode == "killed":  # the reference first, in the same job: its ranks start once
        train("reference", root + "-ref", steps, 0)
    train(mode, root, steps, kill_at)
    dist.barrier()
    os._exit(0)  # gloo's threads may abort an ordinary interpreter shutdown


def train(mode: str, root: str, steps: int, kill_at: int) -> None:
    """One run from the seeds (``reference``: no checkpoints; ``killed``: one rank dies at
    ``kill_at``; ``resume``: from the newest checkpoint; ``load``: the model only)."""
    import numpy as np
    import torch
    import torch.distributed as dist

    import uckpt

    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same model on every rank ...
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Dropout(0.1),
                                torch.nn.Linear(64, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    torch.manual_seed(1000 + rank)  # ... each rank its own dropout masks and batches
    data = torch.Generator().manual_seed(2000 + rank)
    state = {"model": model, "optimizer": opt, "step": 0,
             "rank": uckpt.PerRank({"rng": uckpt.RandomState(), "data": data})}
    manager = uckpt.CheckpointManager(root, comm=None, async_save=True, keep_last=2,
                                      save_policy=uckpt.EveryNSteps(EVERY))
    losses = {}
    if mode == "load":  # a different number of ranks: the model only (per-rank state stays)
        del state["rank"]
        manager.restore(state, strict=False)
        digest = float(sum(p.double().sum() for p in model.parameters()))
        print("RESULT " + json.dumps({"mode": mode, "rank": rank, "digest": digest}),
              flush=True)
        manager.close()
        return
    start = 1
    if mode == "resume":
        start = manager.restore(state) + 1
    for step in range(start, steps + 1):
        if mode == "killed" and step == kill_at and rank == size - 1:
            # node loss between saves: once its last save is committed, so that what the
            # demo prints does not depend on how busy the machine is (the crash tests
            # kill savers mid-save)
            manager.wait()
            os.kill(os.getpid(), signal.SIGKILL)
        x = torch.randn(32, 16, generator=data)
        loss = (model(x) - x[:, :1].sin()).square().mean()
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():  # data parallelism: average the gradients
            dist.all_reduce(p.grad)
            p.grad /= size
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses[step] = int(np.float32(total.item()).view(np.uint32))
        state["step"] = step
        if mode != "reference" and manager.should_save(step):
            manager.save(step, state)
    manager.close()
    digest = float(sum(p.double().sum() for p in model.parameters()))
    print("RESULT " + json.dumps({"mode": mode, "rank": rank, "losses": losses,
                                  "digest": digest}), flush=True)


def launch(n: int, *args: str) -> tuple:
    """Exit codes and ``{mode: {rank: result}}`` of a job of ``n`` ranks."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    procs = []
    for r in range(n):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(r),
                   WORLD_SIZE=str(n), PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", *args], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results, codes = {}, []
    for p in procs:
        out, _ = p.communicate(timeout=300)
        codes.append(p.returncode)
        for line in out.splitlines():
            if line.startswith("RESULT "):
                res = json.loads(line[7:])
                results.setdefault(res["mode"], {})[res["rank"]] = res
    return codes, results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        mode, root, steps, kill_at = args.worker
        worker(mode, root, int(steps), int(kill_at))
        return 0
    n, steps, kill_at = args.ranks, args.steps, args.steps * 2 // 3
    with tempfile.TemporaryDirectory(prefix="uckpt-dist-demo-") as tmp:
        root = os.path.join(tmp, "ckpt")
        t0 = time.perf_counter()
        codes, first_job = launch(n, "killed", root, str(steps), str(kill_at))
        ref = first_job["reference"]
        print(f"1. reference run: {n} ranks, {steps} steps, no checkpoints")
        import uckpt
        saved = [int(p.name[5:]) for p in sorted(Path(root).glob("step_*"))]
        m = uckpt.manifest(Path(root) / f"step_{saved[-1]:08d}")
        per_rank = {f: e.size for f, e in m.files.items()}
        print(f"2. checkpointed run: rank {n - 1} SIGKILLed at step {kill_at} (exit codes {codes}); "
              f"committed: steps {saved}; step {saved[-1]} was written by {m.world_size} ranks, "
              f"bytes per data file: {sorted(per_rank.values())}")
        _, resumed = launch(n, "resume", root, str(steps), "0")
        resumed = resumed["resume"]
        first = min(int(s) for s in resumed[0]["losses"])
        same = all(resumed[r]["losses"] == {s: v for s, v in ref[r]["losses"].items() if int(s) >= first}
                   for r in range(n))
        print(f"3. resumed on {n} ranks from step {first - 1}: steps {first}..{steps} "
              f"{'bitwise identical' if same else 'DIFFERENT'} to the reference run on every rank")
        _, loaded = launch(max(1, n // 2), "load", root, str(steps), "0")
        loaded = loaded["load"]
        agree = all(res["digest"] == ref[0]["digest"] for res in loaded.values())
        print(f"4. loaded on {len(loaded)} ranks: final model {'identical' if agree else 'DIFFERENT'} "
              f"to the reference on every rank  [{time.perf_counter() - t0:.0f} s]")
        return 0 if same and agree else 1


if __name__ == "__main__":
    sys.exit(main())
