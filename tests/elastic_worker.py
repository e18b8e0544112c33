"""A training job run by torchrun's elastic agents, one agent per simulated node
(``UCKPT_NODE`` in each agent's environment), for tests/test_torchrun_elastic.py.

usage: elastic_worker.py SHM_NAME DURABLE RUN_DIR

The state: the rows of ``w`` split over the ranks (``uckpt.Shard``), four replicated
arrays ``b0``..``b3`` (the planner spreads them over the ranks' files, so a restore reads
some from other nodes' copies) and the loop position ``step``. Each training step updates
every element from itself, its place and the step only (float32 products and sums, no
reductions), so any split of the rows gives the same bits as :func:`reference`.

Tiers: ``shm://SHM_NAME-{node}`` (keep=1, ``redundancy="partner"``), then DURABLE.

* First run (no ``RUN_DIR/parked`` yet): restores nothing, trains and saves (async)
  steps 1..STEPS, waits for the last save and its copy, closes its manager, writes
  ``RUN_DIR/parked/<node>`` (``{"pid", "rank", "size"}``) and then runs gloo barriers until
  one fails: the test kills a node, and the survivors' barrier with the dead rank fails.
* Restarted by its agent (``RUN_DIR/parked`` there): waits for ``RUN_DIR/go`` (the test
  has made the durable tier unreachable and wiped the lost node's memory area), restores,
  trains and saves MORE steps, and prints ``RESULT <json>``: the step restored, SHA-256
  digests of its rows and of the replicated arrays after the restore and at the end,
  whether DURABLE existed after the restore, and the lines ``uckpt`` logged about the
  restore.

Which run a worker is in is not ``TORCHELASTIC_RESTART_COUNT``: an agent whose own worker
has not failed yet when it sees the survivors re-rendezvous restarts that worker as a
membership change, without counting a restart (still 0), so the ranks of one restart
could take different paths (one parked in a barrier while the others save: a collective
timeout). ``RUN_DIR/parked`` is the same for every worker of a run: the first run's workers
all start before any of them parks (parking follows collective saves), every restarted
one after the test saw all of them parked.
"""
import hashlib
import json
import logging
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import numpy as np

ROWS, COLS, REP = 48, 8, 1024
STEPS, MORE = 4, 2  # saved before the kill; saved after the elastic restart


def rows(rank, size):
    return rank * ROWS // size, (rank + 1) * ROWS // size


def update(w, bs, step, lo):
    """One training step on rows ``lo``.. of ``w`` and on the replicated ``bs``."""
    r = np.arange(lo, lo + len(w))[:, None]
    c = np.arange(COLS)[None, :]
    target = ((r * 31 + c * 7 + step * 13) % 17).astype(np.float32) / np.float32(16)
    w = w * np.float32(0.875) + target * np.float32(0.125)
    bs = [b * np.float32(0.75) + np.float32(step + i) / np.float32(8) for i, b in enumerate(bs)]
    return w.astype(np.float32), [b.astype(np.float32) for b in bs]


def reference(step):
    """The state of an uninterrupted run on one process after ``step`` steps."""
    w, bs = zeros(0, ROWS)
    for t in range(1, step + 1):
        w, bs = update(w, bs, t, 0)
    return w, bs


def zeros(lo, hi):
    return np.zeros((hi - lo, COLS), np.float32), [np.zeros(REP, np.float32) for _ in range(4)]


def digest(*arrays):
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def main():
    name, durable, run = sys.argv[1:4]
    run = Path(run)
    import torch.distributed as dist
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    import uckpt
    from uckpt.comm import get_communicator

    comm = get_communicator(None, timeout=60)
    rank, size = comm.rank, comm.size
    restart = int((run / "parked").is_dir())  # (the module docstring says why)
    node = os.environ["UCKPT_NODE"]
    logs = []
    if restart:
        for _ in range(1200):  # the test wipes the lost node and moves the durable tier
            if (run / "go").exists():
                break
            time.sleep(0.05)

        class Keep(logging.Handler):
            def emit(self, record):
                logs.append(record.getMessage())
        logging.getLogger("uckpt").addHandler(Keep(logging.INFO))
        logging.getLogger("uckpt").setLevel(logging.INFO)

    lo, hi = rows(rank, size)
    w, bs = zeros(lo, hi)
    tiers = [uckpt.Tier(f"shm://{name}-{{node}}", keep=1, redundancy="partner"), durable]
    m = uckpt.CheckpointManager(tiers=tiers, comm=comm, async_save=True)
    got = {"w": uckpt.Shard(w, (ROWS, COLS), (lo, 0)), "step": 0,
           **{f"b{i}": b for i, b in enumerate(bs)}}
    start = m.restore(got) or 0
    w, bs = got["w"].array, [got[f"b{i}"] for i in range(4)]
    out = {"rank": rank, "size": size, "node": node, "restart": restart, "step": start,
           "loop": got["step"], "restored": digest(w), "restored_b": digest(*bs),
           "durable_after_restore": os.path.exists(durable)}
    last = start + MORE if restart else STEPS
    for step in range(start + 1, last + 1):
        w, bs = update(w, bs, step, lo)
        m.save(step, {"w": uckpt.Shard(w, (ROWS, COLS), (lo, 0)), "step": step,
                      **{f"b{i}": b for i, b in enumerate(bs)}})
    m.close()  # waits for the saves and their copies
    if restart:
        out.update(final=digest(w), final_b=digest(*bs), last=last,
                   logs=[line for line in logs if line.startswith(("restored step", "step "))])
        print("\nRESULT " + json.dumps(out), flush=True)
        return
    (run / "parked").mkdir(exist_ok=True)
    tmp = run / f".{node}"  # (renamed in whole: the test reads it as soon as it is there)
    tmp.write_text(json.dumps({"pid": os.getpid(), "rank": rank, "size": size}))
    os.replace(tmp, run / "parked" / node)
    while True:  # until a node is killed: this barrier then fails, and the agent restarts
        dist.barrier()
        time.sleep(0.05)


if __name__ == "__main__":
    main()
