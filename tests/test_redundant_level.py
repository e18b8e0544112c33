"""A manager's first tier with ``redundancy=`` (issue 28, items 2 and 5), on thread ranks
as simulated nodes: each save writes every node's piece and the records of
docs/format.md 13.3 into the manifest each node commits (sync and async), a restore
rebuilds a wiped node, and the ``redundancy=`` a manager cannot keep is refused or
ignored as docs/levels.md says. (Real processes: tests/test_redundant_restart.py.)"""
import json
import shutil

import numpy as np
import pytest

import uckpt
from uckpt.errors import RedundancyConfigError, ShareLostError
from uckpt.levels.records import parse_records
from uckpt.levels.repair import find_damage
from uckpt.levels.share_io import directory_reader
from uckpt.testing import run_ranks


def shard(step, rank, size=4, zero=False):
    full = np.arange(4096, dtype=np.float32).reshape(64, 64) * (step + 1)
    lo, hi = rank * 64 // size, (rank + 1) * 64 // size
    part = np.zeros_like(full[lo:hi]) if zero else full[lo:hi].copy()
    return {"w": uckpt.Shard(part, full.shape, (lo, 0)),
            "own": uckpt.PerRank(np.full(rank + 3, step * 10 + rank, dtype=np.int64))}


def manager(tmp_path, c, scheme, node_of=lambda rank: f"n{rank // 2}", **kw):
    tiers = [uckpt.Tier(str(tmp_path / "{node}"), keep=2, redundancy=scheme),
             tmp_path / "durable"]
    return uckpt.CheckpointManager(tiers=tiers, comm=c, node=node_of(c.rank), **kw)


def records_of(tmp_path, node, step):
    doc = json.loads((tmp_path / node / f"step_{step:08d}" / "manifest.json").read_bytes())
    return doc, parse_records(doc)


@pytest.mark.parametrize("scheme, async_save", [("partner", False), ("xor:2", True)])
def test_every_node_commits_its_piece_and_the_records(tmp_path, scheme, async_save):
    def save(c):
        with manager(tmp_path, c, scheme, async_save=async_save) as m:
            for step in (1, 2):
                m.save(step, shard(step, c.rank))
    assert run_ranks(4, save) == [None] * 4
    first, _ = records_of(tmp_path, "n0", 2)
    for k in range(2):
        doc, rec = records_of(tmp_path, f"n{k}", 2)
        same = {"created", "manifest_checksum"}  # (each node's committer dates its own)
        assert {k: v for k, v in doc.items() if k not in same} == \
            {k: v for k, v in first.items() if k not in same}
        assert rec is not None and str(rec.scheme) == scheme and rec.step == 2
        assert [(n.name, n.ranks) for n in rec.nodes] == [("n0", (0, 1)), ("n1", (2, 3))]
        assert [f.name for f in rec.nodes[k].files] == \
            [f"data-{2 * k:05d}.bin", f"data-{2 * k + 1:05d}.bin"]
    # every node's share and piece match the records, read where each node keeps them
    readers = [directory_reader(tmp_path / f"n{k}" / "step_00000002") for k in range(2)]
    assert find_damage(rec, readers) == ({}, {})
    # the durable copy keeps the records (its manifest is node 0's bytes), no piece
    assert records_of(tmp_path, "durable", 2)[0] == first
    assert not list((tmp_path / "durable").glob("step_*/redundancy-*.bin"))


def save_step_3(tmp_path):
    def save(c):
        with manager(tmp_path, c, "partner") as m:
            m.save(3, shard(3, c.rank))
    assert run_ranks(4, save) == [None] * 4


def restore_all(tmp_path, caplog, **kw):
    """Restore on 4 thread ranks; each rank's step, its state checked against step 3's."""
    def restore(c):
        got = shard(0, c.rank, zero=True)
        with manager(tmp_path, c, "partner", **kw) as m:
            return m.restore(got), got
    with caplog.at_level("INFO", logger="uckpt"):
        outcomes = run_ranks(4, restore)
    for rank, outcome in enumerate(outcomes):
        assert not isinstance(outcome, BaseException), outcome
        assert outcome[0] == 3
        np.testing.assert_array_equal(outcome[1]["w"].array, shard(3, rank)["w"].array)
        np.testing.assert_array_equal(outcome[1]["own"].value, shard(3, rank)["own"].value)
    return [r.getMessage() for r in caplog.records]


def test_a_wiped_node_is_rebuilt_at_restore(tmp_path, caplog):
    save_step_3(tmp_path)
    before = (tmp_path / "n1" / "step_00000003" / "data-00002.bin").read_bytes()
    shutil.rmtree(tmp_path / "n1")
    (tmp_path / "durable").rename(tmp_path / "away")
    said = restore_all(tmp_path, caplog)
    assert (tmp_path / "n1" / "step_00000003" / "data-00002.bin").read_bytes() == before
    assert any("lost the copy of node 'n1' (node 1, ranks 2, 3)" in s for s in said)
    assert not (tmp_path / "durable").exists()


def test_a_wiped_node_is_rebuilt_when_the_job_numbers_the_nodes_anew(tmp_path, caplog):
    """The restart puts n1 first (ranks 0, 1) and n0 second, as an elastic launcher may
    (torchrun orders a rejoining agent last): the rebuild matches the records' nodes by
    name, and every rank restores its own rows and value, some from the other node."""
    save_step_3(tmp_path)
    before = (tmp_path / "n1" / "step_00000003" / "data-00002.bin").read_bytes()
    shutil.rmtree(tmp_path / "n1")
    (tmp_path / "durable").rename(tmp_path / "away")
    said = restore_all(tmp_path, caplog, node_of=lambda rank: f"n{1 - rank // 2}")
    assert (tmp_path / "n1" / "step_00000003" / "data-00002.bin").read_bytes() == before
    assert any("lost the copy of node 'n1' (node 1, ranks 2, 3)" in s for s in said), said
    assert not (tmp_path / "durable").exists()


def lose_node_1_and_its_partner_piece(tmp_path):
    """Step 3 saved, node 1's copy wiped, and the partner piece of its share (kept by
    node 0) damaged: its redundancy is lost too."""
    save_step_3(tmp_path)
    shutil.rmtree(tmp_path / "n1")
    piece = tmp_path / "n0" / "step_00000003" / "redundancy-00000.bin"  # node 1's share
    data = bytearray(piece.read_bytes())
    data[7] ^= 1
    piece.write_bytes(bytes(data))


def test_a_lost_node_whose_partner_copy_is_damaged_falls_back_to_durable(tmp_path, caplog):
    lose_node_1_and_its_partner_piece(tmp_path)
    said = restore_all(tmp_path, caplog)
    assert any("step 3 on tier 'n0' cannot be rebuilt from its redundancy (a node's copy "
               "lacks it): step 3: the share of node 'n1' (node 1, ranks 2, 3) is lost "
               "(data-00002.bin: missing)" in s and "redundancy-00000.bin: checksum" in s
               for s in said), said
    assert any("restored step 3 from tier 'durable'" in s for s in said)
    assert not (tmp_path / "n1" / "step_00000003").exists()  # nothing half rebuilt


def test_a_share_lost_with_its_redundancy_and_no_other_tier_names_node_ranks_step(tmp_path):
    """Node 1 wiped, the partner piece of its share damaged, the durable tier out of reach:
    the restore raises the error that names whose share is lost, not only that a node holds
    no copy."""
    lose_node_1_and_its_partner_piece(tmp_path)
    (tmp_path / "durable").rename(tmp_path / "away")

    def restore(c):
        with manager(tmp_path, c, "partner") as m:
            return m.restore(shard(0, c.rank, zero=True))
    for outcome in run_ranks(4, restore):
        assert isinstance(outcome, ShareLostError), outcome
        assert "step 3: the share of node 'n1' (node 1, ranks 2, 3) is lost" in str(outcome)
    assert not (tmp_path / "durable").exists()


@pytest.mark.parametrize("tiers, kw, message", [
    (lambda p: [uckpt.Tier("memory://run", redundancy="partner")], {},
     "every node shares its storage"),
    (lambda p: [p / "fast", uckpt.Tier(str(p / "{node}"), redundancy="xor:4")], {},
     "only the first tier's redundancy is kept"),
    (lambda p: [uckpt.Tier(str(p / "{node}"), redundancy="partner")], {"incremental": True},
     "incremental saves do not keep redundancy"),
])
def test_redundancy_a_manager_cannot_keep_is_refused(tmp_path, tiers, kw, message):
    with pytest.raises(RedundancyConfigError, match=message) as e:
        uckpt.CheckpointManager(tiers=tiers(tmp_path), **kw)
    assert isinstance(e.value, ValueError) and e.value.hint


def test_one_node_or_one_shared_copy_saves_without_redundancy(tmp_path, caplog):
    with caplog.at_level("INFO", logger="uckpt"):
        with uckpt.CheckpointManager(tiers=[uckpt.Tier(tmp_path / "one", redundancy="partner")],
                                     node="solo") as m:
            m.save(1, {"w": np.arange(8.0)})

        def save(c):  # two nodes, but one directory that every rank sees
            tier = uckpt.Tier(tmp_path / "shared", redundancy="partner")
            with uckpt.CheckpointManager(tiers=[tier], comm=c, node=f"n{c.rank}") as m:
                m.save(1, shard(1, c.rank, 2))
                m.save(2, shard(2, c.rank, 2))
        assert run_ranks(2, save) == [None] * 2
    said = [r.getMessage() for r in caplog.records]
    assert sum("the job runs on one node (solo)" in s for s in said) == 1
    assert sum("every node sees one copy of it" in s for s in said) == 1  # once, not per save
    for root in ("one", "shared"):
        doc = json.loads((tmp_path / root / "step_00000001" / "manifest.json").read_bytes())
        assert "redundancy" not in doc["extensions"]
