"""Multi-level storage: commit on the fast tier, verified copies on the durable tier."""
import shutil
import threading

import numpy as np
import pytest

import uckpt
from uckpt import KeepBest, KeepEvery, KeepLast, Tier, errors
from uckpt.saving.engine import SaveHandle
from conftest import flip_byte, entries


def state(step):
    return {"w": np.full((64, 64), step, np.float32), "step": step}


def restore_step(mgr):
    w = np.zeros((64, 64), np.float32)
    holder = {"w": w, "step": None}
    step = mgr.restore(holder)
    assert step is None or (holder["step"] == step and (w == step).all())
    return step


def test_commit_fast_then_copy_durable(tmp_path):
    fast, durable = tmp_path / "fast", tmp_path / "durable"
    with uckpt.CheckpointManager(tiers=[fast, durable], async_save=True) as mgr:
        for s in (1, 2, 3):
            mgr.save(s, state(s))
    for s in (1, 2, 3):
        uckpt.verify(fast / f"step_{s:08d}")
        uckpt.verify(durable / f"step_{s:08d}")
    assert mgr.tiers_of(2) == ["fast", "durable"]


def test_durable_every(tmp_path):
    with uckpt.CheckpointManager(tiers=[tmp_path / "f", tmp_path / "d"], durable_every=3) as mgr:
        for s in range(1, 10):
            mgr.save(s, state(s))
    assert uckpt.CheckpointManager(tmp_path / "d").steps() == [3, 6, 9]
    assert uckpt.CheckpointManager(tmp_path / "f").steps() == list(range(1, 10))


def test_node_lost_restores_from_durable(tmp_path):
    fast, durable = tmp_path / "shm", tmp_path / "lustre"
    with uckpt.CheckpointManager(tiers=[fast, durable], async_save=True) as mgr:
        for s in (10, 20):
            mgr.save(s, state(s))
    shutil.rmtree(fast)  # the node and its local storage are gone
    with uckpt.CheckpointManager(tiers=[fast, durable]) as mgr:
        assert restore_step(mgr) == 20
        assert mgr.tiers_of(20) == ["lustre"]


def test_prefers_fast_copy_and_falls_back_to_durable_copy(tmp_path):
    fast, durable = tmp_path / "f", tmp_path / "d"
    with uckpt.CheckpointManager(tiers=[fast, durable]) as mgr:
        mgr.save(5, state(5))
    chunk = uckpt.manifest(fast / "step_00000005").arrays["w"].chunks[0]
    flip_byte(fast / "step_00000005" / chunk.file, chunk.offset + 9)
    with uckpt.CheckpointManager(tiers=[fast, durable]) as mgr:
        with pytest.warns(RuntimeWarning, match="step 5 on tier 'f'.*checksum"):
            assert restore_step(mgr) == 5  # same step, from the durable copy


def test_per_tier_retention(tmp_path):
    tiers = [Tier(tmp_path / "fast", keep=KeepLast(2)),
             Tier(tmp_path / "durable", keep=KeepLast(3) | KeepEvery(10))]
    with uckpt.CheckpointManager(tiers=tiers, async_save=True) as mgr:
        for s in range(1, 26):
            mgr.save(s, state(s))
    assert uckpt.CheckpointManager(tmp_path / "fast").steps() == [24, 25]
    assert uckpt.CheckpointManager(tmp_path / "durable").steps() == [10, 20, 23, 24, 25]


def test_keep_best_by_metric_never_drops_newest(tmp_path):
    with uckpt.CheckpointManager(tmp_path, keep=KeepBest(2, "loss")) as mgr:
        for s, loss in [(1, 0.9), (2, 0.2), (3, 0.5), (4, 0.1), (5, 0.7)]:
            mgr.save(s, state(s), metrics={"loss": loss})
        assert mgr.steps() == [2, 4, 5]  # best two, plus the newest
        with pytest.raises(ValueError, match="metrics must map names to numbers"):
            mgr.save(6, state(6), metrics={"loss": "low"})


def test_retention_never_deletes_a_checkpoint_being_copied(tmp_path):
    fast, durable = Tier(tmp_path / "fast", keep=1), Tier(tmp_path / "durable")
    mgr = uckpt.CheckpointManager(tiers=[fast, durable], async_save=True)
    gate = threading.Event()
    mgr._flusher.run(SaveHandle("test gate"), lambda: gate.wait(30))  # copies queue behind it
    for s in (1, 2, 3):
        mgr.save(s, state(s))
    mgr._saver.join()
    assert uckpt.CheckpointManager(fast.path).steps() == [1, 2, 3]  # all pinned: not yet durable
    assert uckpt.CheckpointManager(durable.path).steps() == []
    gate.set()
    mgr.close()
    assert uckpt.CheckpointManager(fast.path).steps() == [3]
    assert uckpt.CheckpointManager(durable.path).steps() == [1, 2, 3]


def test_damaged_source_is_not_copied(tmp_path):
    fast, durable = tmp_path / "f", tmp_path / "d"
    mgr = uckpt.CheckpointManager(tiers=[fast, durable])
    gate = threading.Event()
    mgr._flusher.run(SaveHandle("test gate"), lambda: gate.wait(30))
    mgr.save(1, state(1))
    chunk = uckpt.manifest(fast / "step_00000001").arrays["w"].chunks[0]
    flip_byte(fast / "step_00000001" / chunk.file, chunk.offset)
    gate.set()
    with pytest.raises(errors.ChecksumMismatchError):
        mgr.wait()  # the copy is verified before it counts as durable
    assert uckpt.CheckpointManager(durable).steps() == []
    assert entries(durable) == []


def test_arguments(tmp_path):
    with pytest.raises(ValueError, match="root or tiers"):
        uckpt.CheckpointManager(tmp_path, tiers=[tmp_path])
    with pytest.raises(ValueError, match="root or tiers"):
        uckpt.CheckpointManager()
    with pytest.raises(ValueError, match="durable_every"):
        uckpt.CheckpointManager(tiers=[tmp_path / "a", tmp_path / "b"], durable_every=0)
    with pytest.raises(TypeError, match="a tier is a path"):
        uckpt.CheckpointManager(tiers=[3])
