"""Compressed tiers: a raw fast tier and a durable tier compressed while copying (local
directories and a real S3 server, tests/s3_server.py), the manager's default, and
``uckpt.manager.tiers.copy_checkpoint`` with compression."""
import shutil

import numpy as np
import pytest

import uckpt
from uckpt.codecs.pipeline import label as codec_label
from uckpt.format import FORMAT_VERSION
from uckpt import Tier, errors
from uckpt.manager.tiers import copy_checkpoint
from conftest import flip_byte

pytestmark = pytest.mark.timeout(300)


def state(step):
    rng = np.random.default_rng(step)
    return {"w": rng.standard_normal((128, 64)).astype(np.float32),
            "noise": rng.integers(0, 256, 3000, dtype=np.uint8), "step": step}


def codecs(path, storage_options=None):
    m = uckpt.manifest(path, storage_options=storage_options)
    return {p: sorted({codec_label(c.codec) for c in a.chunks}) for p, a in m.arrays.items()}


def restored(mgr):
    holder = {"w": np.zeros((128, 64), np.float32), "noise": np.zeros(3000, np.uint8),
              "step": None}
    step = mgr.restore(holder)
    want = state(step)
    assert np.array_equal(holder["w"], want["w"]) and np.array_equal(holder["noise"], want["noise"])
    return step


def test_compressed_durable_tier_restored_after_node_loss(tmp_path):
    fast, durable = tmp_path / "shm", tmp_path / "lustre"
    tiers = [fast, Tier(durable, compression="zstd")]
    with uckpt.CheckpointManager(tiers=tiers, async_save=True) as mgr:
        for s in (10, 20):
            mgr.save(s, state(s))
    assert codecs(fast / "step_00000020") == {"w": ["raw"], "noise": ["raw"]}
    assert codecs(durable / "step_00000020") == {"w": ["bytegroup+zstd"], "noise": ["raw"]}
    raw = (fast / "step_00000020" / "data-00000.bin").stat().st_size
    packed = (durable / "step_00000020" / "data-00000.bin").stat().st_size
    assert packed < raw
    assert uckpt.manifest(durable / "step_00000020").files["data-00000.bin"].size == packed
    uckpt.verify(durable / "step_00000020")
    shutil.rmtree(fast)  # the node and its local storage are gone
    with uckpt.CheckpointManager(tiers=tiers) as mgr:
        assert restored(mgr) == 20
        assert mgr.tiers_of(20) == ["lustre"]


def test_manager_default_and_tier_override(tmp_path):
    tiers = [tmp_path / "a", Tier(tmp_path / "b", compression="none"), tmp_path / "c"]
    with uckpt.CheckpointManager(tiers=tiers, compression="zstd", compression_level=3) as mgr:
        mgr.save(1, state(1))
    packed = {"w": ["bytegroup+zstd"], "noise": ["raw"]}
    assert codecs(tmp_path / "a" / "step_00000001") == packed  # the save compresses
    # a tier without compression copies chunks as they are; the default tier keeps them
    assert codecs(tmp_path / "b" / "step_00000001") == packed
    assert codecs(tmp_path / "c" / "step_00000001") == packed
    with uckpt.CheckpointManager(tmp_path / "b") as mgr:
        assert restored(mgr) == 1


def test_bad_tier_compression_is_refused_at_once(tmp_path):
    with pytest.raises(errors.CompressionError, match="unknown compression 'lzma'"):
        Tier(tmp_path / "d", compression="lzma")
    with pytest.raises(errors.CompressionError, match="unknown compression 'brotli'"):
        uckpt.CheckpointManager(tmp_path / "r", compression="brotli")
    assert not (tmp_path / "r").exists() and not (tmp_path / "d").exists()


def test_copy_checkpoint_compresses_and_keeps_compressed_chunks(tmp_path):
    src = uckpt.save(tmp_path / "src" / "ckpt", state(3))
    dst = copy_checkpoint(src, tmp_path / "dst" / "ckpt", compression="zstd")
    assert codecs(dst) == {"w": ["bytegroup+zstd"], "noise": ["raw"]}
    again = copy_checkpoint(dst, tmp_path / "again" / "ckpt", compression="zstd")
    assert (again / "data-00000.bin").read_bytes() == (dst / "data-00000.bin").read_bytes()
    out = uckpt.load(again)
    assert np.array_equal(out["w"], state(3)["w"]) and out["step"] == 3
    m_src, m_dst = uckpt.manifest(src), uckpt.manifest(dst)
    assert m_dst.tree == m_src.tree and m_dst.step == m_src.step
    assert m_dst.format_version == FORMAT_VERSION
    # content hashes are of the raw bytes: recoding keeps them, and so the Merkle roots
    assert [c.hash for c in m_dst.arrays["w"].chunks] == [c.hash for c in m_src.arrays["w"].chunks]
    assert m_dst.merkle_root == m_src.merkle_root


def test_damaged_source_is_not_recoded(tmp_path):
    src = uckpt.save(tmp_path / "src" / "ckpt", state(4))
    chunk = uckpt.manifest(src).arrays["w"].chunks[0]
    flip_byte(src / chunk.file, chunk.offset + 100)
    with pytest.raises(errors.ChecksumMismatchError, match="'w'"):
        copy_checkpoint(src, tmp_path / "dst" / "ckpt", compression="zstd")
    assert not (tmp_path / "dst" / "ckpt").exists()


def test_compressed_s3_durable_tier(tmp_path, s3_bucket, s3_options):
    durable = f"s3://{s3_bucket}/run"
    tiers = [tmp_path / "fast", Tier(durable, compression="zstd")]
    with uckpt.CheckpointManager(tiers=tiers, storage_options=s3_options, async_save=True) as mgr:
        for s in (1, 2):
            mgr.save(s, state(s))
    where = f"{durable}/step_00000002"
    assert codecs(where, s3_options) == {"w": ["bytegroup+zstd"], "noise": ["raw"]}
    uckpt.verify(where, storage_options=s3_options)
    shutil.rmtree(tmp_path / "fast")
    with uckpt.CheckpointManager(tiers=tiers, storage_options=s3_options) as mgr:
        assert restored(mgr) == 2
    # and a compressed save straight to the object store
    direct = uckpt.save(f"s3://{s3_bucket}/direct", state(5), compression="zstd",
                        storage_options=s3_options)
    assert codecs(direct, s3_options)["w"] == ["bytegroup+zstd"]
    out = uckpt.load(direct, storage_options=s3_options)
    assert np.array_equal(out["w"], state(5)["w"])
