"""The planner's output, bit for bit: the plans of varied states (replicated arrays
split into chunks, row and column shards, per-rank leaves, empty and 0-d arrays, several
dtypes, alignments and chunk sizes) against digests of the plans that the planner before
its vectorization (issue 27) made of the same inputs."""
import hashlib

import numpy as np
import pytest

import uckpt
from uckpt.saving.global_plan import compact, expand, global_plan, local_metadata
from uckpt.tree.flatten import flatten


def varied(rank, size):
    rng = np.random.default_rng(7)
    rows = np.linspace(0, 37, size + 1).astype(int)
    cols = np.linspace(0, 10, size + 1).astype(int)
    lo, hi, clo, chi = rows[rank], rows[rank + 1], cols[rank], cols[rank + 1]
    return {
        "big": rng.standard_normal((300, 70)).astype(np.float32),
        "vec": np.arange(5000, dtype=np.int64), "scalar": np.float64(3.5),
        "empty": np.zeros((0, 4), np.float32), "flags": np.ones((9, 3), bool),
        "half": np.ones((64, 33), np.float16), "step": 11,
        "rows": uckpt.Shard(np.ones((hi - lo, 6), np.float32), (37, 6), (lo, 0)),
        "cols": uckpt.Shard(np.ones((400, chi - clo), np.float64), (400, 10), (0, clo)),
        "tall": uckpt.Shard(np.ones((hi - lo, 1, 300), np.int32), (37, 1, 300), (lo, 0, 0)),
        "opt": {"m": [np.full(17, i, np.float32) for i in range(4)]},
        "mine": uckpt.PerRank({"seed": np.arange(rank + 2), "big": np.ones((50, 40))}),
    }


def plan_digest(size, exact_chunk_bytes, chunk_bytes, alignment):
    metas = [local_metadata(flatten(varied(r, size), rank=r), compare=size > 1)
             for r in range(size)]
    gathered = [compact(m, r) for r, m in enumerate(metas)]
    assert not expand(gathered)
    h = hashlib.sha256()
    for rank in range(size):
        gp = global_plan(gathered, rank, exact_chunk_bytes, chunk_bytes=chunk_bytes,
                         alignment=alignment)
        h.update(repr((gp.plan, list(gp.metas.items()), sorted(gp.starts.items()))).encode())
    return h.hexdigest()[:32]


@pytest.mark.parametrize("size,exact_chunk_bytes,chunk_bytes,alignment,want", [
    (1, 0, 64 << 20, 4096,
     "8fa0b080486c5cf091ee85754da1e093"),
    (1, 0, 4096, 64,
     "87d168e18c69db55b1ac387bdc2242c6"),
    (3, 0, 8192, 4096,
     "0bd0a366b16c94fe267858c7f9cd2ae0"),
    (3, 2048, 64 << 20, 1,
     "bb14d327a69a1b1efe43488b7901e02c"),
    (5, 0, 3000, 512,
     "73fdeec06ffc20a7cd5eb87500b4716e"),
    (8, 0, 1 << 20, 4096,
     "a3cae973fcd823cdb04bcf9c391869f2"),
])
def test_plans_are_those_made_before(size, exact_chunk_bytes, chunk_bytes, alignment, want):
    assert plan_digest(size, exact_chunk_bytes, chunk_bytes, alignment) == want
