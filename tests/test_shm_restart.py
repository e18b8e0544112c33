"""Issue 28, acceptance check 1, on real processes: a job whose first tier is the memory
level (``shm://NAME-{node}``, keep=1) on simulated nodes is SIGKILLed on every rank after
a step is committed there; restarted, it restores that step bit for bit from shared
memory, the durable tier out of reach (moved away; it must not come back).

mpiexec -n 4 as 2 nodes (ranks 0-1, 2-3) and torchrun (gloo) -n 4 as 4 nodes. The
worker is tests/shm_worker.py; every shared-memory area a test makes is removed after
it, whatever the outcome.
"""
import os
import shutil
import signal
import uuid
from pathlib import Path

import pytest

from multiproc import HAVE_MPI, HAVE_TORCH, MPIEXEC, PYTHON, free_port, run_command

pytestmark = pytest.mark.xdist_group("distributed")

WORKER = Path(__file__).with_name("shm_worker.py")
SHM = Path("/dev/shm/uckpt")


@pytest.fixture
def shm_name():
    """A name of its own for the test's shm:// roots; every root made under it (one per
    simulated node) is removed after the test."""
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm on this system")
    name = f"uckpt-test-{uuid.uuid4().hex[:12]}"
    yield name
    for root in SHM.glob(f"{name}-*"):
        shutil.rmtree(root, ignore_errors=True)
    try:
        SHM.rmdir()  # where no other job keeps roots there
    except OSError:
        pass


def committed(name, nodes):
    """The steps committed on every node's memory level."""
    found = [{int(p.parent.name[len("step_"):])
              for p in (SHM / f"{name}-node{k}").glob("step_*/manifest.json")}
             for k in range(nodes)]
    return set.intersection(*found)


def launcher(backend, n):
    if backend == "mpi":
        return [MPIEXEC, "-n", str(n), PYTHON]
    return [PYTHON, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc-per-node={n}",
            "--master-addr=127.0.0.1", f"--master-port={free_port()}"]


@pytest.mark.parametrize("backend, nodes", [
    pytest.param("mpi", 2, marks=pytest.mark.skipif(not HAVE_MPI, reason="no mpiexec")),
    pytest.param("torch", 4, marks=pytest.mark.skipif(not HAVE_TORCH, reason="no torch")),
])
def test_sigkill_then_restore_from_the_memory_level(tmp_path, shm_name, backend, nodes):
    n = 4
    durable, pids = tmp_path / "durable", tmp_path / "pids"
    pids.mkdir()
    args = [backend, shm_name, durable, n // nodes, pids]
    killed = []

    def kill_after_a_committed_step():
        if killed or len(list(pids.iterdir())) < n or \
                not [s for s in committed(shm_name, nodes) if s >= 3]:
            return
        for f in pids.iterdir():  # every rank at once
            os.kill(int(f.read_text()), signal.SIGKILL)
            killed.append(int(f.name))
    run = run_command([*launcher(backend, n), WORKER, backend, "train", *args[1:]],
                      timeout=120, monitor=kill_after_a_committed_step)
    assert sorted(killed) == list(range(n)), run.stderr[-3000:]
    assert any(rc != 0 for rc in run.returncodes)
    want = max(committed(shm_name, nodes))
    assert want >= 3
    assert (durable / ".uckpt-writer.lock").exists()  # the job held the durable tier too
    durable.rename(tmp_path / "away")  # the durable tier is out of reach

    run = run_command([*launcher(backend, n), WORKER, backend, "restore", *args[1:]],
                      timeout=120).check()
    assert sorted(run.results) == list(range(n)), run.stdout[-3000:]
    for rank, res in run.results.items():
        node = rank // (n // nodes)
        assert res["shm"] == f"shm://{shm_name}-node{node}"
        assert res["step"] == want and res["same"], res
        assert len(res["restored"]) == 1 and \
            res["restored"][0].startswith(f"restored step {want} from tier "
                                          f"'{shm_name}-node{node}'"), res
    assert not durable.exists()  # never recreated, not even listed into being


@pytest.mark.skipif(not HAVE_MPI, reason="no mpiexec")
def test_sigkill_then_restore_on_fewer_ranks_from_the_memory_level(tmp_path, shm_name):
    """Issue 28, item 5: 4 ranks on 2 nodes (0-1, 2-3) SIGKILLed; the job restarts as 3
    ranks (0-1 on node0, 2 on node1) and reshards from the memory level, durable tier out
    of reach: rows read 3 ways (rank 1's from node1's copy, over the communicator), the
    replicated arrays whole (rank 3 wrote one into node1's copy: node1's remaining rank
    serves it), each rank's own PerRank state. The reference is the consolidated durable
    copy, loaded before it is moved away: it equals the worker's state of its step, which
    the restarted ranks check bit for bit."""
    import numpy as np

    import shm_worker
    import uckpt
    durable, pids = tmp_path / "durable", tmp_path / "pids"
    pids.mkdir()
    killed = []

    def kill_after_a_committed_step():
        if killed or len(list(pids.iterdir())) < 4 or \
                not [s for s in committed(shm_name, 2) if s >= 3] or \
                not list(durable.glob("step_*/manifest.json")):
            return
        for f in pids.iterdir():
            os.kill(int(f.read_text()), signal.SIGKILL)
            killed.append(int(f.name))
    args = [shm_name, durable, 2, pids]
    run = run_command([*launcher("mpi", 4), WORKER, "mpi", "train", *args],
                      timeout=120, monitor=kill_after_a_committed_step)
    assert sorted(killed) == list(range(4)), run.stderr[-3000:]
    want = max(committed(shm_name, 2))
    copied = max(int(p.parent.name[len("step_"):]) for p in durable.glob("step_*/manifest.json"))
    reference = uckpt.load(durable / f"step_{copied:08d}")
    saved = shm_worker.state(copied, 0, 4)
    for what in ("param", "exp_avg", "exp_avg_sq"):
        assert np.array_equal(reference[what], shm_worker.full(copied, what)), what
    for what in ("rep0", "rep1", "rep2", "rep3"):
        assert np.array_equal(reference[what], saved[what]), what
    durable.rename(tmp_path / "away")

    run = run_command([*launcher("mpi", 3), WORKER, "mpi", "restore", *args],
                      timeout=120).check()
    assert sorted(run.results) == [0, 1, 2], run.stdout[-3000:]
    for rank, res in run.results.items():
        assert res["step"] == want and res["same"], res
        assert res["restored"][0].startswith(
            f"restored step {want} from tier '{shm_name}-node{rank // 2}'"), res
    assert not durable.exists()
