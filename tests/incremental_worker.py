"""MPI worker for incremental saves by many ranks (tests/test_incremental_dist.py).

    incremental_worker.py save ROOT     4 ranks: steps 1..4, incremental, full_every=3
    incremental_worker.py load ROOT     2 ranks: restore the newest, resharded

The state: the replicated table of incremental_common, and a sharded table cut by rows
over the saving ranks, of which step s changes one row (so one rank's chunk)."""
import json
import sys

import numpy as np

import incremental_common as ic

SHARDED = (64, 128)  # float32 rows of 512 bytes: 16 rows a chunk at 8 KiB


def report(**kw):
    print("\nRESULT " + json.dumps(kw), flush=True)


def sharded(step):
    t = np.arange(SHARDED[0] * SHARDED[1], dtype=np.float32).reshape(SHARDED)
    for s in range(1, step + 1):
        t[(s * 11) % SHARDED[0]] = -s
    return t


def rows(rank, size):
    edges = np.linspace(0, SHARDED[0], size + 1).round().astype(int)
    return int(edges[rank]), int(edges[rank + 1])


def main():
    from mpi4py import MPI  # noqa: F401  (detection)

    import uckpt
    from uckpt.comm import get_communicator

    scenario, root = sys.argv[1], sys.argv[2]
    comm = get_communicator(None, timeout=60)
    rank, size = comm.rank, comm.size
    lo, hi = rows(rank, size)
    if scenario == "save":
        with ic.manager(root, incremental=True, full_every=3, comm=comm) as mgr:
            for step in range(1, 5):
                state = ic.state(step)
                state["sharded"] = uckpt.Shard(sharded(step)[lo:hi].copy(), SHARDED, (lo, 0))
                mgr.save(step, state)
        report(rank=rank, steps=mgr.steps())
        return
    out = ic.empty_state()
    local = np.zeros((hi - lo, SHARDED[1]), np.float32)
    out["sharded"] = uckpt.Shard(local, SHARDED, (lo, 0))
    with uckpt.CheckpointManager(root, comm=comm) as mgr:
        step = mgr.restore(out)
    ic.check(out, step)
    report(rank=rank, step=step, sharded=bool(np.array_equal(local, sharded(step)[lo:hi])))


if __name__ == "__main__":
    main()
