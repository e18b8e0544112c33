"""A training job on simulated nodes whose first tier is the memory level, run under
mpiexec or torchrun (gloo) by tests/test_shm_restart.py.

usage: shm_worker.py {mpi,torch} {train,restore} SHM_NAME DURABLE RANKS_PER_NODE PIDS
       [SCHEME]

Each rank sets ``UCKPT_NODE=node<rank // RANKS_PER_NODE>`` before it makes its manager,
whose tiers are ``shm://SHM_NAME-{node}`` (keep=1) and the directory DURABLE. The state
is ZeRO-3 style: every rank owns a slice of the parameters and of the optimizer's
moments (``uckpt.Shard``), four small replicated arrays (spread over the ranks' files, so
a rank reads some from other nodes' copies), and its own RNG state and step
(``uckpt.PerRank``). Every value is a function of the step, so a restore can
be checked bit for bit.

* ``train``: writes its pid to ``PIDS/<rank>``, then saves async at steps 1, 2, ... until
  it is killed (at most 500 steps);
* ``restore``: restores the newest step and prints ``RESULT <json>`` (the step, whether
  every array equals the step's, the tier the manager logged, and the lines logged about
  rebuilding a step).

With SCHEME (tests/test_redundant_restart.py), the memory level has ``redundancy=SCHEME``.
"""
import logging
import os
import sys
import time

import numpy as np

ROWS, COLS = 64, 32


def full(step, what):
    seed = {"param": 1, "exp_avg": 2, "exp_avg_sq": 3}[what]
    return np.random.default_rng([seed, step]).standard_normal((ROWS, COLS)).astype(np.float32)


def state(step, rank, size, zero=False):
    import uckpt

    lo, hi = rank * ROWS // size, (rank + 1) * ROWS // size
    out = {}
    for what in ("param", "exp_avg", "exp_avg_sq"):
        part = full(step, what)[lo:hi]
        out[what] = uckpt.Shard(np.zeros_like(part) if zero else part.copy(), (ROWS, COLS),
                                (lo, 0))
    for i in range(4):  # replicated: the planner spreads them over the writers' files
        rep = np.random.default_rng([9, i, step]).standard_normal(4096).astype(np.float32)
        out[f"rep{i}"] = np.zeros_like(rep) if zero else rep
    rng = np.random.default_rng([7, rank, step]).integers(0, 2**62, 4, dtype=np.int64)
    out["rank_state"] = uckpt.PerRank({"rng": np.zeros_like(rng) if zero else rng,
                                       "step": np.array([0 if zero else step])})
    return out


def arrays(s):
    """Every array of a state made by :func:`state`, by name."""
    out = {k: s[k].array for k in ("param", "exp_avg", "exp_avg_sq")}
    out.update({k: v for k, v in s.items() if k.startswith("rep")})
    out.update(s["rank_state"].value)
    return out


def kept_logs():
    """A list that receives every message uckpt logs at INFO and above from now on."""
    logs = []

    class Keep(logging.Handler):
        def emit(self, record):
            logs.append(record.getMessage())
    logging.getLogger("uckpt").addHandler(Keep(logging.INFO))
    logging.getLogger("uckpt").setLevel(logging.INFO)
    return logs


def main():
    backend, mode, name, durable, per_node, pids = sys.argv[1:7]
    scheme = sys.argv[7] if len(sys.argv) > 7 else None
    if backend == "torch":
        from datetime import timedelta

        import torch.distributed as dist
        dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    else:
        from mpi4py import MPI  # noqa: F401  (detection: mpi4py imported -> MPI)
    import uckpt
    from uckpt.comm import get_communicator

    comm = get_communicator(None, timeout=60)
    rank, size = comm.rank, comm.size
    os.environ["UCKPT_NODE"] = f"node{rank // int(per_node)}"
    tiers = [uckpt.Tier(f"shm://{name}-{{node}}", keep=1, redundancy=scheme), durable]
    if mode == "train":
        with open(os.path.join(pids, str(rank)), "w") as f:
            f.write(str(os.getpid()))
        m = uckpt.CheckpointManager(tiers=tiers, comm=comm, async_save=True)
        for step in range(1, 501):
            m.save(step, state(step, rank, size))
            time.sleep(0.01)
        m.close()
        return
    logs = kept_logs()
    got = state(0, rank, size, zero=True)
    with uckpt.CheckpointManager(tiers=tiers, comm=comm) as m:
        step = m.restore(got)
        shm_path = str(m.tiers[0].path)
    want = state(step or 0, rank, size)
    same = step is not None and all(
        np.array_equal(a, arrays(want)[k]) and a.dtype == arrays(want)[k].dtype
        for k, a in arrays(got).items())
    restored = [line for line in logs if line.startswith("restored step")]
    rebuilt = [line for line in logs if line.startswith("step ")]
    import json
    print("\nRESULT " + json.dumps({"rank": rank, "step": step, "same": same,
                                    "restored": restored, "shm": shm_path,
                                    "logs": restored + rebuilt}), flush=True)


if __name__ == "__main__":
    main()
