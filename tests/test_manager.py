"""CheckpointManager: numbering, retention, fallback to the newest intact checkpoint."""
import numpy as np
import pytest

import uckpt
from uckpt import errors
from conftest import flip_byte, entries


def state_for(step):
    return {"w": np.full((16, 16), step, np.float32), "step": step}


def test_save_steps_latest_restore(tmp_path):
    with uckpt.CheckpointManager(tmp_path / "ck") as mgr:
        assert mgr.steps() == [] and mgr.latest_step() is None
        assert mgr.restore({"w": np.zeros((16, 16), np.float32), "step": None}) is None
        for s in (10, 20, 30):
            mgr.save(s, state_for(s), metadata={"loss": 1.0 / s})
        assert mgr.steps() == [10, 20, 30] and mgr.latest_step() == 30
        w = np.zeros((16, 16), np.float32)
        assert mgr.restore({"w": w, "step": None}) == 30 and (w == 30).all()
        assert mgr.restore({"w": w, "step": None}, step=20) == 20 and (w == 20).all()
        assert uckpt.manifest(mgr.path(10)).metadata == {"loss": 0.1}
    with pytest.raises(RuntimeError, match="closed"):
        mgr.save(40, state_for(40))


def test_keep_last(tmp_path):
    mgr = uckpt.CheckpointManager(tmp_path, keep_last=2)
    for s in range(5):
        mgr.save(s, state_for(s))
        assert mgr.steps() == list(range(max(0, s - 1), s + 1))
    assert entries(tmp_path) == ["step_00000003", "step_00000004"]


def test_same_step_twice_refused_unless_overwrite(tmp_path):
    mgr = uckpt.CheckpointManager(tmp_path)
    mgr.save(1, state_for(1))
    with pytest.raises(errors.CheckpointExistsError):
        mgr.save(1, state_for(2))
    assert uckpt.load(mgr.path(1))["step"] == 1
    mgr.save(1, state_for(2), overwrite=True)
    assert uckpt.load(mgr.path(1))["step"] == 2


def test_restore_skips_corrupt_newest_with_warning(tmp_path):
    mgr = uckpt.CheckpointManager(tmp_path)
    for s in (1, 2, 3):
        mgr.save(s, state_for(s))
    chunk = uckpt.manifest(mgr.path(3)).arrays["w"].chunks[0]
    flip_byte(mgr.path(3) / chunk.file, chunk.offset + 100)
    (mgr.path(2) / "manifest.json").write_text("{}")  # damaged manifest
    w = np.zeros((16, 16), np.float32)
    with pytest.warns(RuntimeWarning) as rec:
        assert mgr.restore({"w": w, "step": None}) == 1
    text = " ".join(str(r.message) for r in rec)
    assert "step 3" in text and "checksum mismatch" in text and "step 2" in text
    assert (w == 1).all()


def test_restore_raises_when_nothing_is_intact(tmp_path):
    mgr = uckpt.CheckpointManager(tmp_path)
    mgr.save(1, state_for(1))
    (mgr.path(1) / "data-00000.bin").write_bytes(b"")
    with pytest.warns(RuntimeWarning), pytest.raises(errors.CorruptCheckpointError,
                                                     match="no checkpoint.*reads back intact"):
        mgr.restore({"w": np.zeros((16, 16), np.float32), "step": None})


def test_state_mismatch_is_not_hidden_by_fallback(tmp_path):
    mgr = uckpt.CheckpointManager(tmp_path)
    mgr.save(1, state_for(1))
    mgr.save(2, state_for(2))
    with pytest.raises(errors.ShapeMismatchError):
        mgr.restore({"w": np.zeros((3, 3), np.float32), "step": None})


def test_interrupted_saves_are_invisible_and_cleaned(tmp_path):
    mgr = uckpt.CheckpointManager(tmp_path)
    mgr.save(1, state_for(1))
    debris = tmp_path / ".step_00000002.uckpt-tmp-deadbeef"
    debris.mkdir()
    (debris / "data-00000.bin").write_bytes(b"partial")
    (tmp_path / "step_00000003").mkdir()  # no manifest: never committed
    assert mgr.steps() == [1]
    mgr.close()
    reader = uckpt.CheckpointManager(tmp_path)  # a reader never removes anything
    assert debris.exists() and reader.steps() == [1]
    uckpt.CheckpointManager(tmp_path, role="writer")  # the next writer (e.g. after a crash) does
    assert not debris.exists()


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="keep_last"):
        uckpt.CheckpointManager(tmp_path, keep_last=0)
    mgr = uckpt.CheckpointManager(tmp_path)
    with pytest.raises(ValueError, match="step"):
        mgr.save(-3, state_for(0))
    with pytest.raises(errors.CheckpointNotFoundError):
        mgr.restore({"w": None, "step": None}, step=77)


def test_half_finished_overwrite_is_rolled_back(tmp_path):
    """Killed between moving the old checkpoint aside and moving the new one in."""
    mgr = uckpt.CheckpointManager(tmp_path)
    mgr.save(5, state_for(5))
    aside = tmp_path / ".step_00000005.uckpt-old-0badf00d"
    mgr.path(5).rename(aside)
    new = tmp_path / ".step_00000005.uckpt-tmp-0badf00d"
    new.mkdir()
    mgr.close()
    assert uckpt.CheckpointManager(tmp_path, role="writer").steps() == [5]
    assert uckpt.load(mgr.path(5))["step"] == 5
    assert entries(tmp_path) == ["step_00000005"]


def test_half_finished_deletion_is_finished(tmp_path):
    mgr = uckpt.CheckpointManager(tmp_path)
    mgr.save(1, state_for(1))
    mgr.path(1).rename(tmp_path / ".step_00000001.uckpt-del-0badf00d")
    mgr.close()
    assert uckpt.CheckpointManager(tmp_path, role="writer").steps() == []
    assert entries(tmp_path) == []
