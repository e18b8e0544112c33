"""Issue 28, item 5, a torchrun *elastic* restart onto fewer nodes from the memory level:
the restart is made by torchrun's elastic agents, not by the test.

Four torchrun agents stand for four nodes (``--nnodes=3:4 --nproc-per-node=1``, the c10d
rendezvous hosted by node0's agent, ``UCKPT_NODE=nodeK`` in agent K's environment); the
worker (tests/elastic_worker.py) trains and saves every step to
``shm://NAME-{node}`` with ``redundancy="partner"`` and to a durable directory. When every
worker has saved its last step and waits in a gloo barrier, the test SIGKILLs the node of
rank 1 (its agent and its worker), wipes its memory area and moves the durable tier out of
reach. The survivors' barrier fails; their agents re-rendezvous as 3 nodes and restart
their workers (as a failure, or as a membership change where an agent sees the new round
before its worker's barrier failed: ``TORCHELASTIC_RESTART_COUNT`` differs), which restore
from the memory level onto 3 ranks, the lost node's share rebuilt from its partner copy, and train on.

Checked: the restored rows and replicated arrays bit for bit against an uninterrupted run
and against the consolidated durable copy (moved away), the restore logged from the memory
level with the lost node's share rebuilt, the durable tier never recreated by the restore,
and the state after training on bit for bit against the uninterrupted run.
"""
import json
import os
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest

import elastic_worker as ew
import uckpt
from multiproc import HAVE_TORCH, PYTHON, free_port, kill_tagged, run_commands
from test_shm_restart import SHM, shm_name  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.xdist_group("distributed"),
              pytest.mark.skipif(not HAVE_TORCH, reason="no torch")]

WORKER = Path(__file__).with_name("elastic_worker.py")
NODES = 4
# the workers of a restart must not meet in the store of the attempt before (pytorch/pytorch#135712)
NO_SHARED_STORE = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def agent(k, port, name, durable, run):
    """The command of node ``k``'s torchrun agent: elastic, 3 to 4 nodes, one restart;
    short rendezvous timeouts: a dead node is dropped after 5 s without a heartbeat (not
    less: an agent starved of CPU on a loaded machine must not count as dead)."""
    conf = (f"is_host={int(k == 0)},join_timeout=90,last_call_timeout=15,close_timeout=10,"
            "keep_alive_interval=1,keep_alive_max_attempt=5")
    return [PYTHON, "-m", "torch.distributed.run", "--nnodes=3:4", "--nproc-per-node=1",
            "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={name}",
            f"--rdzv-conf={conf}", "--max-restarts=1", "--monitor-interval=0.2",
            f"--log-dir={run / 'logs'}", "--tee=3",  # each attempt's output kept there too
            WORKER, name, durable, run]


def test_torchrun_elastic_restart_on_three_of_four_nodes(tmp_path, shm_name):
    durable, away, run = tmp_path / "durable", tmp_path / "away", tmp_path / "run"
    run.mkdir()
    port = free_port()
    parked = run / "parked"
    lost = {}

    def kill_a_node_when_every_worker_is_parked(procs):
        if lost or not parked.is_dir() or len(list(parked.iterdir())) < NODES:
            return
        workers = {p.name: json.loads(p.read_text()) for p in parked.iterdir()}
        node = next(n for n, w in workers.items() if w["rank"] == 1)
        k = int(node[len("node"):])
        os.killpg(procs[k].pid, signal.SIGKILL)  # the agent, and its worker (a session
        os.killpg(workers[node]["pid"], signal.SIGKILL)  # of its own)
        procs[k].wait()
        shutil.rmtree(SHM / f"{shm_name}-{node}")
        durable.rename(away)
        lost.update(node=node, workers=workers)
        (run / "go").write_text("")

    try:
        result = run_commands(
            [agent(k, port, shm_name, durable, run) for k in range(NODES)],
            [{"UCKPT_NODE": f"node{k}", **NO_SHARED_STORE} for k in range(NODES)],
            timeout=480, monitor=kill_a_node_when_every_worker_is_parked)  # (a hang guard)
    finally:  # torchrun's workers are sessions of their own: a killed agent leaves them
        kill_tagged(shm_name)
    assert lost, f"the workers never all parked\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    workers, node = lost["workers"], lost["node"]
    assert sorted(w["rank"] for w in workers.values()) == list(range(NODES))
    assert {w["size"] for w in workers.values()} == {NODES}
    killed = int(node[len("node"):])  # (each worker's output: under run/logs)
    assert [rc for k, rc in enumerate(result.returncodes) if k != killed] == [0] * 3, \
        f"{result.returncodes}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    results = result.results
    assert sorted(results) == [0, 1, 2], result.stdout[-3000:]

    reference = ew.reference(ew.STEPS)
    durable_copy = uckpt.load(away / f"step_{ew.STEPS:08d}")  # consolidated
    np.testing.assert_array_equal(durable_copy["w"], reference[0])
    for i, b in enumerate(reference[1]):
        np.testing.assert_array_equal(durable_copy[f"b{i}"], b)
    final = ew.reference(ew.STEPS + ew.MORE)
    # the lost node's partner copy is kept by the next node (rank 2 before the restart)
    host = next(n for n, w in workers.items() if w["rank"] == 2)
    for rank, res in results.items():
        assert (res["restart"], res["size"], res["step"], res["loop"]) == \
            (1, 3, ew.STEPS, ew.STEPS), res
        lo, hi = ew.rows(rank, 3)
        assert res["restored"] == ew.digest(reference[0][lo:hi]), res  # resharded 3 ways
        assert res["restored_b"] == ew.digest(*reference[1]), res
        assert res["final"] == ew.digest(final[0][lo:hi]) and res["last"] == ew.STEPS + ew.MORE
        assert res["final_b"] == ew.digest(*final[1])
        assert not res["durable_after_restore"], res
        assert any(line.startswith(f"restored step {ew.STEPS} from tier "
                                   f"'{shm_name}-{res['node']}'") for line in res["logs"]), res
        assert any(f"rebuilt the share of node '{node}' (node 1, ranks 1) (node not in the "
                   f"job) from partner over the communicator, into the copy of node "
                   f"'{host}'" in line for line in res["logs"]), res
    assert sorted(r["node"] for r in results.values()) == sorted(set(workers) - {node})
