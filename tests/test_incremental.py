"""Incremental checkpoints (docs/format.md section 11.4): only changed chunks are written,
references are followed when loading, retention never breaks a newer checkpoint, tiers
hold what their checkpoints refer to, damage in a base is named and restore falls back."""
import json
import logging
import os
import re
import shutil
import subprocess
import sys

import pytest

import uckpt
from uckpt import errors
from uckpt.format import integrity
from conftest import PYTHON, flip_byte
from grid_listing import listed
from incremental_common import CHUNK_BYTES, check, empty_state, manager, save, state, table


def data_size(path) -> int:
    return sum(f.stat().st_size for f in path.glob("data-*.bin"))


def restored(mgr, step=None):
    out = empty_state()
    got = mgr.restore(out, step)
    return got, out


def save_chain(root, steps, **kw):
    with manager(root, incremental=True, **kw) as mgr:
        for s in steps:
            mgr.save(s, state(s))
    return mgr


def test_save_with_base_writes_only_changed_chunks(tmp_path):
    one = save(tmp_path / "one", state(1), incremental=True)
    two = save(tmp_path / "two", state(2), base=one)
    m = uckpt.manifest(two)
    own = [c for c in m.arrays["table"].chunks if c.base is None]
    assert len(own) == 1 and own[0].start == ((2 * 37) // 8 * 8, 0)  # the chunk of row 74
    assert all(c.base == "one" for c in m.arrays["table"].chunks if c not in own)
    assert m.bases == {"one": {"data-00000.bin": data_size(one)}}
    # the changed table chunk (8 KiB), then the bias (changed), aligned
    assert data_size(two) == CHUNK_BYTES + 64 - CHUNK_BYTES % 64 + 56 if CHUNK_BYTES % 64 else \
        CHUNK_BYTES + 56
    check(uckpt.load(two), 2)
    assert uckpt.verify(two).merkle_root == m.merkle_root


def test_same_state_has_the_same_merkle_root_plain_incremental_or_consolidated(tmp_path):
    one = save(tmp_path / "one", state(1), incremental=True)
    two = save(tmp_path / "two", state(2), base=one)
    fresh = save(tmp_path / "fresh", state(2), incremental=True)
    assert uckpt.manifest(two).merkle_root == uckpt.manifest(fresh).merkle_root
    assert uckpt.manifest(one).merkle_root != uckpt.manifest(two).merkle_root


def test_manager_rebases_every_full_every_saves(tmp_path):
    save_chain(tmp_path, range(1, 8), full_every=3)
    bases = {s: sorted(uckpt.manifest(tmp_path / f"step_{s:08d}").bases) for s in range(1, 8)}
    assert [s for s, b in bases.items() if not b] == [1, 4, 7]  # full saves
    assert bases[3] == ["step_00000001", "step_00000002"]  # references are one hop
    for s in range(1, 8):
        check(uckpt.load(tmp_path / f"step_{s:08d}"), s)
    assert data_size(tmp_path / "step_00000003") < data_size(tmp_path / "step_00000001") / 20


def test_everything_changed_writes_everything_and_refers_to_nothing(tmp_path):
    with manager(tmp_path, incremental=True) as mgr:
        mgr.save(1, state(1))
        mgr.save(2, state(2, table(2) + 1))
    m = uckpt.manifest(tmp_path / "step_00000002")
    assert m.bases == {} and data_size(tmp_path / "step_00000002") == data_size(tmp_path / "step_00000001")


def test_retention_deleting_every_older_checkpoint_keeps_the_newest_whole(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="uckpt.manager.checkpoint_manager")
    with manager(tmp_path, incremental=True, full_every=4, keep_last=1) as mgr:
        for s in range(1, 11):
            mgr.save(s, state(s))
            steps = mgr.steps()
            chain_start = s - (s - 1) % 4  # the newest full save
            assert steps == list(range(chain_start, s + 1)), (s, steps)
            got, out = restored(manager(tmp_path, role="reader"))
            assert got == s
            check(out, s)
    deleted = [int(m) for m in re.findall(r"deleted step (\d+)", caplog.text)]
    assert deleted == [4, 3, 2, 1, 8, 7, 6, 5]  # newest first, once bases are free


def test_retention_keeps_bases_of_what_the_policy_keeps(tmp_path):
    with manager(tmp_path, incremental=True, full_every=100,
                                 keep=uckpt.KeepEvery(5)) as mgr:
        for s in range(1, 8):
            mgr.save(s, state(s))
    for s in manager(tmp_path).steps():  # whatever is left loads
        check(uckpt.load(tmp_path / f"step_{s:08d}"), s)
    assert 1 in manager(tmp_path).steps()  # the base of every later step


@pytest.mark.parametrize("damage", ["flip", "delete", "truncate"])
def test_damaged_base_is_named_and_restore_falls_back(tmp_path, damage):
    save_chain(tmp_path, range(1, 5), full_every=2)  # 1 full, 2 -> 1, 3 full, 4 -> 3
    base_file = tmp_path / "step_00000003" / "data-00000.bin"
    m4 = uckpt.manifest(tmp_path / "step_00000004")
    referred = [c for c in m4.arrays["table"].chunks if c.base == "step_00000003"][5]
    if damage == "flip":
        flip_byte(base_file, referred.offset + 3)
        expected = errors.ChecksumMismatchError
    elif damage == "delete":
        base_file.unlink()
        expected = errors.CheckpointNotFoundError
    else:
        os.truncate(base_file, referred.offset)
        expected = errors.TruncatedDataError
    with pytest.raises(expected) as info:
        uckpt.load(tmp_path / "step_00000004")
    assert str(base_file) in str(info.value)
    if damage == "flip":
        assert "'table'" in str(info.value) and str(referred.offset) in str(info.value)
    with pytest.warns(RuntimeWarning) as warned:
        got, out = restored(manager(tmp_path))
    skipped = [re.search(r"skipping checkpoint step (\d+)", str(w.message)).group(1) for w in warned]
    assert skipped == ["4", "3"] and all(str(base_file) in str(w.message) for w in warned)
    assert got == 2
    check(out, 2)
    with pytest.raises(errors.UckptError):
        uckpt.verify(tmp_path / "step_00000004")


def test_base_checkpoint_deleted_by_hand_is_named(tmp_path):
    save_chain(tmp_path, [1, 2])
    shutil.rmtree(tmp_path / "step_00000001")
    with pytest.raises(errors.CheckpointNotFoundError, match="step_00000001"):
        uckpt.load(tmp_path / "step_00000002")


def test_async_incremental_saves(tmp_path):
    with manager(tmp_path, incremental=True, async_save=True, max_inflight=2,
                                 full_every=4) as mgr:
        handles = [mgr.save(s, state(s)) for s in range(1, 7)]
    assert all(h.done() for h in handles)
    for s in range(1, 7):
        check(uckpt.load(tmp_path / f"step_{s:08d}"), s)
    assert [s for s in range(1, 7) if not uckpt.manifest(tmp_path / f"step_{s:08d}").bases] == [1, 5]


def test_durable_tier_holds_what_its_checkpoints_refer_to(tmp_path):
    fast, durable = tmp_path / "fast", tmp_path / "durable"
    with manager(tiers=[fast, uckpt.Tier(durable, keep=1)], incremental=True,
                                 full_every=10, durable_every=3, async_save=True) as mgr:
        for s in range(1, 8):
            mgr.save(s, state(s))
    # steps 3 and 6 were copied (durable_every), each after the checkpoints it refers to
    shutil.rmtree(fast)  # the node is lost
    got, out = restored(manager(tiers=[fast, durable]))
    assert got == 6
    check(out, 6)
    for s in manager(durable).steps():
        uckpt.verify(durable / f"step_{s:08d}")
    # step 6 refers to chunks last changed at steps 1 to 5: kept whatever keep=1 says
    assert manager(durable).steps() == [1, 2, 3, 4, 5, 6]


def test_consolidate_makes_a_self_contained_checkpoint(tmp_path):
    save_chain(tmp_path / "root", [1, 2, 3])
    dst = uckpt.consolidate(tmp_path / "root" / "step_00000003", tmp_path / "alone")
    packed = uckpt.consolidate(tmp_path / "root" / "step_00000003", tmp_path / "packed",
                               compression="zstd")  # one function: issue 12's option too
    shutil.rmtree(tmp_path / "root")
    assert uckpt.manifest(dst).bases == {} and uckpt.manifest(packed).bases == {}
    assert {c.codec for c in uckpt.manifest(packed).arrays["table"].chunks} == \
        {("bytegroup", "zstd")}
    check(uckpt.load(dst), 3)
    check(uckpt.load(packed), 3)
    assert uckpt.verify(packed).merkle_root == uckpt.manifest(dst).merkle_root


def test_base_must_be_beside_the_new_checkpoint(tmp_path):
    one = save(tmp_path / "a" / "one", state(1), incremental=True)
    with pytest.raises(errors.UnsafePathError, match="not beside"):
        save(tmp_path / "b" / "two", state(2), base=one)
    assert not (tmp_path / "b" / "two").exists()


def test_base_reached_through_a_symlink_is_refused(tmp_path):
    save_chain(tmp_path, [1, 2])
    moved = tmp_path.parent / (tmp_path.name + "-elsewhere")
    shutil.move(tmp_path / "step_00000001", moved)
    os.symlink(moved, tmp_path / "step_00000001")
    with pytest.raises(errors.NotACheckpointError, match="symbolic link"):
        uckpt.load(tmp_path / "step_00000002")
    shutil.rmtree(moved)


def test_overwriting_a_base_is_refused(tmp_path):
    with manager(tmp_path, incremental=True) as mgr:
        mgr.save(1, state(1))
        mgr.save(2, state(2))
        with pytest.raises(errors.CheckpointExistsError, match="step 2 refers to"):
            mgr.save(1, state(5), overwrite=True)
        mgr.save(2, state(7), overwrite=True)  # nothing refers to step 2: allowed, in full
    assert uckpt.manifest(tmp_path / "step_00000002").bases == {}
    check(uckpt.load(tmp_path / "step_00000002"), 7)


def test_incremental_needs_an_exclusive_writer(tmp_path):
    with pytest.raises(ValueError, match="exclusive writer"):
        manager(tmp_path, incremental=True, concurrent_writers=True)
    with pytest.raises(ValueError, match="full_every"):
        manager(tmp_path, incremental=True, full_every=0)


def _resealed(path, change):
    doc = listed(json.loads((path / "manifest.json").read_bytes()))  # grids as chunk lists
    doc.pop(integrity.FIELD)
    change(doc)
    text = json.dumps(doc, separators=(",", ":"))
    (path / "manifest.json").write_bytes(integrity.seal(text[:-1].encode()))


@pytest.mark.parametrize("change, error, words", [
    (lambda d: d["arrays"]["table"]["chunks"][0].update(base="nope"), errors.ManifestError,
     "not listed in 'bases'"),
    (lambda d: d["bases"].update({"../up": {"data-00000.bin": 1}}), errors.UnsafePathError,
     "not a plain name"),
    (lambda d: d["bases"].update({"step_00000009": {"data-00000.bin": 1}}), errors.ManifestError,
     "no chunk refers"),
    (lambda d: d["bases"]["step_00000001"].update({"data-00000.bin": 10}), errors.ManifestError,
     "lie outside"),
    (lambda d: d["arrays"]["table"]["chunks"][0].update(hash="xxh3-128:12"), errors.ManifestError,
     "32 lowercase hex"),
    (lambda d: d.pop("merkle_root"), errors.ManifestError, "missing field"),
    (lambda d: d["arrays"]["bias"].pop("root"), errors.ManifestError, "missing field"),
])
def test_parser_refuses_bad_references(tmp_path, change, error, words):
    save_chain(tmp_path, [1, 2])
    _resealed(tmp_path / "step_00000002", change)
    with pytest.raises(error, match=words):
        uckpt.load(tmp_path / "step_00000002")


def test_verify_checks_the_merkle_tree(tmp_path):
    save_chain(tmp_path, [1, 2])
    path = tmp_path / "step_00000002"
    _resealed(path, lambda d: d["arrays"]["bias"].update(root="xxh3-128:" + "ab" * 16))
    check(uckpt.load(path), 2)  # loading reads the data, checked by CRC-32C
    with pytest.raises(errors.CorruptCheckpointError, match="Merkle root of leaf 'bias'"):
        uckpt.verify(path)
    r = subprocess.run([PYTHON, "-m", "uckpt.cli", "verify", str(path)], capture_output=True,
                       text=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert r.returncode == 1 and "Merkle root of leaf 'bias'" in r.stderr


def test_verify_detects_a_hash_that_does_not_match_the_bytes(tmp_path):
    save_chain(tmp_path, [1, 2])
    path = tmp_path / "step_00000002"
    _resealed(path, lambda d: d["arrays"]["table"]["chunks"][3].update(hash="xxh3-128:" + "0" * 32))
    with pytest.raises(errors.ChecksumMismatchError, match="content hash mismatch in leaf 'table'"):
        uckpt.verify(path)


def test_incremental_saves_compress_the_changed_chunks(tmp_path):
    one = save(tmp_path / "one", state(1), incremental=True, compression="zstd")
    two = save(tmp_path / "two", state(2), base=one, compression="zstd")
    m = uckpt.manifest(two)
    own = [c for a in m.arrays.values() for c in a.chunks if c.base is None]
    assert own and all(c.codec != () for c in own if c.length > 64)
    assert sum(1 for c in m.arrays["table"].chunks if c.base is None) == 1
    check(uckpt.load(two), 2)
    uckpt.verify(two)  # compressed chunks decoded: their hashes are of the raw bytes
    # the same state saved raw has the same Merkle root: hashes do not depend on codecs
    raw = save(tmp_path / "raw", state(2), incremental=True)
    assert uckpt.manifest(raw).merkle_root == m.merkle_root


def test_s3_durable_tier_holds_the_bases_and_restores_after_node_loss(tmp_path, s3_server,
                                                                      s3_bucket, s3_options):
    fast, durable = tmp_path / "fast", f"s3://{s3_bucket}/inc"
    with manager(tiers=[fast, uckpt.Tier(durable, keep=1)], incremental=True,
                                 durable_every=2, async_save=True,
                                 storage_options=s3_options) as mgr:
        for s in range(1, 6):
            mgr.save(s, state(s))
    on_s3 = manager(durable, storage_options=s3_options).steps()
    assert on_s3 == [1, 2, 3, 4]  # step 4 and the steps it refers to (copied first)
    m4 = uckpt.manifest(f"{durable}/step_00000004", storage_options=s3_options)
    assert set(m4.bases) == {"step_00000001", "step_00000002", "step_00000003"}
    uckpt.verify(f"{durable}/step_00000004", storage_options=s3_options)
    shutil.rmtree(fast)  # the node is lost
    got, out = restored(manager(tiers=[fast, durable],
                                                storage_options=s3_options))
    assert got == 4
    check(out, 4)


def test_inspect_shows_the_merkle_root_and_the_bases(tmp_path):
    save_chain(tmp_path, [1, 2])
    path = tmp_path / "step_00000002"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    text = subprocess.run([PYTHON, "-m", "uckpt.cli", "inspect", str(path)], capture_output=True,
                          text=True, env=env, check=True).stdout
    m = uckpt.manifest(path)
    referring = sum(1 for a in m.arrays.values() for c in a.chunks if c.base)
    assert f"merkle root  {m.merkle_root}" in text
    assert f"bases        1: step_00000001; {referring} of " in text
    doc = json.loads(subprocess.run([PYTHON, "-m", "uckpt.cli", "inspect", "--json", str(path)],
                                    capture_output=True, text=True, env=env, check=True).stdout)
    assert doc["bases"] == {"step_00000001": {"data-00000.bin": data_size(tmp_path / "step_00000001")}}


def test_a_base_naming_the_checkpoint_itself_or_not_a_directory_is_refused(tmp_path):
    save_chain(tmp_path, [1, 2])
    path = tmp_path / "step_00000002"
    original = (path / "manifest.json").read_bytes()

    def rename_base(d, name):
        d["bases"] = {name: d["bases"]["step_00000001"]}
        for a in d["arrays"].values():
            for c in a["chunks"]:
                if c.get("base"):
                    c["base"] = name

    _resealed(path, lambda d: rename_base(d, "step_00000002"))
    with pytest.raises(errors.CorruptCheckpointError, match="names the checkpoint itself"):
        uckpt.load(path)
    (path / "manifest.json").write_bytes(original)
    os.mkfifo(tmp_path / "fifo")
    _resealed(path, lambda d: rename_base(d, "fifo"))
    with pytest.raises(errors.NotACheckpointError, match="fifo"):
        uckpt.load(path)  # never blocks on the FIFO
