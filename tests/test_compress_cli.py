"""The command line on compressed checkpoints: ``uckpt inspect`` shows codecs and ratios,
``uckpt verify`` checks the stored bytes, ``uckpt convert --compress`` writes a
compressed uckpt target (run as a user would: subprocesses, exit codes, files)."""
import json

import numpy as np
import pytest

import uckpt
from uckpt.format import FORMAT_VERSION
from convert_common import assert_error, assert_ok, cli
from conftest import flip_byte


@pytest.fixture
def ckpts(tmp_path):
    rng = np.random.default_rng(3)
    state = {"w": rng.standard_normal((200, 50)).astype(np.float32),
             "noise": rng.integers(0, 256, 4000, dtype=np.uint8), "epoch": 3}
    return (uckpt.save(tmp_path / "raw", state), uckpt.save(tmp_path / "zstd", state,
                                                            compression="zstd"), state)


def test_inspect_shows_codec_and_ratio(ckpts):
    _, packed, state = ckpts
    proc = cli("inspect", "--json", packed)
    assert_ok(proc)
    doc = json.loads(proc.stdout)
    leaves = {leaf["path"]: leaf for leaf in doc["leaves"]}
    m = uckpt.manifest(packed)
    stored = {p: sum(c.length for c in a.chunks) for p, a in m.arrays.items()}
    assert leaves["w"]["codec"] == "bytegroup+zstd" and leaves["noise"]["codec"] == "raw"
    assert leaves["w"]["stored"] == stored["w"] < state["w"].nbytes
    assert leaves["w"]["ratio"] == round(stored["w"] / state["w"].nbytes, 4) < 1
    assert leaves["noise"]["ratio"] == 1.0
    assert doc["stored"] == sum(stored.values()) and doc["nbytes"] == m.nbytes
    assert doc["ratio"] == round(doc["stored"] / doc["nbytes"], 4)
    text = cli("inspect", packed).stdout
    assert f"ratio {doc['ratio']:.3f}" in text
    rows = {line.split()[0]: line.split() for line in
            text.split("leaves:\n", 1)[1].strip().splitlines()[1:]}
    assert rows["w"][-2:] == ["bytegroup+zstd", f"{leaves['w']['ratio']:.3f}"]


def test_verify_compressed_and_damaged(ckpts):
    _, packed, _ = ckpts
    assert_ok(cli("verify", packed))
    chunk = uckpt.manifest(packed).arrays["w"].chunks[0]
    flip_byte(packed / chunk.file, chunk.offset + 20)
    assert_error(cli("verify", packed), "checksum mismatch", "'w'")


@pytest.mark.parametrize("codec", [None, "zstd+bytegroup"])
def test_convert_compress_to_uckpt(tmp_path, ckpts, codec):
    raw, _, state = ckpts
    dst = tmp_path / "converted"
    assert_ok(cli("convert", raw, dst, "--compress", *(["--codec", codec] if codec else [])))
    m = uckpt.manifest(dst)
    assert {c.codec for c in m.arrays["w"].chunks} == {("bytegroup", "zstd")}
    assert m.files["data-00000.bin"].size == (dst / "data-00000.bin").stat().st_size
    assert (dst / "data-00000.bin").stat().st_size < (raw / "data-00000.bin").stat().st_size
    out = uckpt.load(dst)
    assert np.array_equal(out["w"], state["w"]) and np.array_equal(out["noise"], state["noise"])
    assert_ok(cli("verify", dst))


@pytest.mark.parametrize("compress", [False, True])
def test_convert_to_uckpt_writes_content_hashes(tmp_path, ckpts, compress):
    """A converted uckpt target is version 4: every chunk's content hash, and the Merkle
    roots of a uckpt save of the same state (same chunking), raw or compressed."""
    raw, _, _ = ckpts
    npz = tmp_path / "state.npz"
    assert_ok(cli("convert", raw, npz))
    dst = tmp_path / "back"
    assert_ok(cli("convert", npz, dst, *(["--compress"] if compress else [])))
    m, saved = uckpt.manifest(dst), uckpt.manifest(raw)
    assert m.format_version == FORMAT_VERSION and all(c.hash for a in m.arrays.values()
                                                       for c in a.chunks)
    assert ({c.codec for c in m.arrays["w"].chunks} == {("bytegroup", "zstd")}) == compress
    assert {p: a.root for p, a in m.arrays.items()} == {p: a.root for p, a in saved.arrays.items()}
    assert m.merkle_root == saved.merkle_root
    assert_ok(cli("verify", dst))  # recomputes every hash and root from the bytes


def test_convert_compress_refuses_unknown_codec(tmp_path, ckpts):
    raw, _, _ = ckpts
    assert_error(cli("convert", raw, tmp_path / "x", "--compress", "--codec", "lz4"),
                 "uckpt cannot be compressed with 'lz4'")
    assert not (tmp_path / "x").exists()


def test_convert_reads_compressed_sources(tmp_path, ckpts):
    _, packed, state = ckpts
    dst = tmp_path / "out.npz"
    assert_ok(cli("convert", packed, dst))
    with np.load(dst) as z:
        assert np.array_equal(z["w"], state["w"])
