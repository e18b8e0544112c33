"""Node-local tiers only, no shared directory (issue 28, item 4), with ranks as threads:
4 ranks as 2 simulated nodes (ranks 0-1, 2-3), each node's tier a directory of its own.
Each node's copy holds its ranks' data files and the whole manifest; what a rank reads
from files of the other node (replicated arrays) comes from the rank that wrote them."""
from __future__ import annotations


import numpy as np
import pytest

import uckpt
from uckpt.testing import run_ranks

ROWS = 16


def node_of(rank):
    return f"node{rank // 2}"


def tiers(tmp_path, keep=2):
    return [uckpt.Tier(tmp_path / "{node}" / "run", keep=keep)]


def state(step, rank, zero=False):
    """Sharded rows of ``w``, replicated ``emb`` and ``bias`` (every rank holds them; the
    planner spreads them over every rank's file), and this rank's own RNG state."""
    def fill(a):
        return np.zeros_like(a) if zero else a
    full = np.arange(ROWS * 4, dtype=np.float32).reshape(ROWS, 4) * step
    lo, hi = rank * ROWS // 4, (rank + 1) * ROWS // 4
    return {"w": uckpt.Shard(fill(full[lo:hi].copy()), full.shape, (lo, 0)),
            "emb": fill(np.arange(20000, dtype=np.float64) * step),
            "bias": fill(np.arange(3000, dtype=np.int32) + step),
            "rng": uckpt.PerRank(fill(np.array([rank, step, 7], dtype=np.int64)))}


def flat(s):
    return {"w": s["w"].array, "emb": s["emb"], "bias": s["bias"], "rng": s["rng"].value}


def save_steps(tmp_path, steps, keep=2):
    def save(c):
        with uckpt.CheckpointManager(tiers=tiers(tmp_path, keep), comm=c,
                                     node=node_of(c.rank)) as m:
            for step in steps:
                m.save(step, state(step, c.rank))
    assert run_ranks(4, save) == [None] * 4


def restore_all(tmp_path):
    def restore(c):
        got = state(0, c.rank, zero=True)
        with uckpt.CheckpointManager(tiers=tiers(tmp_path), comm=c, node=node_of(c.rank)) as m:
            return m.restore(got), got
    return run_ranks(4, restore)


def test_replicated_state_restores_from_node_local_tiers_only(tmp_path, caplog):
    """The replicated arrays are spread over all four ranks' files, so each node's copy
    lacks half their chunks: restore reads those from the other node's ranks, bit for
    bit, and nothing else is needed (there is no other tier)."""
    save_steps(tmp_path, [3])
    for k in (0, 1):  # each node holds its own ranks' files only
        names = sorted(p.name for p in (tmp_path / f"node{k}/run/step_00000003").iterdir()
                       if p.name.endswith(".bin"))
        assert len(names) == 2, names
    with caplog.at_level("INFO", logger="uckpt"):
        outcomes = restore_all(tmp_path)
    for rank, outcome in enumerate(outcomes):
        assert not isinstance(outcome, BaseException), outcome
        step, got = outcome
        assert step == 3
        for k, a in flat(state(3, rank)).items():
            np.testing.assert_array_equal(flat(got)[k], a, err_msg=k)
    lines = [r.getMessage() for r in caplog.records]
    assert any("its node's copy lacks from the ranks that wrote them" in m for m in lines)
    assert sum(m.startswith("restored step 3 from tier 'run'") for m in lines) == 4
