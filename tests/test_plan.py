"""The save planner is pure data: deterministic, complete, balanced."""
from uckpt.saving.plan import ArrayMeta, split_box
from uckpt.saving.plan_columns import plan_save


def split_rows(meta, chunk_bytes):
    return split_box(meta.dtype, (0,) * len(meta.shape), meta.shape, chunk_bytes)


def test_split_rows_covers_array_exactly():
    meta = ArrayMeta("float32", (1000, 7))
    boxes = split_rows(meta, chunk_bytes=4096)
    assert sum(shape[0] for _, shape in boxes) == 1000
    assert [start[0] for start, _ in boxes] == sorted({start[0] for start, _ in boxes})
    assert all(shape[1:] == (7,) for _, shape in boxes)
    assert max(shape[0] for _, shape in boxes) - min(shape[0] for _, shape in boxes) <= 1
    assert split_rows(ArrayMeta("float32", ()), 4) == [((), ())]
    assert split_rows(ArrayMeta("float32", (0, 3)), 4) == []


def test_plan_offsets_aligned_and_disjoint():
    arrays = {f"a{i}": ArrayMeta("float64", (i + 1, 3)) for i in range(10)}
    plan = plan_save(arrays, alignment=64)
    ends = sorted((it.offset, it.offset + it.length) for it in plan.items)
    assert all(o % 64 == 0 for o, _ in ends)
    assert all(e1 <= o2 for (_, e1), (o2, _) in zip(ends, ends[1:]))
    assert dict(plan.file_sizes)["data-00000.bin"] == ends[-1][1]


def test_plan_is_deterministic_and_balanced_across_ranks():
    arrays = {"big": ArrayMeta("float32", (4096, 256)), "mid": ArrayMeta("float32", (300, 300)),
              **{f"s{i}": ArrayMeta("int8", (i,)) for i in range(50)}}
    p1 = plan_save(arrays, world_size=4, chunk_bytes=64 << 10)
    p2 = plan_save(dict(arrays), world_size=4, chunk_bytes=64 << 10)
    assert p1 == p2
    total = sum(m.nbytes for m in arrays.values())
    per_rank = p1.bytes_per_rank()
    assert sum(per_rank.values()) == total  # every byte exactly once
    mean = total / 4
    assert all(abs(b - mean) / mean <= 0.10 for b in per_rank.values())
