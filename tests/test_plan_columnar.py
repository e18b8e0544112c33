"""plan_holdings in NumPy columns (issue 27 item 3) makes the very plans that its per-chunk
Python loop made: the same items in the same order, owners, offsets and file sizes. The
loop is kept here, as it was on main, as the reference."""
import heapq
import math

import numpy as np
import pytest

from uckpt.format import data_file_name
from uckpt.saving.plan import ArrayMeta, SavePlan, WriteItem, split_box
from uckpt.saving.plan_columns import plan_columns, plan_holdings
from uckpt import dtypes


def reference_plan(arrays, holders, world_size, chunk_bytes, alignment):
    """plan_holdings and layout as they were before the columns (main at c834208)."""
    everyone = tuple(range(world_size))
    chunks = []
    for p, m in arrays.items():
        size = dtypes.itemsize(m.dtype)
        for (bstart, bshape), ranks in holders[p]:
            nbytes = size * math.prod(bshape)
            if nbytes and nbytes < 2 * chunk_bytes:
                chunks.append((p, tuple(bstart), tuple(bshape), tuple(ranks), nbytes))
            elif nbytes:
                chunks.extend((p, start, shape, tuple(ranks), size * math.prod(shape))
                              for start, shape in split_box(m.dtype, bstart, bshape,
                                                            chunk_bytes))
    order = {p: i for i, p in enumerate(arrays)}
    keys = [(-x[4], order[x[0]], x[1]) for x in chunks]
    ranked = sorted(range(len(chunks)), key=keys.__getitem__)
    load = [0] * world_size
    lightest = [(0, r) for r in everyone]
    owner = [0] * len(chunks)
    for i in ranked:
        ranks, length = chunks[i][3], chunks[i][4]
        if len(ranks) == 1:
            rank = ranks[0]
        elif ranks == everyone:
            while lightest[0][0] != load[lightest[0][1]]:
                heapq.heapreplace(lightest, (load[lightest[0][1]], lightest[0][1]))
            rank = lightest[0][1]
        else:
            rank = min(ranks, key=lambda r: (load[r], r))
        owner[i] = rank
        load[rank] += length
        if ranks == everyone:
            heapq.heapreplace(lightest, (load[rank], rank))
    items, ends, last = [], [0] * world_size, [None] * world_size
    names = [data_file_name(r) for r in range(world_size)]
    for i, (p, start, shape, _, length) in enumerate(chunks):
        rank = owner[i]
        offset = ends[rank]
        if last[rank] != p:
            offset = -(-offset // alignment) * alignment
            last[rank] = p
        items.append(WriteItem(p, start, shape, rank, names[rank], offset, length))
        ends[rank] = offset + length
    return SavePlan(world_size, tuple(items), tuple((names[r], ends[r]) for r in range(world_size)))


def cuts(n, parts, rng, uneven):
    """``parts`` + 1 increasing bounds from 0 to ``n`` (some parts empty when uneven)."""
    if not uneven:
        return np.linspace(0, n, parts + 1).astype(int).tolist()
    return [0] + sorted(rng.integers(0, n + 1, parts - 1).tolist()) + [n]


def state(world, seed, uneven=False):
    """Arrays and who holds which box: replicated, row (FSDP) and column shards, shards
    replicated over groups of ranks (HSDP), 0-d, empty and 3-d arrays, several dtypes."""
    rng = np.random.default_rng(seed)
    everyone = tuple(range(world))
    arrays, holders = {}, {}

    def whole(p, dtype, shape, ranks=everyone):
        arrays[p] = ArrayMeta(dtype, shape)
        holders[p] = [(((0,) * len(shape), shape), ranks)]

    whole("scalar", "float64", ())
    whole("empty", "float32", (0, 4))
    for i in range(int(rng.integers(2, 6))):
        whole(f"rep.{i}", ["float32", "int64", "bool", "float16"][i % 4],
              (int(rng.integers(1, 300)), int(rng.integers(1, 40))))
    for i in range(int(rng.integers(2, 6))):  # rows: rank r holds block r
        n, c = int(rng.integers(world, 200)), int(rng.integers(1, 30))
        b = cuts(n, world, rng, uneven)
        arrays[f"rows.{i}"] = ArrayMeta("float32", (n, c))
        holders[f"rows.{i}"] = sorted((((b[r], 0), (b[r + 1] - b[r], c)), (r,))
                                      for r in range(world))
    for i in range(2):  # columns: the slabs of a split box interleave with other boxes'
        n, c = int(rng.integers(50, 400)), int(rng.integers(world, 3 * world + 2))
        b = cuts(c, world, rng, uneven)
        arrays[f"cols.{i}"] = ArrayMeta("float64", (n, c))
        holders[f"cols.{i}"] = sorted((((0, b[r]), (n, b[r + 1] - b[r])), (r,))
                                      for r in range(world))
    groups = max(1, world // 2)  # HSDP: group g's box held by ranks g, g + groups, ...
    n = int(rng.integers(groups, 120))
    b = cuts(n, groups, rng, uneven)
    arrays["hsdp"] = ArrayMeta("int32", (n, 3, 5))
    holders["hsdp"] = sorted((((b[g], 0, 0), (b[g + 1] - b[g], 3, 5)),
                              tuple(range(g, world, groups))) for g in range(groups))
    c = int(rng.integers(groups, 3 * groups + 2))  # and by columns, split into slabs
    b = cuts(c, groups, rng, uneven)
    arrays["hsdp_cols"] = ArrayMeta("float32", (int(rng.integers(20, 90)), c))
    n = arrays["hsdp_cols"].shape[0]
    holders["hsdp_cols"] = sorted((((0, b[g]), (n, b[g + 1] - b[g])),
                                   tuple(range(g, world, groups))) for g in range(groups))
    holders["rep_cols"] = [(box, everyone) for box, _ in holders["hsdp_cols"]]  # overlapping
    arrays["rep_cols"] = arrays["hsdp_cols"]
    return arrays, holders


@pytest.mark.parametrize("world", [1, 3, 16])
@pytest.mark.parametrize("chunk_bytes,alignment", [(64 << 20, 4096), (256, 1), (100, 64),
                                                   (4096, 7)])
@pytest.mark.parametrize("uneven", [False, True])
def test_columns_plan_what_the_loop_planned(world, chunk_bytes, alignment, uneven):
    for seed in range(3):
        arrays, holders = state(world, seed, uneven)
        want = reference_plan(arrays, holders, world, chunk_bytes, alignment)
        got = plan_holdings(arrays, holders, world, chunk_bytes, alignment)
        assert len(want.items) > len(arrays) // 2
        assert got == want


def test_plan_of_nothing():
    """No bytes to write (only empty arrays): no items, every file empty, as before."""
    arrays = {"e": ArrayMeta("float32", (0, 3))}
    holders = {"e": [(((0, 0), (0, 3)), (0, 1))]}
    assert plan_holdings(arrays, holders, 2, 1 << 20, 4096) == \
        reference_plan(arrays, holders, 2, 1 << 20, 4096) == \
        SavePlan(2, (), ((data_file_name(0), 0), (data_file_name(1), 0)))


@pytest.mark.parametrize("world", [1, 3, 16])
def test_shares_are_each_ranks_items(world):
    """What rank 0 scatters: each rank's items of the whole plan, in order, as columns."""
    arrays, holders = state(world, 5, uneven=True)
    columns = plan_columns(arrays, holders, world, 100, 64)
    plan = columns.plan()
    shares = columns.shares()
    assert len(shares) == world
    for rank, (paths, starts, shapes, offsets, lengths) in enumerate(shares):
        assert [(it.path, it.start, it.shape, it.offset, it.length)
                for it in plan.for_rank(rank)] == list(zip(paths, starts, shapes, offsets,
                                                           lengths))
    assert sum(len(paths) for paths, *_ in shares) == len(plan.items)
