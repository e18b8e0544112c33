"""The collective save protocol (plan, write, commit) on 1 to 8 ranks played by threads
(uckpt.testing.run_ranks): real files, real planning and checking, milliseconds per test.

The multi-process tests (test_distributed.py, test_comm.py) keep covering what threads
cannot: real MPI / torch.distributed, a rank that dies, node-local storage.
"""
import os

import numpy as np
import pytest

import uckpt
from conftest import entries
from uckpt.saving.collective import finish_collective, prepare_collective
from uckpt.saving.staging import Snapshot
from uckpt.errors import (CollectiveTimeoutError, DistributedError, StateMismatchError,
                          UnsupportedObjectError)
from uckpt.storage import locate
from uckpt.testing import ThreadCommunicator, run_ranks
from uckpt.tree.flatten import flatten

RANKS = [1, 2, 3, 5, 8]


def values(outcomes):
    """Every rank's value; the first rank's exception is raised."""
    for o in outcomes:
        if isinstance(o, BaseException):
            raise o
    return outcomes


def state_of(rank, size):
    """Replicated arrays, one sharded array (rows split unevenly) and per-rank state."""
    rows = np.array_split(np.arange(size * 7 + 3, dtype=np.float32), size)
    start = sum(len(r) for r in rows[:rank])
    return {"w": np.arange(600, dtype=np.float64).reshape(20, 30),
            "b": np.full(5, 2, dtype=np.int16), "step": 7,
            "zero": uckpt.Shard(rows[rank], (size * 7 + 3,), (start,)),
            "mine": uckpt.PerRank({"seed": rank * 11})}


# --- the communicator itself --------------------------------------------------------------------
@pytest.mark.parametrize("size", RANKS)
def test_collectives_exchange_between_threads(size):
    def body(comm):
        gathered = comm.all_gather({"r": comm.rank, "t": (comm.rank, "x")})
        root = size - 1
        got = comm.broadcast(f"from {comm.rank}", root=root)
        comm.barrier()
        dup = comm.duplicate()
        return gathered, got, dup.all_gather(comm.rank * 2), (comm.rank, comm.size)

    for rank, (gathered, got, dup, who) in enumerate(values(run_ranks(size, body))):
        assert gathered == [{"r": r, "t": [r, "x"]} for r in range(size)]  # JSON: tuples -> lists
        assert got == f"from {size - 1}" and dup == [2 * r for r in range(size)]
        assert who == (rank, size)


def test_objects_must_be_json():
    out = run_ranks(2, lambda comm: comm.all_gather(object()), timeout=2)
    assert all(isinstance(e, TypeError) and "JSON-able" in str(e) for e in out)


def test_a_rank_missing_a_collective_is_named_by_the_others():
    def body(comm):
        if comm.rank == 2:
            return "skipped"
        return comm.all_gather(comm.rank)

    out = run_ranks(4, body, timeout=0.5)
    assert out[2] == "skipped"
    for r in (0, 1, 3):
        assert isinstance(out[r], CollectiveTimeoutError) and out[r].missing == [2]
        assert "rank(s) 2 did not answer" in str(out[r])


def test_failure_reaches_every_rank_with_its_type():
    def body(comm):
        comm.check(OSError(28, "No space left") if comm.rank == 1 else None, what="save")

    out = run_ranks(3, body)
    for e in out:
        assert isinstance(e, DistributedError) and "save failed on 1 of 3 rank(s): 1" in str(e)
        assert e.failed_with(OSError) and not e.failed_with(KeyError)
        assert e.failures == {1: "OSError: [Errno 28] No space left"}
    assert isinstance(out[1].__cause__, OSError) and out[0].__cause__ is None


# --- the save protocol --------------------------------------------------------------------------
@pytest.mark.parametrize("size", RANKS)
def test_save_on_n_ranks_loads_whole_in_one_process(tmp_path, size):
    target = tmp_path / "ckpt"
    locations = values(run_ranks(size, lambda comm: uckpt.save(
        target, state_of(comm.rank, size), step=7, metadata={"n": size}, comm=comm)))
    assert {str(p) for p in locations} == {str(target)}
    m = uckpt.manifest(target)
    assert (m.world_size, m.step, m.metadata) == (size, 7, {"n": size})
    assert sorted(m.files) == [f"data-{r:05d}.bin" for r in range(size)]
    got = uckpt.load(target)
    np.testing.assert_array_equal(got["w"], state_of(0, size)["w"])
    np.testing.assert_array_equal(got["zero"], np.arange(size * 7 + 3, dtype=np.float32))
    assert got["mine"] == {r: {"seed": r * 11} for r in range(size)} and got["step"] == 7
    # each sharded row comes from the rank that held it; nothing is written twice
    zero = sorted((c.start[0], c.shape[0], c.file) for c in m.arrays["zero"].chunks)
    assert sum(n for _, n, _ in zero) == size * 7 + 3
    assert [f for _, _, f in zero] == [f"data-{r:05d}.bin" for r in range(size)]
    assert entries(tmp_path) == ["ckpt"]  # no temporary directory left


def test_replicated_bytes_are_split_across_ranks(tmp_path):
    state = {f"p{i}": np.full((64, 16), i, dtype=np.float32) for i in range(8)}  # 4 KiB each
    small = uckpt.SaveOptions(chunk_bytes=1 << 12)
    values(run_ranks(4, lambda comm: uckpt.save(tmp_path / "c", state, comm=comm,
                                                options=small)))
    per_file = {}
    for entry in uckpt.manifest(tmp_path / "c").arrays.values():
        for c in entry.chunks:
            per_file[c.file] = per_file.get(c.file, 0) + c.length
    assert sorted(per_file.values()) == [8192] * 4  # 32 KiB written once, evenly


@pytest.mark.parametrize("size", [2, 8])
def test_error_on_one_rank_before_the_save_reaches_all_and_commits_nothing(tmp_path, size):
    bad = size - 1

    def body(comm):
        state = state_of(comm.rank, size)
        if comm.rank == bad:
            state["oops"] = object()  # no adapter: flattening fails on this rank only
        return uckpt.save(tmp_path / "ckpt", state, comm=comm)

    out = run_ranks(size, body)
    for e in out:
        assert isinstance(e, DistributedError), e
        assert f"failed on 1 of {size} rank(s): {bad}" in str(e) and "oops" in str(e)
        assert e.failed_with(UnsupportedObjectError)
    assert entries(tmp_path) == []


@pytest.mark.parametrize("size", [3, 8])
def test_error_while_one_rank_writes_reaches_all_and_commits_nothing(tmp_path, size):
    store, name = locate(tmp_path / "ckpt")

    def body(comm):
        flat = flatten(state_of(comm.rank, size), rank=comm.rank)
        prepared = prepare_collective(store, name, flat, comm, step=1)
        staged = OSError(28, "No space left on device") if comm.rank == 1 else Snapshot(flat)
        return finish_collective(prepared, staged, comm)

    out = run_ranks(size, body)
    for e in out:
        assert isinstance(e, DistributedError) and "(writing)" in str(e), e
        assert "rank 1: OSError: [Errno 28]" in str(e) and e.failed_with(OSError)
    assert entries(tmp_path) == []  # the temporary directory is gone, nothing committed


def test_structure_differing_on_one_rank_is_refused_on_all(tmp_path):
    def body(comm):
        state = state_of(comm.rank, 4)
        if comm.rank == 3:
            state["extra"] = 1
        return uckpt.save(tmp_path / "ckpt", state, comm=comm)

    for e in run_ranks(4, body):
        assert isinstance(e, StateMismatchError) and "rank(s) 3 differ from rank 0" in str(e)
        assert "'extra'" in str(e)
    assert entries(tmp_path) == []


def test_replicated_values_differing_are_refused_naming_the_groups(tmp_path):
    def body(comm):
        state = state_of(comm.rank, 4)
        state["b"] = np.full(5, 2 + (comm.rank >= 2), dtype=np.int16)
        return uckpt.save(tmp_path / "ckpt", state, comm=comm)

    for e in run_ranks(4, body):
        assert isinstance(e, StateMismatchError) and e.leaf == "b"
        assert "ranks 0, 1; ranks 2, 3" in str(e)
    assert entries(tmp_path) == []


def test_existing_checkpoint_is_refused_on_every_rank_and_kept(tmp_path):
    uckpt.save(tmp_path / "ckpt", {"x": np.ones(3)})
    before = sorted(os.listdir(tmp_path / "ckpt"))
    out = run_ranks(3, lambda comm: uckpt.save(tmp_path / "ckpt", state_of(comm.rank, 3),
                                               comm=comm))
    for e in out:
        assert isinstance(e, DistributedError) and "rank 0" in str(e), e
    assert sorted(os.listdir(tmp_path / "ckpt")) == before
    np.testing.assert_array_equal(uckpt.load(tmp_path / "ckpt")["x"], np.ones(3))


@pytest.mark.parametrize("size,async_save", [(2, False), (4, False), (3, True)])
def test_manager_on_thread_ranks_saves_and_restores(tmp_path, size, async_save):
    def body(comm: ThreadCommunicator):
        with uckpt.CheckpointManager(tmp_path / "run", comm=comm, keep_last=1,
                                     async_save=async_save) as m:
            for step in (1, 2):
                state = state_of(comm.rank, size)
                state["w"] = state["w"] * step
                m.save(step, state)
        with uckpt.CheckpointManager(tmp_path / "run", comm=comm) as m:
            state = state_of(comm.rank, size)
            state["zero"].array[:] = -1
            step = m.restore(state)
            return step, state["zero"].array.tolist()

    for rank, (step, zero) in enumerate(values(run_ranks(size, body))):
        expect = state_of(rank, size)["zero"].array.tolist()
        assert step == 2 and zero == expect
    assert entries(tmp_path / "run") == ["step_00000002"]
