"""Node-local tiers only, no shared directory (issue 28, item 4), with ranks as threads:
4 ranks as 2 simulated nodes (ranks 0-1, 2-3), each node's tier a directory of its own.
Each node's copy holds its ranks' data files and the whole manifest; what a rank reads
from files of the other node (replicated arrays) comes from the rank that wrote them."""
from __future__ import annotations

import shutil

import numpy as np

import uckpt
from uckpt import errors
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
    assert any("its node's copy lacks from the ranks whose copies hold them" in m for m in lines)
    assert sum(m.startswith("restored step 3 from tier 'run'") for m in lines) == 4


def test_a_step_committed_on_one_node_only_is_passed_over_then_saved_again(tmp_path, caplog):
    """Step 4 is committed on node 0's copy only (a kill between the nodes' commits):
    every rank restores step 3, and the job saves step 4 again: the next writer removes
    the step no node but node 0 holds before its first save."""
    save_steps(tmp_path, [3, 4])
    shutil.rmtree(tmp_path / "node1/run/step_00000004")
    outcomes = restore_all(tmp_path)
    assert [o[0] for o in outcomes] == [3] * 4, outcomes

    def resume(c):
        with uckpt.CheckpointManager(tiers=tiers(tmp_path), comm=c, node=node_of(c.rank)) as m:
            got = state(0, c.rank, zero=True)
            assert m.restore(got) == 3
            m.save(4, state(4, c.rank))
            return m.steps()
    with caplog.at_level("INFO", logger="uckpt.manager.node_copies"):
        assert run_ranks(4, resume) == [[3, 4]] * 4
    removed = [r.getMessage() for r in caplog.records if r.getMessage().startswith("removed")]
    assert removed and all("step 4 from tier 'run': committed on the copies of node(s) node0 "
                           "only" in m for m in removed), removed
    for rank, (step, got) in enumerate(restore_all(tmp_path)):
        assert step == 4
        for k, a in flat(state(4, rank)).items():
            np.testing.assert_array_equal(flat(got)[k], a, err_msg=k)


def test_a_wiped_node_with_node_local_tiers_only_is_named_not_restored_past(tmp_path):
    """Node 1's directory is wiped: nothing every rank can read is left; restore raises
    NodeCopyLostError on every rank (never None, which would start the job over),
    naming the node and the step, and node 0's copies stay."""
    save_steps(tmp_path, [3, 4])
    shutil.rmtree(tmp_path / "node1")
    for outcome in restore_all(tmp_path):
        assert isinstance(outcome, errors.NodeCopyLostError), outcome
        assert isinstance(outcome, FileNotFoundError)
        text = str(outcome)
        assert "node(s) node1 hold none of its checkpoints (the others hold up to step 4)" \
            in text and "durable" in outcome.hint, text
    assert sorted(p.name for p in (tmp_path / "node0/run").glob("step_*")) == \
        ["step_00000003", "step_00000004"]


def test_a_node_that_lost_its_data_files_is_named(tmp_path):
    """Node 0 keeps its manifests but lost its data files: node 1's ranks cannot fetch
    the replicated chunks node 0's ranks wrote; restore raises NodeCopyLostError naming
    the step, after trying each step."""
    save_steps(tmp_path, [3])
    for f in (tmp_path / "node0/run/step_00000003").glob("*.bin"):
        f.unlink()
    for outcome in restore_all(tmp_path):
        assert isinstance(outcome, errors.NodeCopyLostError), outcome
        assert "step 3 on tier 'run': data files its ranks read are on no node's copy" \
            in str(outcome), outcome


def test_a_wiped_node_falls_back_to_the_durable_tier_saying_why(tmp_path, caplog):
    """With a durable tier, the wiped node is named in a warning and the step restored
    from the durable copy, bit for bit."""
    def both(rank):
        return [*tiers(tmp_path), tmp_path / "durable"]

    def save(c):
        with uckpt.CheckpointManager(tiers=both(c.rank), comm=c, node=node_of(c.rank)) as m:
            m.save(3, state(3, c.rank))
    assert run_ranks(4, save) == [None] * 4
    shutil.rmtree(tmp_path / "node0")

    def restore(c):
        got = state(0, c.rank, zero=True)
        with uckpt.CheckpointManager(tiers=both(c.rank), comm=c, node=node_of(c.rank)) as m:
            return m.restore(got), got
    with caplog.at_level("INFO", logger="uckpt"):
        outcomes = run_ranks(4, restore)
    for rank, outcome in enumerate(outcomes):
        assert not isinstance(outcome, BaseException), outcome
        assert outcome[0] == 3
        for k, a in flat(state(3, rank)).items():
            np.testing.assert_array_equal(flat(outcome[1])[k], a, err_msg=k)
    lines = [r.getMessage() for r in caplog.records]
    assert any("tier 'run': node(s) node0 hold none of its checkpoints while the other nodes "
               "hold steps up to 3" in m for m in lines), lines
    assert any(m.startswith("restored step 3 from tier 'durable'") for m in lines)


def test_a_selective_restore_fetches_only_the_selected_arrays_chunks(tmp_path, caplog):
    """restore(select=...) from node-local copies: what a rank fetches from the other
    node is the chunks of the selected array (``bias``) its node lacks, not those of the
    replicated ``emb`` it does not load (fails before: every array's chunks were fetched)."""
    import re

    from uckpt.loading.reader import CheckpointReader

    save_steps(tmp_path, [3])
    with CheckpointReader(tmp_path / "node0/run/step_00000003") as reader:
        m = reader.manifest
        chunks = reader.chunks_for({"bias": None})
        lacking = [sum(c.length for c in chunks if m.files[c.file].rank // 2 != rank // 2)
                   for rank in range(4)]
    assert any(lacking) and max(lacking) <= 3000 * 4  # bias alone (emb: 160,000 bytes)

    def restore(c):
        got = state(0, c.rank, zero=True)
        with uckpt.CheckpointManager(tiers=tiers(tmp_path), comm=c, node=node_of(c.rank)) as m:
            return m.restore(got, select="bias"), got

    with caplog.at_level("INFO", logger="uckpt.loading.peer_chunks"):
        outcomes = run_ranks(4, restore)
    for rank, (step, got) in enumerate(outcomes):
        assert step == 3
        np.testing.assert_array_equal(got["bias"], state(3, rank)["bias"])
        assert not got["emb"].any()  # not selected: left as it was
    fetched = {int(r): int(n) for r, n in (
        re.match(r"rank (\d+) read \d+ chunk\(s\), (\d+) bytes", rec.getMessage()).groups()
        for rec in caplog.records if "its node's copy lacks" in rec.getMessage())}
    assert fetched == {rank: n for rank, n in enumerate(lacking) if n}
