"""Issue 28, item 5: a restart on fewer ranks from node-local copies (ranks as threads).

4 ranks as 2 simulated nodes (ranks 0-1, 2-3) save to ``{node}``-local copies and a
durable tier; the job restarts as 3 ranks (0-1 on node0, 2 on node1) with the durable
tier out of reach, and reshards: the sharded rows are read 3 ways, the replicated arrays
whole, each surviving rank's ``PerRank`` value is its own (rank 3's is not restored, as
on a shared directory: docs/distributed.md). Rank 3 wrote part of the replicated arrays
into node1's copy and is gone: node1's remaining rank serves them.
"""
from __future__ import annotations

import shutil

import numpy as np
import pytest

import uckpt
from uckpt.testing import run_ranks

ROWS = 12


def node_of(rank):
    return f"node{rank // 2}"


def tiers(tmp_path):
    return [uckpt.Tier(tmp_path / "{node}" / "run", keep=2), tmp_path / "durable"]


def state(rank, size, step=3, zero=False):
    """Rows of ``w`` split ``size`` ways; four replicated arrays (the planner spreads them
    over the four writers' files, so rank 3 writes some); this rank's own ``rng``."""
    def fill(a):
        return np.zeros_like(a) if zero else a
    full = np.arange(ROWS * 4, dtype=np.float32).reshape(ROWS, 4) * step
    lo, hi = rank * ROWS // size, (rank + 1) * ROWS // size
    out = {"w": uckpt.Shard(fill(full[lo:hi].copy()), full.shape, (lo, 0)),
           "rng": uckpt.PerRank(fill(np.array([rank, step, 7], dtype=np.int64)))}
    out.update({f"rep{i}": fill(np.arange(5000, dtype=np.float64) * (i + 1) + step)
                for i in range(4)})
    return out


def restore_as_three(tiers_of, node_of, reference, caplog):
    """Restore step 3 on 3 thread ranks, each checked bit for bit against ``reference``
    (the consolidated checkpoint); the lines logged."""
    def restore(c):
        got = state(c.rank, 3, zero=True)
        with uckpt.CheckpointManager(tiers=tiers_of(), comm=c, node=node_of(c.rank)) as m:
            return m.restore(got), got
    with caplog.at_level("INFO", logger="uckpt"):
        outcomes = run_ranks(3, restore)
    for rank, outcome in enumerate(outcomes):
        assert not isinstance(outcome, BaseException), outcome
        step, got = outcome
        assert step == 3
        lo = rank * ROWS // 3
        np.testing.assert_array_equal(got["w"].array, reference["w"][lo:lo + ROWS // 3])
        for i in range(4):
            np.testing.assert_array_equal(got[f"rep{i}"], reference[f"rep{i}"])
        np.testing.assert_array_equal(got["rng"].value, reference["rng"][rank])
    lines = [r.getMessage() for r in caplog.records]
    assert sum(m.startswith("restored step 3 from tier 'run'") for m in lines) == 3, lines
    return lines


def test_four_ranks_on_two_nodes_restore_as_three_from_node_local_copies(tmp_path, caplog):
    def save(c):
        with uckpt.CheckpointManager(tiers=tiers(tmp_path), comm=c, node=node_of(c.rank)) as m:
            m.save(3, state(c.rank, 4))
    assert run_ranks(4, save) == [None] * 4
    reference = uckpt.load(tmp_path / "durable" / "step_00000003")  # consolidated
    shutil.move(tmp_path / "durable", tmp_path / "away")
    assert sorted(p.name for p in (tmp_path / "node1/run/step_00000003").glob("*.bin")) == \
        ["data-00002.bin", "data-00003.bin"]

    restore_as_three(lambda: tiers(tmp_path), node_of, reference, caplog)
    assert sorted(reference["rng"]) == [0, 1, 2, 3]  # rank 3's stays in the checkpoint
    assert not (tmp_path / "durable").exists()


@pytest.mark.parametrize("scheme", ["partner", "xor:4"])
@pytest.mark.parametrize("lost, survivors, hosts", [
    ("node3", ["node0", "node1", "node2"], {"partner": "node0", "xor:4": "node0"}),
    ("node1", ["node3", "node0", "node2"], {"partner": "node2", "xor:4": "node0"}),
], ids=["last-lost", "another-order"])
def test_four_nodes_restore_as_three_rebuilding_the_lost_nodes_share(
        tmp_path, caplog, scheme, lost, survivors, hosts):
    """4 ranks as 4 nodes save with redundancy; one node is lost (its directory wiped) and
    not replaced; the job restarts as 3 ranks on the others, durable tier out of reach:
    the lost share is rebuilt from the survivors' redundancy into the copy of its host
    (partner: the next node, which kept its partner copy; xor:4: the lowest other member
    of its group) and served from there; the state is resharded 3 ways, bit for bit
    against the consolidated durable copy. In ``another-order`` the survivors are ranks
    0, 1, 2 on node3, node0, node2, as an elastic launcher may number them: the rebuild
    matches the records' nodes by name, not by order."""
    def tiers_of():
        return [uckpt.Tier(tmp_path / "{node}" / "run", keep=2, redundancy=scheme),
                tmp_path / "durable"]

    def save(c):
        with uckpt.CheckpointManager(tiers=tiers_of(), comm=c, node=f"node{c.rank}") as m:
            m.save(3, state(c.rank, 4))
    assert run_ranks(4, save) == [None] * 4
    reference = uckpt.load(tmp_path / "durable" / "step_00000003")
    shutil.move(tmp_path / "durable", tmp_path / "away")
    shutil.rmtree(tmp_path / lost)

    lines = restore_as_three(tiers_of, survivors.__getitem__, reference, caplog)
    k, host = int(lost[len("node"):]), hosts[scheme]
    assert (tmp_path / host / f"run/step_00000003/data-{k:05d}.bin").is_file()
    assert any(f"rebuilt the share of node '{lost}' (node {k}, ranks {k}) (node not in the "
               f"job) from {scheme} over the communicator, into the copy of node '{host}'"
               in m for m in lines), lines
    assert not (tmp_path / "durable").exists()
