"""Incremental checkpoints copied to a tier that compresses while copying (docs/format.md
14.5, item 5): the checkpoint's own chunks are re-encoded, references stay references to
the bases as that tier stores them, hashes and Merkle roots are unchanged, and every copy
passes ``uckpt verify`` (a subprocess, as a user runs it) and restores after node loss."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import uckpt
from uckpt import Tier, errors
from uckpt.format import FORMAT_VERSION
from uckpt.manager.tiers import copy_checkpoint
from conftest import PYTHON
from incremental_common import check, empty_state, manager, save, state

GOLDEN = Path(__file__).with_name("data")

pytestmark = pytest.mark.timeout(300)


def cli_verify(path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run([PYTHON, "-m", "uckpt.cli", "verify", str(path)], capture_output=True,
                          text=True, env=env, timeout=120)


def own(m):
    return [c for a in m.arrays.values() for c in a.chunks if c.base is None]


def test_compressed_durable_tier_holds_recoded_bases_and_references(tmp_path):
    fast, durable = tmp_path / "fast", tmp_path / "durable"
    with manager(tiers=[fast, Tier(durable, keep=1, compression="zstd")],
                                 incremental=True, durable_every=2, async_save=True) as mgr:
        for s in range(1, 6):
            mgr.save(s, state(s))
    steps = manager(durable).steps()
    assert steps == [1, 2, 3, 4]  # step 4 and the steps it refers to (copied first)
    for s in steps:
        name = f"step_{s:08d}"
        m_fast, m_durable = uckpt.manifest(fast / name), uckpt.manifest(durable / name)
        assert m_durable.format_version == FORMAT_VERSION
        assert m_durable.merkle_root == m_fast.merkle_root  # hashes are of the raw bytes
        assert set(m_durable.bases) == set(m_fast.bases)
        assert {c.codec for c in own(m_fast)} == {()}
        assert ("bytegroup", "zstd") in {c.codec for c in own(m_durable)}  # re-encoded
        for path, entry in m_durable.arrays.items():
            for c in entry.chunks:
                if c.base is None:
                    continue
                # a reference is the base's own chunk of that box, as this tier stores it
                held = next(h for h in uckpt.manifest(durable / c.base).arrays[path].chunks
                            if h.base is None and h.start == c.start)
                assert (c.file, c.offset, c.length, c.codec, c.checksum, c.hash) == \
                    (held.file, held.offset, held.length, held.codec, held.checksum, held.hash)
        for base, files in m_durable.bases.items():
            assert files == {f: (durable / base / f).stat().st_size for f in files}
        proc = cli_verify(durable / name)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    shutil.rmtree(fast)  # the node is lost
    out = empty_state()
    assert manager(tiers=[fast, durable]).restore(out) == 4
    check(out, 4)


def test_copy_with_compression_needs_the_bases_on_the_target(tmp_path):
    one = save(tmp_path / "src" / "one", state(1), incremental=True)
    two = save(tmp_path / "src" / "two", state(2), base=one)
    with pytest.raises(errors.CheckpointNotFoundError, match="copy the bases first"):
        copy_checkpoint(two, tmp_path / "dst" / "two", compression="zstd")
    assert not (tmp_path / "dst" / "two").exists()
    copy_checkpoint(one, tmp_path / "dst" / "one", compression="zstd")
    dst = copy_checkpoint(two, tmp_path / "dst" / "two", compression="zstd")
    assert uckpt.manifest(dst).merkle_root == uckpt.manifest(two).merkle_root
    check(uckpt.load(dst), 2)
    uckpt.verify(dst)


def test_copy_of_an_older_version_gets_content_hashes(tmp_path):
    """A version-3 checkpoint (no content hashes; raw and compressed chunks) copied with
    compression is written in the current version, with the hashes and roots golden_v4 records for
    the same arrays."""
    src = tmp_path / "src" / "codecs"
    shutil.copytree(GOLDEN / "golden_v3" / "codecs", src)
    assert uckpt.manifest(src).format_version == 3
    dst = copy_checkpoint(src, tmp_path / "dst" / "codecs", compression="zstd")
    m = uckpt.manifest(dst)
    assert m.format_version == FORMAT_VERSION
    assert m.merkle_root == uckpt.manifest(GOLDEN / "golden_v4" / "codecs").merkle_root
    uckpt.verify(dst)


def test_plain_copy_points_references_at_the_bases_as_the_target_stores_them(tmp_path):
    """A base copied to the target compressed, then a checkpoint referring to it copied
    there without compression: the copy's references must name the target's
    (compressed) chunks, not the source's raw offsets, or it would not load there."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    one = save(src / "one", state(1), incremental=True)
    copy_checkpoint(one, dst / "one", compression="zstd")
    two = save(src / "two", state(2), base=one)
    copy_checkpoint(two, dst / "two")  # plain
    m_src, m_dst = uckpt.manifest(two), uckpt.manifest(dst / "two")
    assert m_src.bases and set(m_dst.bases) == set(m_src.bases)
    assert m_dst.merkle_root == m_src.merkle_root
    refs = [c for e in m_dst.arrays.values() for c in e.chunks if c.base]
    assert refs and ("bytegroup", "zstd") in {c.codec for c in refs}
    assert {c.codec for c in own(m_dst)} == {()}  # its own chunks copied as they are
    proc = cli_verify(dst / "two")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    shutil.rmtree(src)
    check(uckpt.load(dst / "two"), 2)
