"""Distributed saves and loads on real processes: mpiexec -n 4 and torch.distributed (gloo).

Every run has a hard timeout (tests/multiproc.py): a hang fails the test.
"""
import glob
import os
import signal
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import uckpt
from conftest import entries
from multiproc import HAVE_MPI, HAVE_TORCH, run_mpi, run_torch

# one pytest-xdist worker runs the whole module: its module-scoped launches ran once per
# worker otherwise (see docs/testing.md)
pytestmark = pytest.mark.xdist_group("distributed")

WORKER = Path(__file__).with_name("dist_worker.py")
needs_mpi = pytest.mark.skipif(not HAVE_MPI, reason="mpi4py/mpiexec missing")
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch missing")


def run(backend, n, *args, **kw):
    launch = run_mpi if backend == "mpi" else run_torch
    return launch(n, WORKER, backend, *map(str, args), timeout=kw.pop("timeout", 120), **kw)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Checkpoints of the same training state written by 4, 3 and 1 ranks."""
    root = tmp_path_factory.mktemp("dist")
    out = {}
    for n, backend in ((4, "mpi"), (3, "torch"), (1, "mpi")):
        out[n] = root / f"by{n}"
        r = run(backend, n, "save", out[n]).check()
        assert sorted(r.results) == list(range(n))
    return out


def chunk_bytes_per_file(directory):
    per_file, chunks = Counter(), Counter()
    for entry in uckpt.manifest(directory).arrays.values():
        for c in entry.chunks:
            per_file[c.file] += c.length
            chunks[c.file] += 1
    return per_file, chunks


@needs_mpi
@needs_torch
def test_every_rank_writes_its_own_file(saved):
    m = uckpt.manifest(saved[4])
    assert m.world_size == 4 and sorted(m.files) == [f"data-{r:05d}.bin" for r in range(4)]
    per_file, _ = chunk_bytes_per_file(saved[4])
    assert len(per_file) == 4 and min(per_file.values()) > 0
    # the sharded tensor's rows come from the ranks that held them
    zero = m.arrays["zero"]
    assert sorted((c.start[0], c.shape[0], c.file) for c in zero.chunks) == \
        [(0, 6, "data-00000.bin"), (6, 6, "data-00001.bin"), (12, 6, "data-00002.bin"),
         (18, 6, "data-00003.bin")]
    # per-rank state is saved once per rank, by that rank
    assert [m.arrays[f"rank_state/{r}/seed"].chunks[0].file for r in range(4)] == \
        [f"data-{r:05d}.bin" for r in range(4)]
    assert uckpt.verify(saved[4]) is not None


@needs_mpi
@needs_torch
@pytest.mark.parametrize("written,loaders,backend,split", [
    (4, 1, "mpi", "cols"), (4, 2, "torch", "rows"), (4, 3, "mpi", "cols"),
    (1, 4, "torch", "cols"), (3, 4, "mpi", "rows")])
def test_reshard_model_optimizer_and_sharded_tensor(saved, written, loaders, backend, split):
    """N ranks wrote, M ranks read: model and optimizer bitwise equal to the original on
    every rank, and each rank's slice of the sharded tensor (rows written, rows or
    columns read) equal to the consolidated original's."""
    r = run(backend, loaders, "load", saved[written], split).check()
    assert sorted(r.results) == list(range(loaders))
    for rank, res in r.results.items():
        assert res["model"] and res["optimizer"] and res["zero"], res
        assert res["step"] == 7
        # rank r gets what rank r saved, when rank r existed
        assert res["rank_state"] == (100 + rank if rank < written else None), res


def test_reshard_consolidated_view(saved):
    """One process without any communicator sees the whole (consolidated) tree."""
    if not saved:
        pytest.skip("no checkpoints")
    tree = uckpt.load(saved[4])
    ref = uckpt.load(saved[1])
    assert np.array_equal(tree["zero"], ref["zero"])
    for key in ("model", "optimizer"):
        a, b = tree[key], ref[key]
        assert repr(type(a)) == repr(type(b))
    assert sorted(tree["rank_state"]) == [0, 1, 2, 3] and sorted(ref["rank_state"]) == [0]


@needs_mpi
def test_replicated_bytes_written_once_and_balanced(tmp_path):
    directory = tmp_path / "ckpt"
    r = run("mpi", 4, "balance", directory, 40).check()
    assert all(res["ok"] for res in r.results.values()) and len(r.results) == 4
    m = uckpt.manifest(directory)
    for entry in m.arrays.values():  # exactly once: chunks tile each array (no overlap, no gap)
        assert sum(int(np.prod(c.shape)) for c in entry.chunks) == int(np.prod(entry.shape))
    per_file, chunks = chunk_bytes_per_file(directory)
    assert sum(per_file.values()) == sum(e.nbytes for e in m.arrays.values())
    assert len(per_file) == 4 and min(chunks.values()) >= 4
    mean = sum(per_file.values()) / 4
    assert all(abs(b - mean) / mean <= 0.10 for b in per_file.values()), per_file


@needs_mpi
def test_later_saves_reuse_the_plan_until_a_rank_changes(tmp_path):
    """Manager saves of steps 1-3 by 4 MPI ranks: step 2 reuses step 1's plan on every
    rank; rank 2's new leaf at step 3 makes every rank plan again. All load back."""
    r = run("mpi", 4, "plan_cache", tmp_path / "root", timeout=60).check()
    assert sorted(r.results) == [0, 1, 2, 3]
    for res in r.results.values():
        assert res["records"] == ["planning (first save)",
                                  "plan reused (structure unchanged on all 4 rank(s))",
                                  "planning (structure changed on rank(s) 2)"], res
    from dist_worker import full_shard
    for step in (1, 2, 3):
        tree = uckpt.load(tmp_path / "root" / f"step_{step:08d}")
        assert np.array_equal(tree["zero"], full_shard() + step)
        assert [int(tree["mine"][r]["seed"][0]) for r in range(4)] == [r + step for r in range(4)]
    assert np.array_equal(uckpt.load(tmp_path / "root" / "step_00000003")["mine"][2]["extra"],
                          np.ones(3))


@needs_mpi
@pytest.mark.parametrize("scenario,error,names", [
    ("mismatch", "StateMismatchError", "rank(s) 1 differ from rank 0 (rank 1 in key(s) 'step')"),
    ("badobj", "DistributedError", "rank 2: uckpt.errors.UnsupportedObjectError"),
    ("differs", "StateMismatchError", "replicated leaf 'seed' holds different values"),
    ("diverged", "StateMismatchError", "'layer' holds different values on different ranks "
                                       "(ranks 0, 1, 2; ranks 3)"),
])
def test_inconsistent_state_is_refused_on_every_rank(tmp_path, scenario, error, names):
    directory = tmp_path / "ckpt"
    r = run("mpi", 4, scenario, directory, timeout=60).check()
    assert sorted(r.results) == [0, 1, 2, 3]
    for res in r.results.values():
        assert res["raised"] == error and names in res["msg"], res
        assert not res["committed"] and res["debris"] == [], res
    assert not directory.exists()
    assert not glob.glob(str(tmp_path / ".ckpt.uckpt-tmp-*"))


@needs_mpi
@needs_torch
def test_async_two_tiers_node_loss_restore(tmp_path):
    """Async saves by 4 ranks, copied by every rank to the durable tier; after the fast
    tier is lost, all ranks restore the newest step from the durable one."""
    r = run("mpi", 4, "tiers", tmp_path).check()
    assert sorted(r.results) == [0, 1, 2, 3]
    for rank, res in r.results.items():
        assert res["fast"] == [2, 3] and res["durable"] == [2, 3], res  # keep_last=2 on both
        assert res["restored"] == 3 and res["step"] == 3, res
        assert res["model"] and res["zero"] and res["rank_state"] == 100 + rank, res
    assert uckpt.verify(tmp_path / "durable" / "step_00000003").world_size == 4


@needs_torch
def test_signal_to_one_rank_stops_every_rank_after_one_save(tmp_path):
    """SIGTERM delivered to rank 1 only: with OnSignal the ranks agree to save the same
    step and all exit 0 once it is committed."""
    r = run("torch", 4, "signal", tmp_path / "ckpt").check()
    assert sorted(r.results) == [0, 1, 2, 3]
    for res in r.results.values():
        assert res["exited"] == 0 and res["step"] == 5 and res["steps"] == [5], res
    assert uckpt.verify(tmp_path / "ckpt" / "step_00000005").world_size == 4


@needs_mpi
@needs_torch
def test_restore_falls_back_together_past_a_damaged_checkpoint(tmp_path):
    """Step 2 is damaged in rank 1's data file only: every rank skips it (with a warning
    naming it) and all restore step 1, the same step."""
    run("mpi", 4, "two_steps", tmp_path).check()
    data = tmp_path / "step_00000002" / "data-00001.bin"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0x40
    data.write_bytes(bytes(raw))
    r = run("torch", 3, "restore", tmp_path).check()
    assert sorted(r.results) == [0, 1, 2]
    for rank, res in r.results.items():
        assert res["restored"] == 1 and res["step"] == 1 and res["model"] and res["zero"], res
        assert res["rank_state"] == 100 + rank
        assert any("skipping checkpoint step 2" in w and "ChecksumMismatchError" in w
                   for w in res["warnings"]), res["warnings"]


@needs_mpi
@needs_torch
def test_load_mismatch_on_one_rank_raises_on_every_rank(saved):
    r = run("mpi", 4, "bad_target", saved[4]).check()
    assert sorted(r.results) == [0, 1, 2, 3]
    for res in r.results.values():
        assert res["raised"] == "DistributedError", res
        assert "failed on 1 of 4 rank(s): 2" in res["msg"] and "ShapeMismatchError" in res["msg"]
    assert r.results[2]["untouched"]


def _kill_rank_when_writing(directory, rank, killed):
    def monitor():
        if not killed and glob.glob(f"{directory}/.step_00000002.uckpt-tmp-*/data-{rank:05d}.bin"):
            os.kill(int(Path(f"{directory}.pid-{rank}").read_text()), signal.SIGKILL)
            killed.append(rank)
    return monitor


@needs_torch
def test_rank_killed_mid_save_gloo(tmp_path):
    """Rank 2 is SIGKILLed while it writes its data file: the survivors raise at once,
    nothing is committed, no debris is left, and step 1 loads on any number of ranks."""
    directory = tmp_path / "ckpt"
    killed = []
    r = run("torch", 4, "kill", directory, 400, env={"DIST_TIMEOUT": "20"},
            monitor=_kill_rank_when_writing(directory, 2, killed))
    assert killed == [2] and r.returncodes[2] == -signal.SIGKILL
    assert sorted(r.results) == [0, 1, 3]
    for res in r.results.values():
        assert res["raised"] in ("CommunicationError", "CollectiveTimeoutError"), res
        assert "save of step 2" in res["msg"], res
        assert res["elapsed"] < 20, res
    assert entries(directory) == ["step_00000001"]
    _previous_checkpoint_loads(directory / "step_00000001")


@needs_mpi
@needs_torch
def test_rank_killed_mid_save_mpi(tmp_path):
    """Under MPICH a SIGKILLed rank ends the whole job (no survivor can raise, nobody
    hangs); nothing is committed and step 1 still loads on any number of ranks."""
    directory = tmp_path / "ckpt"
    killed = []
    r = run("mpi", 4, "kill", directory, 400, env={"DIST_TIMEOUT": "20"},
            monitor=_kill_rank_when_writing(directory, 2, killed))
    assert killed == [2] and r.returncodes[0] != 0  # (a hang fails run()'s timeout)
    assert r.results == {}
    assert [n for n in entries(directory) if not n.startswith(".")] == ["step_00000001"]
    left = entries(directory)
    assert any(n.startswith(".step_00000002") for n in left)  # the killed save's
    with uckpt.CheckpointManager(directory) as m:  # a reader: removes nothing
        assert m.steps() == [1]
    assert entries(directory) == left
    with uckpt.CheckpointManager(directory, role="writer") as m:  # the next writer cleans up
        assert m.steps() == [1]
    assert entries(directory) == ["step_00000001"]
    _previous_checkpoint_loads(directory / "step_00000001")


def _previous_checkpoint_loads(step_dir):
    """Step 1 loads bit for bit in one process (this one: a world of one, as a launch of
    one rank was) and on 3 gloo ranks."""
    from dist_worker import check_loaded

    one = check_loaded(step_dir, 0, 1, "rows")
    assert one["model"] and one["optimizer"] and one["zero"], one
    r = run("torch", 3, "load", step_dir, "rows").check()
    assert sorted(r.results) == [0, 1, 2]
    assert all(res["model"] and res["optimizer"] and res["zero"] for res in r.results.values())


@needs_mpi
@needs_torch
def test_consolidate_then_convert_to_torch_save(saved, tmp_path):
    """A checkpoint written by 4 ranks -> one single-process checkpoint -> a torch.save file
    that torch.load(weights_only=True) reads, with the model bitwise equal to the original."""
    import subprocess
    import sys

    import torch

    from dist_worker import trained

    single = uckpt.consolidate(saved[4], tmp_path / "single")
    m = uckpt.manifest(single)
    assert m.world_size == 1 and all(len(e.chunks) == 1 for e in m.arrays.values())
    assert m.tree == uckpt.manifest(saved[4]).tree and m.step == 7
    assert np.array_equal(uckpt.load(single)["zero"], uckpt.load(saved[4])["zero"])
    out = tmp_path / "model.pt"
    r = subprocess.run([sys.executable, "-m", "uckpt.cli", "convert", "--quiet", str(single), str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    loaded = torch.load(out, weights_only=True)
    model, _ = trained()
    fresh = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 32))
    fresh.load_state_dict(loaded["model"], strict=True)
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(),
                                                 model.state_dict().values()))
