"""The planner as pure data: each rank's metadata (global_plan.local_metadata) in, the same
checked plan on every rank out. No communicator, no files: what the collective save
exchanges is built here directly, as DCP's unit tests build local plans."""
import numpy as np
import pytest

import uckpt
from uckpt.errors import StateMismatchError
from uckpt.saving.global_plan import (compact, expand, global_plan, local_metadata, merged_tree,
                               shared_tree)
from uckpt.tree.flatten import flatten


def gather(states, compare=True):
    """What every rank holds after the plan exchange: each rank's compacted metadata,
    rank 0's replicated leaves put back in place of matching digests."""
    metas = [local_metadata(flatten(s, rank=r), compare=compare) for r, s in enumerate(states)]
    gathered = [compact(m, r) for r, m in enumerate(metas)]
    differ = expand(gathered)
    for r in differ or ():
        gathered[r]["replicated"] = metas[r]["replicated"]
    return gathered, differ


def rows(n_rows, size, rank, cols=3):
    """Rank ``rank``'s block of rows of an ``n_rows`` x ``cols`` array split over ``size``."""
    bounds = np.linspace(0, n_rows, size + 1).astype(int)
    full = np.arange(n_rows * cols, dtype=np.float32).reshape(n_rows, cols)
    return uckpt.Shard(full[bounds[rank]:bounds[rank + 1]], (n_rows, cols), (bounds[rank], 0))


def covered_once(plan, metas):
    """Every element of every array is in exactly one write item."""
    for path, meta in metas.items():
        count = np.zeros(meta.shape, dtype=np.int64)
        for it in plan.items:
            if it.path == path:
                count[tuple(slice(s, s + n) for s, n in zip(it.start, it.shape))] += 1
        assert (count == 1).all(), path


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 6, 7, 8])
def test_every_rank_computes_the_same_plan_and_writes_each_byte_once(size):
    states = [{"w": np.ones((40, 25)), "b": np.arange(7), "z": rows(13, size, r), "step": 3}
              for r in range(size)]
    gathered, differ = gather(states, compare=size > 1)
    assert differ is None
    plans = [global_plan(gathered, r, exact_chunk_bytes=1000) for r in range(size)]
    assert all(p.plan == plans[0].plan and p.metas == plans[0].metas for p in plans)
    covered_once(plans[0].plan, plans[0].metas)
    assert plans[0].plan.world_size == size
    # sharded rows are written by the ranks that hold them
    for it in plans[0].plan.items:
        if it.path == "z":
            assert states[it.rank]["z"].offsets[0] <= it.start[0] < \
                states[it.rank]["z"].offsets[0] + states[it.rank]["z"].array.shape[0]
    for r, p in enumerate(plans):  # where each rank's local array sits in the global one
        assert p.starts.get("z", (0, 0)) == (tuple(states[r]["z"].offsets)
                                              if size > 1 else (0, 0))


@pytest.mark.parametrize("size", [2, 4, 8])
def test_replicated_bytes_are_balanced(size):
    states = [{f"p{i}": np.zeros((16, 64), np.float32) for i in range(3 * size)}] * size
    gathered, _ = gather(states)
    per_rank = global_plan(gathered, 0, exact_chunk_bytes=1 << 12).plan.bytes_per_rank()
    assert sorted(set(per_rank.values())) == [3 * 4096]


def test_ranks_holding_the_same_box_write_it_once():
    box = uckpt.Shard(np.ones((2, 3), np.float32), (4, 3), (0, 0))
    other = uckpt.Shard(np.ones((2, 3), np.float32), (4, 3), (2, 0))
    gathered, _ = gather([{"z": box}, {"z": box}, {"z": other}])
    items = [it for it in global_plan(gathered, 0).plan.items if it.path == "z"]
    assert sorted((it.start, it.rank) for it in items) == [((0, 0), 0), ((2, 0), 2)]


def test_overlapping_boxes_are_refused_naming_them():
    a = uckpt.Shard(np.ones((3, 3), np.float32), (4, 3), (0, 0))
    b = uckpt.Shard(np.ones((2, 3), np.float32), (4, 3), (2, 0))
    gathered, _ = gather([{"z": a}, {"z": b}])
    with pytest.raises(StateMismatchError, match=r"'z'.*\[0, 0\] \(shape \[3, 3\]\) and at "
                                                 r"\[2, 0\] \(shape \[2, 3\]\) overlap") as e:
        global_plan(gathered, 0)
    assert e.value.leaf == "z"


def test_boxes_leaving_a_gap_are_refused():
    a = uckpt.Shard(np.ones((1, 3), np.float32), (4, 3), (0, 0))
    b = uckpt.Shard(np.ones((2, 3), np.float32), (4, 3), (2, 0))
    gathered, _ = gather([{"z": a}, {"z": b}])
    with pytest.raises(StateMismatchError, match=r"'z'.*cover 9 of its 12 elements"):
        global_plan(gathered, 1)


def test_a_box_outside_the_global_shape_is_refused():
    """What a rank sends is checked, not trusted: a box past the array's end (here forged in
    the gathered metadata, as a faulty rank could send it) is named."""
    a = uckpt.Shard(np.ones((2, 3), np.float32), (4, 3), (0, 0))
    b = uckpt.Shard(np.ones((2, 3), np.float32), (4, 3), (2, 0))
    gathered, _ = gather([{"z": a}, {"z": b}])
    path, dtype, gshape, start, shape, small = gathered[1]["own"][0]
    gathered[1]["own"][0] = (path, dtype, gshape, [3, 0], shape, small)
    with pytest.raises(StateMismatchError, match=r"'z'.*box at \[3, 0\] \(shape \[2, 3\]\) "
                                                 r"is not inside its global shape \[4, 3\]"):
        global_plan(gathered, 0)


@pytest.mark.parametrize("overlap", [False, True])
def test_many_boxes_are_checked_without_comparing_every_pair(overlap):
    """20,000 one-row boxes over 2 ranks (a row-sharded table): the old pairwise check
    needed 20,000 x 20,000 comparisons (3.2 GB of booleans); the tiling check is
    O(n log n). One duplicated row is found and named."""
    n = 20_000
    state = {"t": uckpt.Shard(np.ones((1, 2), np.float32), (n, 2), (0, 0))}
    gathered, _ = gather([state, state])
    path, dtype, gshape, start, shape, small = gathered[0]["own"][0]
    for g, first in zip(gathered, (0, 1)):
        g["own"] = [(path, dtype, gshape, [r, 0], shape, small) for r in range(first, n, 2)]
    if overlap:  # rank 0 holds rows 7-8 instead of row 8; rank 1 holds row 7 too
        gathered[0]["own"][4] = (path, dtype, gshape, [7, 0], [2, 2], small)
    if not overlap:
        plan = global_plan(gathered, 0).plan
        assert len([it for it in plan.items if it.path == "t"]) == n
        return
    with pytest.raises(StateMismatchError, match=r"'t'.*overlap \(both hold element \[7, 0\]\)"):
        global_plan(gathered, 0)


def test_a_single_rank_shard_must_cover_its_array():
    gathered, _ = gather([{"z": uckpt.Shard(np.ones(2), (5,), (1,))}], compare=False)
    with pytest.raises(StateMismatchError, match="cover 2 of its 5"):
        global_plan(gathered, 0)


def test_structure_differing_names_the_rank_and_key():
    states = [{"a": np.ones(2), "n": 1}, {"a": np.ones(2), "n": 1}, {"a": np.ones(2), "n": 2}]
    gathered, _ = gather(states)
    with pytest.raises(StateMismatchError, match=r"rank\(s\) 2 differ from rank 0 \(rank 2 in "
                                                 r"key\(s\) 'n'\)"):
        global_plan(gathered, 0)


def test_dtype_differing_names_the_leaf_and_rank():
    states = [{"a": uckpt.Shard(np.ones(2, np.float32), (4,), (0,))},
              {"a": uckpt.Shard(np.ones(2, np.float64), (4,), (2,))}]
    gathered, _ = gather(states)
    with pytest.raises(StateMismatchError, match=r"leaf 'a' is float32 \[4\] on one rank and "
                                                 r"float64 \[4\] on rank 1"):
        global_plan(gathered, 0)


def test_differing_replicated_values_are_found_through_the_digests():
    states = [{"a": np.full(4, float(r >= 1))} for r in range(3)]
    gathered, differ = gather(states)
    assert differ == [1, 2]
    with pytest.raises(StateMismatchError, match=r"'a' holds different values.*ranks 0; "
                                                 r"ranks 1, 2"):
        global_plan(gathered, 0)


def test_compact_sends_a_digest_instead_of_the_leaf_list():
    metas = [local_metadata(flatten({"a": np.ones(3)}, rank=r)) for r in range(2)]
    assert isinstance(compact(metas[1], 1)["replicated"], str)
    assert compact(metas[0], 0)["replicated"] == metas[0]["replicated"]


def test_per_rank_subtrees_merge_into_one_tree():
    flats = [flatten({"x": np.ones(2), "rng": uckpt.PerRank({"seed": r})}, rank=r)
             for r in range(3)]
    assert shared_tree(flats[0]) == shared_tree(flats[2])  # what ranks must agree on
    gathered, _ = gather([{"x": np.ones(2), "rng": uckpt.PerRank({"seed": r})} for r in range(3)])
    tree = merged_tree(flats[0].skeleton, gathered)
    items = tree["items"]["rng"]["items"]
    assert list(items) == ["0", "1", "2"]
    assert [items[k]["items"]["seed"]["value"] for k in items] == [0, 1, 2]
