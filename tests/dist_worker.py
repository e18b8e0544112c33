"""Distributed saves and loads, run under mpiexec or as torch.distributed ranks.

usage: dist_worker.py {mpi,torch} SCENARIO DIR [ARG]
Run by tests/test_distributed.py; each rank prints ``RESULT <json>`` lines.

The state is a real PyTorch model and Adam optimizer (replicated: the same on
every rank) plus a ZeRO-style sharded tensor: rows split across the ranks on
save, columns (or any other split) on load. Every value derives from fixed
seeds, so a loader of any size can rebuild what was saved and compare bits.
"""
import contextlib
import json
import logging
import os
import sys
import time

import numpy as np

SHARD_SHAPE = (24, 40)


def report(**kw):
    print("\nRESULT " + json.dumps(kw), flush=True)


def init(backend, timeout=60.0):
    if backend == "torch":
        from datetime import timedelta

        import torch.distributed as dist
        dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=timeout))
    else:
        from mpi4py import MPI  # noqa: F401  (detection: mpi4py imported -> MPI)
    from uckpt.comm import get_communicator
    return get_communicator(None, timeout=timeout)


def model_and_optimizer(seed):
    import torch
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 32))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return model, opt


def trained(seed=0):
    """The model and optimizer after two steps: what every rank saves."""
    import torch
    model, opt = model_and_optimizer(seed)
    g = torch.Generator().manual_seed(1)
    for _ in range(2):
        x = torch.randn(16, 64, generator=g)
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def full_shard():
    return np.random.default_rng(5).standard_normal(SHARD_SHAPE).astype(np.float32)


class _Uploads(logging.Handler):
    """Collects the objects this process uploaded (the S3 client logs each at DEBUG)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.urls = []

    def emit(self, record):
        words = record.getMessage().split()
        if words[0] in ("put", "uploaded") and words[1].startswith("s3://"):
            self.urls.append(words[1])


@contextlib.contextmanager
def uploads_seen():
    handler, log = _Uploads(), logging.getLogger("uckpt.storage.s3")
    level = log.level
    log.setLevel(logging.DEBUG)
    log.addHandler(handler)
    try:
        yield handler.urls
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def bounds(n, parts, i):
    edges = np.linspace(0, n, parts + 1).round().astype(int)
    return int(edges[i]), int(edges[i + 1])


def save_state(rank, size):
    import uckpt
    model, opt = trained()
    lo, hi = bounds(SHARD_SHAPE[0], size, rank)
    zero = uckpt.Shard(full_shard()[lo:hi].copy(), SHARD_SHAPE, (lo, 0))
    return {"model": model, "optimizer": opt, "zero": zero, "step": 7,
            "rank_state": uckpt.PerRank({"seed": np.array([100 + rank])})}


def tensors_equal(a, b):
    import torch
    return all(torch.equal(x, y) for x, y in zip(a, b))


def check_loaded(directory, rank, size, split):
    """Load into fresh objects (another seed) on this job's ranks, slicing the
    sharded tensor by ``split`` ("rows" or "cols"); compare bits with the original."""
    import uckpt
    model, opt = model_and_optimizer(seed=123)
    ref_model, ref_opt = trained()
    axis = 0 if split == "rows" else 1
    lo, hi = bounds(SHARD_SHAPE[axis], size, rank)
    local = np.zeros((hi - lo, SHARD_SHAPE[1]) if axis == 0 else (SHARD_SHAPE[0], hi - lo), np.float32)
    offsets = (lo, 0) if axis == 0 else (0, lo)
    state = {"model": model, "optimizer": opt, "zero": uckpt.Shard(local, SHARD_SHAPE, offsets),
             "step": None}
    if rank < uckpt.manifest(directory).world_size:  # per-rank state exists for this rank
        state["rank_state"] = uckpt.PerRank({"seed": np.zeros(1, np.int64)})
    out = uckpt.load(directory, state, strict=False)
    want = full_shard()[lo:hi] if axis == 0 else full_shard()[:, lo:hi]
    opt_ok = all(tensors_equal([s[k] for s in sorted_state(opt)], [s[k] for s in sorted_state(ref_opt)])
                 for k in ("exp_avg", "exp_avg_sq", "step"))
    return {
        "model": tensors_equal(model.state_dict().values(), ref_model.state_dict().values()),
        "optimizer": opt_ok and opt.state_dict()["param_groups"] == ref_opt.state_dict()["param_groups"],
        "zero": bool(np.array_equal(local.view(np.uint32), want.view(np.uint32))),
        "step": out["step"],
        "rank_state": int(state["rank_state"].value["seed"][0]) if "rank_state" in state else None,
    }


def sorted_state(opt):
    sd = opt.state_dict()["state"]
    return [sd[k] for k in sorted(sd)]


def big_state(mb):
    """Replicated arrays, ``mb`` MB in all, of several sizes (the same on every rank;
    uniform draws: half the CPU of normal ones, which each rank paid for 400 MB)."""
    rng = np.random.default_rng(3)
    sizes = [int(mb * 2 ** 20 * f) // 4 for f in (0.3, 0.2, 0.15, 0.1, 0.1, 0.05, 0.05, 0.05)]
    out = {f"w{i}": rng.random(n, dtype=np.float32) for i, n in enumerate(sizes)}
    out.update({f"b{i}": np.full(100 + i, i, np.float32) for i in range(40)})
    return out


def main():
    backend, scenario, directory = sys.argv[1], sys.argv[2], sys.argv[3]
    arg = sys.argv[4] if len(sys.argv) > 4 else None
    timeout = float(os.environ.get("DIST_TIMEOUT", "60"))
    c = init(backend, timeout)
    rank, size = c.rank, c.size
    import uckpt
    from uckpt.errors import UckptError

    if scenario == "save":
        with uploads_seen() as uploaded:  # DIR may be an s3:// URL (tests/test_s3_tier.py)
            uckpt.save(directory, save_state(rank, size), step=7, compression=arg)  # arg: None or "zstd"
        report(rank=rank, saved=True, uploaded=uploaded)
    elif scenario == "load":
        report(rank=rank, **check_loaded(directory, rank, size, arg))
    elif scenario == "balance":
        uckpt.save(directory, big_state(float(arg)))
        back = uckpt.load(directory)
        ok = all(np.array_equal(v, back[k]) for k, v in big_state(float(arg)).items())
        report(rank=rank, ok=ok)
    elif scenario in ("mismatch", "badobj", "differs", "diverged"):
        state = {"w": np.arange(10.0), "step": 7}
        if scenario == "mismatch" and rank == 1:
            state["step"] = 8
        if scenario == "badobj" and rank == 2:
            state["bad"] = object()
        elif scenario == "badobj":
            state["bad"] = None
        if scenario == "differs":
            state["seed"] = np.array([rank])
        if scenario == "diverged":  # a large replica that drifted apart on rank 3
            state["layer"] = np.random.default_rng(1 + (rank == 3)).standard_normal((512, 1024))
        out = {"raised": None}
        try:
            uckpt.save(directory, state)
        except UckptError as e:
            out = {"raised": type(e).__name__, "msg": str(e), "failures": getattr(e, "failures", None)}
        c.barrier()
        report(rank=rank, committed=os.path.exists(directory), debris=sorted(
            n for n in os.listdir(os.path.dirname(directory)) if "uckpt-tmp" in n), **out)
    elif scenario == "kill":
        # step 1 commits; during step 2 the test SIGKILLs rank 2 (once its data file appears)
        with open(f"{directory}.pid-{rank}", "w") as f:
            f.write(str(os.getpid()))
        with uckpt.CheckpointManager(directory, comm=c) as m:
            m.save(1, save_state(rank, size))
            state = save_state(rank, size)
            state["big"] = big_state(float(arg))
            t0 = time.monotonic()
            try:
                m.save(2, state)
                report(rank=rank, raised=None)
            except UckptError as e:
                report(rank=rank, raised=type(e).__name__, msg=str(e),
                       elapsed=time.monotonic() - t0)
        sys.stdout.flush()
        time.sleep(0.5)
        os._exit(0)  # the job is broken: MPI_Finalize / gloo teardown could wait for the dead rank
    elif scenario == "signal":
        # SIGTERM reaches rank 1 only, at step 5: every rank must save the same step, exit 0
        import signal
        policy = uckpt.EveryNSteps(1000) | uckpt.OnSignal()
        with uckpt.CheckpointManager(directory, comm=c, save_policy=policy, async_save=True) as m:
            state = save_state(rank, size)
            try:
                for step in range(1, 40):
                    if rank == 1 and step == 5:
                        os.kill(os.getpid(), signal.SIGTERM)
                    state["step"] = step
                    if m.should_save(step):
                        m.save(step, state)
                report(rank=rank, exited=None)
            except SystemExit as e:
                report(rank=rank, exited=e.code, step=step, steps=m.steps())
    elif scenario == "two_steps":
        with uckpt.CheckpointManager(directory, comm=c) as m:
            for step in (1, 2):
                state = save_state(rank, size)
                state["step"] = step
                m.save(step, state)
        report(rank=rank, saved=True)
    elif scenario == "plan_cache":  # three saves; the third with a new leaf on rank 2
        records = []
        handler = logging.Handler(logging.DEBUG)
        handler.emit = lambda r: records.append(r.getMessage().split(": ", 1)[1])
        log = logging.getLogger("uckpt.saving.plan_cache")
        log.addHandler(handler)
        log.setLevel(logging.DEBUG)
        lo, hi = bounds(SHARD_SHAPE[0], size, rank)
        with uckpt.CheckpointManager(directory, comm=c) as m:
            for step in (1, 2, 3):
                mine = {"seed": np.array([rank + step])}
                if step == 3 and rank == 2:
                    mine["extra"] = np.ones(3)
                m.save(step, {"zero": uckpt.Shard(full_shard()[lo:hi] + step, SHARD_SHAPE,
                                                  (lo, 0)),
                              "w": np.arange(6.0) * step, "step": step,
                              "mine": uckpt.PerRank(mine)})
        log.removeHandler(handler)
        report(rank=rank, records=records)
    elif scenario == "restore":
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with uckpt.CheckpointManager(directory, comm=c) as m:
                got = check_loaded_manager(m, rank, size)
        report(rank=rank, warnings=[str(w.message) for w in caught], **got)
    elif scenario == "bad_target":  # rank 2's destination has the wrong shape
        lo, hi = bounds(SHARD_SHAPE[0], size, rank)
        rows = hi - lo + (1 if rank == 2 else 0)
        local = np.zeros((rows, SHARD_SHAPE[1]), np.float32)
        try:
            uckpt.load(directory, {"zero": uckpt.Shard(local, (SHARD_SHAPE[0] + (rank == 2),
                                                              SHARD_SHAPE[1]), (lo, 0))},
                       strict=False)
            report(rank=rank, raised=None)
        except UckptError as e:
            report(rank=rank, raised=type(e).__name__, msg=str(e), untouched=not local.any())
    elif scenario == "tiers":
        fast, durable = directory + "/fast", directory + "/durable"
        if arg:  # a durable tier compressed while copying (tests/test_compress_distributed.py)
            durable = uckpt.Tier(durable, compression=arg)
        with uckpt.CheckpointManager(tiers=[fast, durable], keep_last=2, async_save=True,
                                     comm=c) as m:
            for step in (1, 2, 3):
                state = save_state(rank, size)
                state["step"] = step
                h = m.save(step, state)
                assert not isinstance(h, (str, os.PathLike)), h  # async: a handle
            m.wait()
            fast_steps = [s for s in m.steps() if "fast" in m.tiers_of(s)]
            durable_steps = [s for s in m.steps() if "durable" in m.tiers_of(s)]
        c.barrier()
        if rank == 0:  # node loss: the fast tier is gone
            import shutil
            shutil.rmtree(fast)
        c.barrier()
        with uckpt.CheckpointManager(tiers=[fast, durable], comm=c) as m:
            got = check_loaded_manager(m, rank, size)
        report(rank=rank, fast=fast_steps, durable=durable_steps, **got)
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    if backend == "torch":
        c.barrier()
        sys.stdout.flush()
        # torch's gloo worker threads can abort the interpreter's shutdown right after a
        # collective ("terminate called without an active exception"), a torch bug that
        # has nothing to do with what is tested: every rank is done, so leave at once
        # (not under MPI: MPICH reports a rank that exits without MPI_Finalize)
        os._exit(0)


def check_loaded_manager(m, rank, size):
    import uckpt
    model, opt = model_and_optimizer(seed=9)
    ref_model, _ = trained()
    lo, hi = bounds(SHARD_SHAPE[0], size, rank)
    local = np.zeros((hi - lo, SHARD_SHAPE[1]), np.float32)
    state = {"model": model, "optimizer": opt, "zero": uckpt.Shard(local, SHARD_SHAPE, (lo, 0)),
             "step": None, "rank_state": uckpt.PerRank({"seed": np.zeros(1, np.int64)})}
    step = m.restore(state)
    return {"restored": step, "step": state["step"],
            "model": tensors_equal(model.state_dict().values(), ref_model.state_dict().values()),
            "zero": bool(np.array_equal(local, full_shard()[lo:hi])),
            "rank_state": int(state["rank_state"].value["seed"][0])}


if __name__ == "__main__":
    main()
