"""A job on node-local tiers only, run under ``mpiexec -n 4`` as 2 simulated nodes by
tests/test_node_kills.py, which SIGKILLs every rank at a random moment of its saves.

usage: kill_worker.py DIR PIDS RESULTS LAUNCH {train,restore}

Each rank sets ``UCKPT_NODE=node<rank // 2>``; the manager's only tier is
``DIR/{node}/run`` (keep=1, async saves). The state holds sharded rows (``uckpt.Shard``),
replicated arrays (every rank holds them; their chunks are spread over all ranks' files,
so half of them are on the other node) and each rank's own values (``uckpt.PerRank``);
every value is a function of the step, so a restore is checked bit for bit. Rank 2,
node 1's committer, commits 50 to 200 ms after node 0's, so that kills land between the
nodes' commits.

The rank restores the newest step, writes ``RESULTS/<LAUNCH>-<rank>.json`` (the step,
whether every array equals the step's, or the error), then with ``train`` writes its pid
to ``PIDS/<rank>`` and saves the following steps until it is killed (at most 3000).
"""
import json
import os
import random
import sys
import time

import numpy as np

ROWS = 32


def state(step, rank, zero=False):
    import uckpt

    def fill(a):
        return np.zeros_like(a) if zero else a
    full = np.random.default_rng([1, step]).standard_normal((ROWS, 8)).astype(np.float32)
    lo, hi = rank * ROWS // 4, (rank + 1) * ROWS // 4
    return {"w": uckpt.Shard(fill(full[lo:hi].copy()), full.shape, (lo, 0)),
            "emb": fill(np.random.default_rng([2, step]).standard_normal(6000)),
            "bias": fill(np.arange(2000, dtype=np.int32) * step),
            "rank": uckpt.PerRank(fill(np.array([rank, step], dtype=np.int64)))}


def arrays(s):
    return {"w": s["w"].array, "emb": s["emb"], "bias": s["bias"], "rank": s["rank"].value}


def main():
    root, pids, results, launch, mode = sys.argv[1:6]
    from mpi4py import MPI  # noqa: F401  (detection: mpi4py imported -> MPI)
    import uckpt
    from uckpt.comm import get_communicator

    comm = get_communicator(None, timeout=60)
    rank = comm.rank
    if rank == 2:  # node 1's committer commits 50-200 ms after node 0's: a window that
        # the test's monitor kills in (the rename itself is the library's, unchanged)
        from uckpt.storage.checkpoint.sink import BlobSink
        commit, late = BlobSink.commit, random.Random(int(launch))

        def later(self, *args, **kwargs):
            time.sleep(0.05 + 0.15 * late.random())
            return commit(self, *args, **kwargs)
        BlobSink.commit = later
    os.environ["UCKPT_NODE"] = f"node{rank // 2}"
    tiers = [uckpt.Tier(os.path.join(root, "{node}", "run"), keep=1)]
    m = uckpt.CheckpointManager(tiers=tiers, comm=comm, async_save=True)
    got = state(0, rank, zero=True)
    try:
        step = m.restore(got)
        same = step is None or all(
            np.array_equal(a, arrays(state(step, rank))[k]) for k, a in arrays(got).items())
        out = {"step": step, "same": same}
    except Exception as e:  # noqa: BLE001 - reported to the test
        out = {"error": f"{type(e).__name__}: {e}"}
    tmp = os.path.join(results, f".{launch}-{rank}")
    with open(tmp, "w") as f:
        json.dump(out, f)
    os.replace(tmp, os.path.join(results, f"{launch}-{rank}.json"))
    if mode != "train" or "error" in out:
        m.close()
        return
    with open(os.path.join(pids, str(rank)), "w") as f:
        f.write(str(os.getpid()))
    rng = random.Random(rank)
    for step in range((out["step"] or 0) + 1, (out["step"] or 0) + 3001):
        m.save(step, state(step, rank))
        time.sleep(rng.random() * 0.004)
    m.close()


if __name__ == "__main__":
    main()
