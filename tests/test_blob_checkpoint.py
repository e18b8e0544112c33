"""The checkpoint layer written once on the blob interface (uckpt.storage.checkpoint), run
through the public API on two blob stores that choose different rules: memory:// (atomic
rename, advisory locks) and fsspec+memory:// (manifest written last, a lease lock object).
Every test is in-process and fast."""
import logging
import uuid

import numpy as np
import pytest

import incremental_common
import uckpt
from uckpt import errors, knobs
from uckpt.storage import open_store
from uckpt.storage.checkpoint import BlobCheckpointStore

pytest.importorskip("fsspec")


@pytest.fixture(params=["memory", "fsspec+memory"])
def root(request, monkeypatch):
    # a lease lock renews every second; it is lost (the holder stops writing) when its thread
    # gets no turn for 2.5 s: shorter leases were lost on a loaded machine
    monkeypatch.setattr(knobs, "lock_lease_s", 3.0)
    return f"{request.param}://t{uuid.uuid4().hex[:12]}/ck"


def blob_of(root):
    store = open_store(root)
    assert isinstance(store, BlobCheckpointStore)
    return store.blob, store.prefix


def state(step):
    return {"w": np.full((16, 16), step, np.float32), "step": step}


def empty():
    return {"w": np.zeros((16, 16), np.float32), "step": None}


def flip(root, key, offset):
    blob, prefix = blob_of(root)
    data = bytearray(blob.read(prefix + key, 1 << 20))
    data[offset] ^= 0xFF
    blob.write(prefix + key, bytes(data))


def test_save_load_and_overwrite(root):
    target = root + "/one"
    uckpt.save(target, state(1))
    with pytest.raises(errors.CheckpointExistsError, match="already holds a committed"):
        uckpt.save(target, state(2))
    assert uckpt.load(target)["step"] == 1
    uckpt.save(target, state(2), overwrite=True)
    out = uckpt.load(target)
    assert out["step"] == 2 and (out["w"] == 2).all()
    uckpt.verify(target)
    blob, prefix = blob_of(root)
    assert sorted(k for k, _ in blob.list(prefix)) == [prefix + "one/data-00000.bin",
                                                        prefix + "one/manifest.json"]


def test_manager_retention_restore_and_fallback(root):
    with uckpt.CheckpointManager(root, keep_last=2) as mgr:
        for s in (1, 2, 3):
            mgr.save(s, state(s))
        assert mgr.steps() == [2, 3]
    chunk = uckpt.manifest(mgr.path(3)).arrays["w"].chunks[0]
    flip(root, f"step_00000003/{chunk.file}", chunk.offset + 7)
    with uckpt.CheckpointManager(root) as mgr:
        out = empty()
        with pytest.warns(RuntimeWarning, match="step 3.*checksum mismatch"):
            assert mgr.restore(out) == 2
        assert (out["w"] == 2).all()


def test_damaged_and_missing_files_raise_as_on_local(root):
    uckpt.save(root + "/a", state(1))
    blob, prefix = blob_of(root)
    data = blob.read(prefix + "a/data-00000.bin", 1 << 20)
    blob.write(prefix + "a/data-00000.bin", data[:-10])
    with pytest.raises(errors.TruncatedDataError, match="is truncated"):
        uckpt.load(root + "/a")
    blob.delete(prefix + "a/data-00000.bin")
    with pytest.raises(errors.CheckpointNotFoundError, match="listed in the manifest is missing"):
        uckpt.load(root + "/a")
    blob.delete(prefix + "a/manifest.json")
    with pytest.raises(errors.NotACheckpointError, match="not a committed uckpt checkpoint"):
        uckpt.load(root + "/a")


def test_second_writer_is_refused_naming_the_holder(root):
    first = uckpt.CheckpointManager(root, role="writer")
    first.save(1, state(1))
    with pytest.raises(errors.RootLockedError) as e:
        uckpt.CheckpointManager(root, role="writer")
    assert "is held by process" in str(e.value) and "only one job may write" in e.value.hint
    reader = uckpt.CheckpointManager(root, role="reader")
    assert reader.steps() == [1]
    first.close()
    with uckpt.CheckpointManager(root, role="writer") as again:  # released: taken at once
        again.save(2, state(2))
        assert again.steps() == [1, 2]


def test_aborted_save_is_invisible_and_a_dead_save_is_debris(root, monkeypatch):
    store = open_store(root)
    with uckpt.CheckpointManager(root) as mgr:
        mgr.save(1, state(1))
    aborted = store.sink("step_00000002")
    aborted.write_pieces("data-00000.bin", 4, [(0, np.arange(4, dtype=np.uint8))])
    aborted.abort()
    dead = store.sink("step_00000003")  # a save whose process died: never committed
    dead.write_pieces("data-00000.bin", 4, [(0, np.arange(4, dtype=np.uint8))])
    dead.release()  # its lease goes with its process
    assert store.steps() == [1]
    blob, prefix = blob_of(root)
    left = {k[len(prefix):].split("/")[0] for k, _ in blob.list(prefix)}
    assert "step_00000002" not in left and ".step_00000002" not in " ".join(left)
    assert any("step_00000003" in k for k in left)  # dead, until the next writer comes
    uckpt.CheckpointManager(root, role="reader").close()  # a reader removes nothing
    assert any("step_00000003" in k for k, _ in blob.list(prefix))
    monkeypatch.setattr(knobs, "debris_expiry_s", 0.0)  # no locks: age decides
    uckpt.CheckpointManager(root, role="writer").close()
    assert not any("step_00000003" in k for k, _ in blob.list(prefix))
    assert store.steps() == [1]


def test_live_save_of_this_process_is_never_debris(root, monkeypatch):
    monkeypatch.setattr(knobs, "debris_expiry_s", 0.0)
    store = open_store(root)
    live = store.sink("step_00000005")
    live.write_pieces("data-00000.bin", 4, [(0, np.arange(4, dtype=np.uint8))])
    assert store.remove_debris() == []
    live.abort()


def test_commit_refused_when_another_save_committed_meanwhile(root):
    store = open_store(root)
    one, two = store.sink("s"), store.sink("s")
    for sink in (one, two):
        sink.write_pieces("data-00000.bin", 2, [(0, np.ones(2, np.uint8))])
    one.commit(b"{}")
    with pytest.raises(errors.CheckpointExistsError, match="committed by another save"):
        two.commit(b"{}")
    two.abort()
    assert store.has("s") and store.source("s").manifest_bytes() == b"{}"


def test_rollback_archives_the_old_line(root, caplog):
    keep = uckpt.KeepLast(3)
    with uckpt.CheckpointManager(root, keep=keep) as m:
        for s in range(1, 6):
            m.save(s, state(s))
    with uckpt.CheckpointManager(root, keep=keep) as m:
        assert m.restore(empty(), step=3) == 3
        with caplog.at_level(logging.WARNING, logger="uckpt.manager.rollback"):
            assert m.rollback(to=3) == [4, 5]
        m.save(4, {"w": np.full((16, 16), -4, np.float32), "step": 4})
        assert m.steps() == [3, 4]
        assert m.archived() == {"rollback_0001": [4, 5]}
        assert uckpt.load(m.path(4))["w"][0, 0] == -4
        assert uckpt.load(m.path(5, archive="rollback_0001"))["step"] == 5
        uckpt.verify(m.path(4, archive="rollback_0001"))


def test_incremental_saves_with_bases(root):
    with incremental_common.manager(root, keep_last=2, incremental=True, full_every=100) as m:
        for s in range(1, 5):
            m.save(s, incremental_common.state(s))
        assert m.manifest(4).bases  # refers to the full save of step 1, kept as a base
        for s in m.steps():
            incremental_common.check(uckpt.load(m.path(s)), s)
    store = open_store(root)
    with pytest.raises(errors.CorruptCheckpointError, match="base checkpoint.*not committed"):
        store.blob.delete(store.key("step_00000001", "manifest.json"))
        uckpt.load(m.path(4))


def test_memory_tier_in_front_of_a_local_one(root, tmp_path):
    durable = tmp_path / "durable"
    tiers = [uckpt.Tier(root, keep=2), uckpt.Tier(durable)]
    # options meant for an s3:// tier reach neither a memory:// nor a local one
    options = {"endpoint_url": "http://s3.invalid"} if root.startswith("memory:") else None
    with uckpt.CheckpointManager(tiers=tiers, async_save=True, storage_options=options) as mgr:
        for s in (1, 2, 3):
            mgr.save(s, state(s))
    assert uckpt.CheckpointManager(durable).steps() == [1, 2, 3]
    assert uckpt.CheckpointManager(root).steps() == [2, 3]
    uckpt.verify(durable / "step_00000003")
    with uckpt.CheckpointManager(tiers=[root, durable]) as mgr:
        assert mgr.tiers_of(3)[0] == root.rsplit("/", 1)[-1]
        out = empty()
        assert mgr.restore(out) == 3 and (out["w"] == 3).all()


def test_urls_that_name_no_checkpoint_are_refused():
    with pytest.raises(errors.StorageConfigError, match="names a store, not a checkpoint"):
        uckpt.save("memory://only", state(1))
    with pytest.raises(errors.StorageConfigError, match="storage_options"):
        uckpt.save("memory://x/ck", state(1), storage_options={"key": "k"})


def test_listing_entries(root):
    with uckpt.CheckpointManager(root) as mgr:
        mgr.save(1, state(1))
    store = open_store(root)
    dead = store.sink("step_00000002")
    dead.write_pieces("data-00000.bin", 3, [(0, np.ones(3, np.uint8))])
    found = {e.step: e for e in store.entries()}
    assert found[1].kind == "checkpoint" and found[1].files["data-00000.bin"] > 0
    assert "manifest.json" in found[1].files and store.still_there(found[1])
    assert found[2].kind == "temporary" and "interrupted" in found[2].reason
    assert store.itself() is None and store.exists()
    one = open_store(root + "/step_00000001").itself()
    assert one.kind == "checkpoint" and one.where == root + "/step_00000001"
    dead.abort()
    assert store.delete("step_00000001") and not store.still_there(found[1])


def test_a_store_that_cannot_lock_warns_and_still_saves(tmp_path, caplog):
    """fsspec's local file system has no atomic create-if-absent across processes: the
    manager's writer lock there cannot be exclusive, and says so."""
    root = f"fsspec+file://{tmp_path}/run"
    with caplog.at_level(logging.WARNING, logger="uckpt.storage.checkpoint.lock"):
        m = uckpt.CheckpointManager(root, keep=2, async_save=False)
        m.save(1, state(1))
        m.close()
    assert any("checked but not exclusive" in r.getMessage() for r in caplog.records)
    assert uckpt.load(root + "/step_00000001")["step"] == 1
    # an absolute path stays absolute (it was once taken relative to the working directory)
    assert (tmp_path / "run" / "step_00000001" / "manifest.json").is_file()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="uckpt.storage.checkpoint.lock"):
        m = uckpt.CheckpointManager("memory://lockwarn/run", keep=2, async_save=False)
        m.save(1, state(1))
        m.close()
    assert not [r for r in caplog.records if "not exclusive" in r.getMessage()]
