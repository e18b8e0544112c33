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
