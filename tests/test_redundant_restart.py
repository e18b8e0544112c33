"""Issue 28, acceptance checks of redundancy across nodes, on real processes: a job whose
first tier is the memory level ``shm://NAME-{node}`` with ``redundancy=`` is SIGKILLed on
every rank after a step is committed there; then simulated nodes' memory areas are wiped
or their files damaged, and each restart restores (same size):

* ``xor:4``, mpiexec -n 4 as 4 nodes: node 2 wiped -> its copy rebuilt from the parity
  over MPI, restored bit for bit with the durable tier out of reach (moved away, never
  recreated); then a data file of node 0 damaged -> found by its checksum, rebuilt;
  then nodes 1 and 2 wiped (two of one group) -> restored from the durable tier, with a
  line saying why;
* ``partner``, torchrun (gloo) -n 4 as 4 nodes: node 1 wiped and node 3's piece (node 2's
  copy) damaged -> both rebuilt, durable tier out of reach;
* ``xor:4``, mpiexec -n 4 as 4 nodes, node 3 lost and not replaced: the job restarts as
  3 ranks on nodes 0-2 (item 5, fewer ranks); node 3's share is rebuilt into node 0's
  copy and the state resharded 3 ways, bit for bit, durable tier out of reach.

The worker is tests/shm_worker.py (with a scheme); every shared-memory area a test makes is
removed after it (the fixture of tests/test_shm_restart.py).
"""
import os
import shutil
import signal
from pathlib import Path

import pytest

from multiproc import HAVE_MPI, HAVE_TORCH, run_command
from test_shm_restart import SHM, committed, launcher, shm_name  # noqa: F401 (a fixture)

pytestmark = pytest.mark.xdist_group("distributed")

WORKER = Path(__file__).with_name("shm_worker.py")
N = 4  # ranks, one per simulated node


def train(tmp_path, backend, name, scheme):
    """Run the job until a step >= 3 is committed on every node and some step on the
    durable tier, then SIGKILL every rank; the newest step committed on every node."""
    durable, pids = tmp_path / "durable", tmp_path / "pids"
    pids.mkdir()
    killed = []

    def kill_after_a_committed_step():
        if killed or len(list(pids.iterdir())) < N or \
                not [s for s in committed(name, N) if s >= 3] or \
                not list(durable.glob("step_*/manifest.json")):
            return
        for f in pids.iterdir():
            os.kill(int(f.read_text()), signal.SIGKILL)
            killed.append(int(f.name))
    run = run_command([*launcher(backend, N), WORKER, backend, "train", name, durable, 1,
                       pids, scheme], timeout=120, monitor=kill_after_a_committed_step)
    assert sorted(killed) == list(range(N)), run.stderr[-3000:]
    return max(committed(name, N))


def restore(tmp_path, backend, name, scheme, n=N):
    run = run_command([*launcher(backend, n), WORKER, backend, "restore", name,
                       tmp_path / "durable", 1, tmp_path / "pids", scheme],
                      timeout=120).check()
    assert sorted(run.results) == list(range(n)), run.stdout[-3000:]
    return run.results


def step_dir(name, node, step):
    return SHM / f"{name}-node{node}" / f"step_{step:08d}"


def flip(path, offset=100):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def said(results, text):
    """Whether every rank logged a line holding ``text`` (``{rank}``: that rank's)."""
    return all(any(text.format(rank=rank) in line for line in r["logs"])
               for rank, r in results.items())


@pytest.mark.skipif(not HAVE_MPI, reason="no mpiexec")
def test_xor_rebuilds_a_lost_or_damaged_node_and_falls_back_past_two(tmp_path, shm_name):
    want = train(tmp_path, "mpi", shm_name, "xor:4")
    durable, away = tmp_path / "durable", tmp_path / "away"
    durable.rename(away)  # the durable tier is out of reach
    lost = SHM / f"{shm_name}-node2"
    shutil.rmtree(lost)

    results = restore(tmp_path, "mpi", shm_name, "xor:4")
    for rank, res in results.items():
        assert res["step"] == want and res["same"], res
        assert any(line.startswith(f"restored step {want} from tier '{shm_name}-node{rank}'")
                   for line in res["logs"]), res
    assert said(results, f"step {want} on tier '{shm_name}-node{{rank}}': rebuilt from xor:4")
    assert said(results, "lost the copy of node 'node2' (node 2, ranks 2)")
    assert (step_dir(shm_name, 2, want) / "redundancy-00002.bin").is_file()
    assert not durable.exists()  # never recreated, not even listed into being

    data = list(step_dir(shm_name, 0, want).glob("data-*.bin"))
    assert len(data) == 1, data
    good = data[0].read_bytes()
    flip(data[0])
    results = restore(tmp_path, "mpi", shm_name, "xor:4")
    for res in results.values():
        assert res["step"] == want and res["same"], res
    assert said(results, f"shares rebuilt: node 'node0' (node 0, ranks 0) ({data[0].name}: "
                         "checksum")
    assert data[0].read_bytes() == good  # bit for bit
    assert not durable.exists()

    away.rename(durable)
    on_durable = max(int(p.parent.name[5:]) for p in durable.glob("step_*/manifest.json"))
    shutil.rmtree(SHM / f"{shm_name}-node1")
    shutil.rmtree(lost)
    results = restore(tmp_path, "mpi", shm_name, "xor:4")
    for res in results.values():
        assert res["step"] == on_durable and res["same"], res
        assert any(line.startswith(f"restored step {on_durable} from tier 'durable'")
                   for line in res["logs"]), res
    assert said(results, f"step {want} on tier '{shm_name}-node{{rank}}' cannot be rebuilt from its "
                         "redundancy")


@pytest.mark.skipif(not HAVE_TORCH, reason="no torch")
def test_partner_rebuilds_a_lost_node_and_a_damaged_piece(tmp_path, shm_name):
    want = train(tmp_path, "torch", shm_name, "partner")
    durable = tmp_path / "durable"
    durable.rename(tmp_path / "away")
    shutil.rmtree(SHM / f"{shm_name}-node1")
    piece = step_dir(shm_name, 3, want) / "redundancy-00003.bin"  # node 2's share
    good = piece.read_bytes()
    flip(piece)

    results = restore(tmp_path, "torch", shm_name, "partner")
    for rank, res in results.items():
        assert res["step"] == want and res["same"], res
        assert any(line.startswith(f"restored step {want} from tier '{shm_name}-node{rank}'")
                   for line in res["logs"]), res
    assert said(results, "lost the copy of node 'node1' (node 1, ranks 1)")
    assert said(results, "pieces made again: node 'node1'")
    assert said(results, "node 'node3' (node 3, ranks 3) (redundancy-00003.bin: checksum")
    assert piece.read_bytes() == good
    assert not durable.exists()


@pytest.mark.skipif(not HAVE_MPI, reason="no mpiexec")
def test_xor_restart_on_three_of_four_nodes_rebuilds_the_lost_share(tmp_path, shm_name):
    import numpy as np

    import shm_worker
    import uckpt
    want = train(tmp_path, "mpi", shm_name, "xor:4")
    durable = tmp_path / "durable"
    copied = max(int(p.parent.name[5:]) for p in durable.glob("step_*/manifest.json"))
    reference = uckpt.load(durable / f"step_{copied:08d}")  # consolidated
    saved = shm_worker.state(copied, 0, N)
    for what in ("param", "exp_avg", "exp_avg_sq"):
        assert np.array_equal(reference[what], shm_worker.full(copied, what)), what
    for what in ("rep0", "rep1", "rep2", "rep3"):
        assert np.array_equal(reference[what], saved[what]), what
    durable.rename(tmp_path / "away")
    shutil.rmtree(SHM / f"{shm_name}-node3")  # lost, not replaced

    results = restore(tmp_path, "mpi", shm_name, "xor:4", n=3)
    for rank, res in results.items():
        assert res["step"] == want and res["same"], res  # resharded 3 ways, bit for bit
        assert any(line.startswith(f"restored step {want} from tier '{shm_name}-node{rank}'")
                   for line in res["logs"]), res
    assert said(results, "rebuilt the share of node 'node3' (node 3, ranks 3) (node not in "
                         "the job) from xor:4 over the communicator, into the copy of node "
                         "'node0'")
    assert (step_dir(shm_name, 0, want) / "data-00003.bin").is_file()
    assert not durable.exists()
