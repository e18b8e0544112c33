"""A training job on simulated nodes whose first tier is the memory level with redundancy
across nodes, run under mpiexec or torchrun (gloo) by tests/test_redundant_restart.py.

usage: redundancy_worker.py {mpi,torch} {train,restore} SHM_NAME DURABLE RANKS_PER_NODE
       PIDS SCHEME

As tests/shm_worker.py (the same ZeRO-3 style state, every value a function of the
step), with tiers ``shm://SHM_NAME-{node}`` (keep=1, ``redundancy=SCHEME``) and the
directory DURABLE. ``restore`` prints ``RESULT <json>``: the step, whether every array
equals the step's, and the lines the manager and the levels logged about the restore.
"""
import json
import logging
import os
import sys
import time

import numpy as np

from shm_worker import arrays, state


def main():
    backend, mode, name, durable, per_node, pids, scheme = sys.argv[1:8]
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
    logs = []

    class Keep(logging.Handler):
        def emit(self, record):
            logs.append(record.getMessage())
    logging.getLogger("uckpt").addHandler(Keep(logging.INFO))
    logging.getLogger("uckpt").setLevel(logging.INFO)
    got = state(0, rank, size, zero=True)
    with uckpt.CheckpointManager(tiers=tiers, comm=comm) as m:
        step = m.restore(got)
    want = state(step or 0, rank, size)
    same = step is not None and all(np.array_equal(a, arrays(want)[k]) and a.dtype == arrays(want)[k].dtype
               for k, a in arrays(got).items())
    said = [line for line in logs if line.startswith(("restored step", "step "))]
    print("\nRESULT " + json.dumps({"rank": rank, "step": step, "same": same,
                                    "logs": said}), flush=True)


if __name__ == "__main__":
    main()
