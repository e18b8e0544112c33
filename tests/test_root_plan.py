"""A first save by several ranks is planned once, by rank 0 (uckpt.saving.root_plan), on
thread ranks: each rank holds its own share of the plan, the same items as the whole
plan every rank computed before; an inconsistent state is refused on every rank alike."""
import numpy as np

import uckpt
from uckpt.errors import StateMismatchError
from uckpt.saving.collective import finish_collective, prepare_collective
from uckpt.saving.global_plan import global_plan, local_metadata
from uckpt.saving.staging import Snapshot
from uckpt.storage import locate
from uckpt.testing import run_ranks
from uckpt.tree.flatten import flatten

SIZE = 4


def state_of(rank):
    """FSDP-style rows, a box held by two ranks each (tensor-parallel groups), replicated
    arrays of several sizes and PerRank state."""
    return {
        "rows": uckpt.Shard(np.full((3, 5), rank, np.float32), (3 * SIZE, 5), (3 * rank, 0)),
        "pairs": uckpt.Shard(np.full((2, 4), rank // 2, np.int64), (4, 4), (2 * (rank // 2), 0)),
        "big": np.arange(50_000, dtype=np.float64),
        "small": {f"b{i}": np.full(i + 1, i, np.float32) for i in range(7)},
        "rng": uckpt.PerRank({"seed": np.array([rank], np.int64)}),
        "step": 3,
    }


def values(outcomes):
    for o in outcomes:
        if isinstance(o, BaseException):
            raise o
    return outcomes


def test_each_rank_holds_its_own_share_of_the_plan_every_rank_computed_before(tmp_path):
    store, name = locate(tmp_path / "c")
    options = uckpt.SaveOptions(chunk_bytes=1 << 16)

    def body(comm):
        flat = flatten(state_of(comm.rank), rank=comm.rank)
        whole = global_plan(comm.all_gather(local_metadata(flat)), comm.rank,
                            chunk_bytes=options.chunk_bytes, alignment=options.alignment)
        p = prepare_collective(store, name, flat, comm, options=options)
        finish_collective(p, Snapshot(flat), comm)
        return whole, p.plan

    for rank, (whole, view) in enumerate(values(run_ranks(SIZE, body))):
        assert {it.rank for it in view.plan.items} == {rank}
        assert list(view.plan.items) == whole.plan.for_rank(rank)
        assert view.plan.file_sizes == whole.plan.file_sizes
        assert view.metas == whole.metas and view.starts == whole.starts
    assert len(whole.plan.items) > len(view.plan.items) > 0
    tree = uckpt.load(tmp_path / "c")
    assert np.array_equal(tree["rows"], np.repeat(np.arange(SIZE, dtype=np.float32), 3)[:, None]
                          * np.ones((1, 5), np.float32))
    assert np.array_equal(tree["big"], np.arange(50_000, dtype=np.float64))
    assert [int(tree["rng"][r]["seed"][0]) for r in range(SIZE)] == list(range(SIZE))
    assert np.array_equal(tree["pairs"], np.repeat([0, 1], 2)[:, None] * np.ones((1, 4), np.int64))


def test_an_inconsistent_state_is_refused_with_rank_0s_error_on_every_rank(tmp_path):
    def body(comm):
        state = state_of(comm.rank)
        if comm.rank == 3:  # rank 3 declares rank 2's rows: its own are held by none
            state["rows"] = uckpt.Shard(np.zeros((3, 5), np.float32), (3 * SIZE, 5), (6, 0))
        uckpt.save(tmp_path / "c", state, comm=comm)

    out = run_ranks(SIZE, body)
    for e in out:
        assert isinstance(e, StateMismatchError), e
        assert "sharded leaf 'rows': the ranks' boxes cover 45 of its 60 elements" in str(e)
        assert e.leaf == "rows" and e.hint
    assert len({str(e) for e in out}) == 1
    assert not (tmp_path / "c").exists()
