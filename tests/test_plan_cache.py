"""Plans kept across saves (uckpt.saving.plan_cache), on ranks played by threads: a later save
with the same structure reuses the plan after an exchange of digests; any change on any
rank makes every rank plan again, with today's errors; a new manager plans once."""
import json
import logging
import os

import numpy as np
import pytest

import uckpt
from uckpt.saving.collective import finish_collective, prepare_collective, save_collective
from uckpt.saving.staging import Snapshot
from uckpt.comm.base import encode
from uckpt.errors import StateMismatchError
from uckpt.storage import locate
from uckpt.testing import ThreadCommunicator, run_ranks
from uckpt.tree.flatten import flatten


def values(outcomes):
    for o in outcomes:
        if isinstance(o, BaseException):
            raise o
    return outcomes


def state_of(rank, size, step=1, leaves=4, rows=6):
    """Replicated arrays, sharded arrays (row blocks), a plain value and per-rank state."""
    bounds = np.linspace(0, size * rows, size + 1).astype(int)
    lo, hi = int(bounds[rank]), int(bounds[rank + 1])
    state = {f"shard{i}": uckpt.Shard(np.arange(lo * 3, hi * 3, dtype=np.float32).reshape(-1, 3)
                                      + step + i, (size * rows, 3), (lo, 0))
             for i in range(leaves)}
    state.update(w=np.arange(12, dtype=np.float64).reshape(3, 4) * step,
                 b=np.full(5, step, dtype=np.int16), step=step,
                 mine=uckpt.PerRank({"seed": np.array([rank * 11 + step])}))
    return state


def plan_records(caplog):
    """Per save, by message: how many ranks reused the plan and how many planned."""
    msgs = [r.getMessage() for r in caplog.records if r.name == "uckpt.saving.plan_cache"]
    return sum("plan reused" in m for m in msgs), sum(": planning (" in m for m in msgs), msgs


@pytest.fixture
def debug(caplog):
    caplog.set_level(logging.DEBUG, logger="uckpt.saving.plan_cache")
    return caplog


def test_later_saves_reuse_the_plan(tmp_path, debug):
    size = 3

    def body(comm):
        with uckpt.CheckpointManager(tmp_path, comm=comm, keep_last=5) as m:
            for step in (1, 2, 3):
                m.save(step, state_of(comm.rank, size, step))
                comm.barrier()
                if comm.rank == 0:
                    counts.append(plan_records(debug)[:2])
                comm.barrier()
            return [uckpt.load(m.path(step)) for step in (1, 2, 3)]

    counts = []
    loaded = values(run_ranks(size, body))[0]
    # the first save plans on every rank; the later ones reuse the plan on every rank
    assert counts == [(0, 3), (3, 3), (6, 3)]
    for step, tree in zip((1, 2, 3), loaded):
        assert tree["step"] == step and np.array_equal(tree["b"], np.full(5, step, np.int16))
        whole = np.concatenate([state_of(r, size, step)["shard2"].array for r in range(size)])
        assert np.array_equal(tree["shard2"], whole)
        assert [int(tree["mine"][r]["seed"][0]) for r in range(size)] == \
            [r * 11 + step for r in range(size)]


def changed(kind, rank, size):
    """The second save's state on ``rank``: one change of structure (on rank 1 only,
    where that is possible) or of a replicated value on rank 1."""
    state = state_of(rank, size, step=2)
    if kind == "shape":
        state["w"] = np.zeros((4, 4))
    elif kind == "dtype":
        state["b"] = state["b"].astype(np.int32)
    elif kind == "new leaf" and rank == 1:
        state["mine"] = uckpt.PerRank({"seed": np.array([3]), "extra": np.ones(2)})
    elif kind == "placement":  # the row blocks of shard0 move by one row between ranks 0, 1
        g = state_of(0, size, step=2)["shard0"]
        full = np.arange(g.global_shape[0] * 3, dtype=np.float32).reshape(-1, 3)
        lo, hi = {0: (0, 5), 1: (5, 12)}.get(rank, (rank * 6, rank * 6 + 6))
        state["shard0"] = uckpt.Shard(full[lo:hi], g.global_shape, (lo, 0))
    elif kind == "replicated value" and rank == 1:
        state["w"] = state["w"] + 1
    return state


@pytest.mark.parametrize("kind", ["shape", "dtype", "new leaf", "placement"])
def test_any_change_of_structure_plans_again(tmp_path, debug, kind):
    size = 3

    def body(comm):
        with uckpt.CheckpointManager(tmp_path, comm=comm) as m:
            m.save(1, state_of(comm.rank, size))
            comm.barrier()
            before = plan_records(debug)[:2]
            comm.barrier()
            m.save(2, changed(kind, comm.rank, size))
            comm.barrier()
            after = plan_records(debug)[:2]
            m.save(3, changed(kind, comm.rank, size))  # the new structure's plan is kept
            return before, after, plan_records(debug), uckpt.load(m.path(2))

    (before, after, final, tree), *_ = values(run_ranks(size, body))
    assert before == (0, 3) and after == (0, 6), (kind, final[2])
    assert final[:2] == (3, 6)
    planned = [m for m in final[2] if "save of step 2: planning" in m]
    assert len(planned) == 3 and all("structure changed on rank(s)" in m for m in planned)
    want = [changed(kind, r, size) for r in range(size)]
    assert np.array_equal(tree["w"], want[0]["w"]) and tree["b"].dtype == want[0]["b"].dtype
    assert np.array_equal(tree["shard0"], np.concatenate([np.asarray(
        w["shard0"].array) for w in want]))


def test_replicated_value_changed_on_one_rank_is_refused_as_without_a_cache(tmp_path, debug):
    size = 3

    def body(comm):
        with uckpt.CheckpointManager(tmp_path, comm=comm) as m:
            m.save(1, state_of(comm.rank, size))
            try:
                m.save(2, changed("replicated value", comm.rank, size))
                raised = None
            except uckpt.errors.UckptError as e:
                raised = e
            m.save(3, state_of(comm.rank, size, step=3))  # the same structure: reused again
            return raised, m.steps()

    out = values(run_ranks(size, body))
    for raised, steps in out:
        assert isinstance(raised, StateMismatchError), raised
        assert "replicated leaf 'w' holds different values on different ranks (ranks 0, 2; " \
               "ranks 1)" in str(raised)
        assert steps == [1, 3]
    reused, planned, msgs = plan_records(debug)
    assert (reused, planned) == (3, 6), msgs
    assert sum("values differ between ranks" in m for m in msgs) == 3


def test_a_new_manager_plans_once_then_reuses(tmp_path, debug):
    size = 2

    def body(comm):
        for first in (1, 3):  # a resumed job: a new manager (new process) over the same root
            with uckpt.CheckpointManager(tmp_path, comm=comm) as m:
                m.save(first, state_of(comm.rank, size, first))
                m.save(first + 1, state_of(comm.rank, size, first + 1))
        return m.steps()

    assert values(run_ranks(size, body))[0] == [1, 2, 3, 4]
    _, _, msgs = plan_records(debug)
    kinds = ["reused" if "plan reused" in m else "first" if "first save" in m else m
             for m in msgs]
    assert kinds == ["first"] * 2 + ["reused"] * 2 + ["first"] * 2 + ["reused"] * 2


def test_a_kept_plan_serves_only_the_world_it_was_made_for(tmp_path, debug):
    """Caches from a world of 2 on ranks 0 and 1 of a world of 3: every rank plans."""
    from uckpt.saving.plan_cache import PlanCache
    caches = [PlanCache() for _ in range(3)]

    def saver(size, step):
        def body(comm):
            store, name = locate(tmp_path / f"s{step}")
            return save_collective(store, name, flatten(state_of(comm.rank, size, step),
                                                        rank=comm.rank), comm,
                                   cache=caches[comm.rank])
        return body

    for size, step in ((2, 1), (2, 2), (3, 3), (3, 4)):
        values(run_ranks(size, saver(size, step)))
    _, _, msgs = plan_records(debug)
    by_save = [sorted("reused" if "plan reused" in m else "first" if "first save" in m
                      else "changed" if "changed on rank(s) 0, 1, 2" in m else m
                      for m in msgs if m.startswith(f"save to {str(tmp_path / f's{step}')!r}"))
               for step in (1, 2, 3, 4)]
    assert by_save == [["first"] * 2, ["reused"] * 2, ["changed"] * 2 + ["first"],
                       ["reused"] * 3]
    tree = uckpt.load(tmp_path / "s3")
    assert np.array_equal(tree["shard1"], np.concatenate(
        [state_of(r, 3, 3)["shard1"].array for r in range(3)]))


def test_checkpoints_are_the_same_bytes_with_and_without_a_kept_plan(tmp_path):
    size = 3

    def body(comm):
        with uckpt.CheckpointManager(tmp_path / "cached", comm=comm) as m:
            m.save(1, state_of(comm.rank, size, 1))
            m.save(2, state_of(comm.rank, size, 2))  # reuses the plan
        with uckpt.CheckpointManager(tmp_path / "fresh", comm=comm) as m:
            m.save(2, state_of(comm.rank, size, 2))  # plans

            return m.path(2), os.path.relpath(m.path(2), tmp_path / "fresh")

    fresh, step = values(run_ranks(size, body))[0]
    files = sorted(os.listdir(fresh))
    assert sorted(os.listdir(tmp_path / "cached" / step)) == files and len(files) >= size + 1
    for f in files:
        cached, made = (tmp_path / "cached" / step / f).read_bytes(), (fresh / f).read_bytes()
        if f == "manifest.json":  # the same but for the time it was made (and its checksum)
            cached, made = (without_time(json.loads(b)) for b in (cached, made))
        assert cached == made, f


def without_time(manifest):
    return {k: v for k, v in manifest.items() if k not in ("created", "manifest_checksum")}


class Counting(ThreadCommunicator):
    """A thread rank's communicator that counts the bytes its all-gathers deliver."""

    received = 0

    def all_gather(self, obj):
        out = super().all_gather(obj)
        self.received += len(encode(out))
        return out


def test_a_reused_plan_exchanges_a_small_record_per_rank(tmp_path):
    """The plan exchange of a later save, and of a first save, all-gathers nothing of the
    leaves, whatever their number: only the ranks' PerRank state (here under 400 bytes
    per rank; the agreement itself is a reduction, tests/test_gather_agree.py). (Before,
    a first save all-gathered every rank's boxes.)"""
    from uckpt.saving.plan_cache import PlanCache

    def body(comm, leaves):
        c = Counting(comm.world, comm.rank, comm.group)
        cache, received = PlanCache(), []
        store, _ = locate(tmp_path / str(leaves) / "step1")
        for step in (1, 2):
            flat = flatten(state_of(c.rank, c.size, step, leaves), rank=c.rank)
            before = c.received
            p = prepare_collective(store, f"step{step}", flat, c, step=step, cache=cache)
            received.append(c.received - before)
            finish_collective(p, Snapshot(flat), c)
        return received

    size = 4
    small = values(run_ranks(size, lambda comm: body(comm, 4)))
    large = values(run_ranks(size, lambda comm: body(comm, 64)))
    # the first save too: rank 0 plans and sends each rank its share (uckpt.saving.root_plan)
    assert all(first == later for first, later in small + large), (small, large)
    for (_, later_small), (_, later_large) in zip(small, large):
        assert later_small == later_large <= 400 * size
