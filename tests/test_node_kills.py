"""Issue 28, item 4, on real processes: a job on node-local tiers only (no shared
directory), ``mpiexec -n 4`` as 2 simulated nodes, SIGKILLed on every rank at a random
moment of its saves (in a write, between the two nodes' commits, in retention, ...), 50
times; each restart must restore, on every rank, the newest step committed on both nodes'
copies when it was killed (the old step or the new, never a mix), bit for bit, reading
the replicated arrays' chunks it lacks from the other node's ranks. The worker is
tests/kill_worker.py; one launch per kill (each restores, then trains until killed)."""
import json
import os
import random
import signal
import time
from pathlib import Path

import pytest

from multiproc import HAVE_MPI, run_mpi

# (no xdist group: one test with no module-scoped launch to share; on a worker of its own
# it runs beside test_distributed's group instead of after it)
pytestmark = pytest.mark.skipif(not HAVE_MPI, reason="no mpiexec")

WORKER = Path(__file__).with_name("kill_worker.py")
KILLS = 50


def committed(root):
    """The steps committed on both nodes' copies."""
    return set.intersection(*(steps_on(root, k) for k in (0, 1)))


def steps_on(root, node):
    return {int(p.parent.name[len("step_"):])
            for p in (root / f"node{node}" / "run").glob("step_*/manifest.json")}


def killer(root, pids, delay, when, before, killed):
    """A monitor that SIGKILLs every rank ``delay`` seconds after all of them wrote their
    pid (``when``: "first"), after a step above ``before`` (the newest on any node at the
    launch) is committed on both nodes ("later"), or at once when node 0 holds such a step
    that node 1 does not yet ("between")."""
    def kill_at_random():
        if "done" in killed or len(list(pids.iterdir())) < 4:
            return
        if when == "later" and "since" not in killed and \
                not [s for s in committed(root) if s > before]:
            return
        if when == "between" and not [s for s in steps_on(root, 0) - steps_on(root, 1)
                                      if s > before]:
            return
        since = killed.setdefault("since", time.monotonic())
        if time.monotonic() - since < delay:
            return
        for f in pids.iterdir():
            os.kill(int(f.read_text()), signal.SIGKILL)
        killed["done"] = True
    return kill_at_random


def test_random_sigkills_during_saves_restore_one_step_everywhere(tmp_path):
    root, results = tmp_path / "job", tmp_path / "results"
    results.mkdir()
    rng = random.Random(28)
    expected, seen, between, aimed = None, [], 0, 0
    for launch in range(KILLS + 1):
        pids = tmp_path / f"pids{launch}"
        pids.mkdir()
        # a third each: from the first save (a writer's first steps), once a new step is
        # committed on both nodes (later saves, their commits, retention), between the
        # nodes' commits
        killed: dict = {}
        when = ("first", "later", "between")[launch % 3]
        before = max(steps_on(root, 0) | steps_on(root, 1), default=-1)
        monitor = killer(root, pids, 0 if when == "between" else rng.random() * 0.5, when,
                         before, killed)
        mode = "train" if launch < KILLS else "restore"
        run = run_mpi(4, WORKER, root, pids, results, launch, mode, timeout=120,
                      monitor=monitor if mode == "train" else None)
        got = [json.loads((results / f"{launch}-{r}.json").read_text()) for r in range(4)]
        assert all("error" not in g for g in got), (launch, got, run.stderr[-3000:])
        steps = {g["step"] for g in got}
        assert steps == {expected}, (launch, got, expected)  # one step, the newest on both
        assert all(g["same"] for g in got), (launch, got)  # bit for bit
        seen.append(expected)
        if mode == "train":
            assert killed.get("done") and any(rc != 0 for rc in run.returncodes), \
                (launch, run.stderr[-3000:])
            both = committed(root)
            one = [s for s in (steps_on(root, 0) | steps_on(root, 1)) - both if s > before]
            between += bool(one)  # killed between the nodes' commits
            aimed += when == "between"
            # retention never deleted, on one node, the newest step committed on both
            assert expected is None or (both and max(both) >= expected), (launch, both)
            expected = max(both) if both else None
    assert sum(s is not None for s in seen) >= KILLS // 2, seen  # saves got committed
    assert between >= aimed // 2, (between, aimed)  # the window was hit
    print(f"{KILLS} kills, {between} between the nodes' commits; restored steps: {seen}")
