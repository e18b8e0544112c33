"""Bounded memory in ``uckpt convert`` and ``uckpt.consolidate`` on any input, and every error
a ``UckptError`` (issue 25, section 3, conversion side): a uckpt source whose Zstandard
frames declare far more than the checkpoint holds, ``.keras`` weights members that are
deflated (and over 2 GiB), zip members past a lowered ``--max-ratio``, Hugging Face
indexes whose fields have the wrong type, and a consolidation of many arrays. Peak memory
is measured in a subprocess (``ru_maxrss`` of a child above a dry run's, or ``VmHWM``)."""
import json
import os
import subprocess
import sys
import zlib

import numpy as np
import pytest

import uckpt
from bombs import MIB, keras_archive, npy_header, raw_zip, write_bomb
from convert_common import assert_error, cli, leftovers
from test_convert_safety import baseline_kib, measured  # noqa: F401, F811 (a fixture)
from uckpt.conversion import LimitExceededError, Limits, convert, open_checkpoint
from uckpt.errors import CorruptCheckpointError


# -- a uckpt source: what its data files can hold ---------------------------------------------
@pytest.fixture(scope="module")
def zstd_bomb(tmp_path_factory):
    """A uckpt checkpoint of 256 MiB of zeros in one Zstandard frame: 8 KB on disk."""
    return write_bomb(tmp_path_factory.mktemp("bomb") / "ckpt", 256 * MIB)


def test_uckpt_source_larger_than_its_files_can_hold_is_refused(zstd_bomb, tmp_path,
                                                                baseline_kib):
    """Before: converted, allocating the 256 MiB the manifest declares for 8 KB of files."""
    held = sum(f.stat().st_size for f in zstd_bomb.glob("data-*.bin"))
    assert held < 16 << 10
    code, err, kib = measured("convert", zstd_bomb, tmp_path / "out.npz")
    assert code == 1 and "Traceback" not in err, err
    assert f"array 'w' makes {256 * MIB} bytes out of {held} stored, more than 1032 per " \
           "byte" in err and "--max-ratio" in err, err
    assert kib - baseline_kib < 32 << 10, (kib, baseline_kib)
    assert not (tmp_path / "out.npz").exists() and not leftovers(tmp_path)
    with pytest.raises(LimitExceededError, match="array 'w' makes"):
        open_checkpoint(zstd_bomb)


def test_uckpt_source_within_a_raised_ratio_converts(tmp_path):
    """The hint's remedy works: a legitimate checkpoint of zeros converts with the ratio
    raised, and a checkpoint whose arrays fit the default converts as before."""
    src = tmp_path / "zeros"
    uckpt.save(src, {"w": np.zeros(4 * MIB, np.uint8)}, compression="zstd")
    with pytest.raises(LimitExceededError):
        convert(src, tmp_path / "a.npz")
    convert(src, tmp_path / "a.npz", limits=Limits(max_ratio=1 << 20))
    assert np.load(tmp_path / "a.npz")["w"].shape == (4 * MIB,)
    uckpt.save(tmp_path / "plain", {"w": np.arange(1000.0)}, compression="zstd")
    convert(tmp_path / "plain", tmp_path / "b.npz")
    assert (np.load(tmp_path / "b.npz")["w"] == np.arange(1000.0)).all()


# -- consolidate: a piece at a time ------------------------------------------------------------
CONSOLIDATE = """
import sys
import uckpt

def status(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))

with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak (VmHWM) from here on; ru_maxrss would keep the forking parent's
base = status("VmRSS")
uckpt.consolidate(sys.argv[1], sys.argv[2], compression=sys.argv[3] or None)
print(status("VmHWM") - base)
"""


@pytest.mark.parametrize("compression", ["", "zstd"])
def test_consolidate_holds_a_few_pieces_not_every_array(tmp_path, compression):
    """32 arrays of 4 MiB: before, all 128 MiB were read before the first byte was written;
    now the peak (KiB, Linux VmHWM) is a few pieces (at most ``compress_ahead_bytes`` ahead
    of the writing)."""
    rng = np.random.default_rng(0)
    state = {f"a{i}": rng.integers(0, 255, 4 * MIB, dtype=np.uint8) for i in range(32)}
    uckpt.save(tmp_path / "src", state)
    proc = subprocess.run([sys.executable, "-c", CONSOLIDATE, str(tmp_path / "src"),
                           str(tmp_path / "dst"), compression], capture_output=True, text=True,
                          timeout=300,
                          env=dict(os.environ, UCKPT_COMPRESS_AHEAD_BYTES=str(4 * MIB)))
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) < 64 << 10, proc.stdout  # KiB; 128 MiB and more before
    back = uckpt.load(tmp_path / "dst")
    assert uckpt.manifest(tmp_path / "dst").world_size == 1
    assert all((back[k] == v).all() for k, v in state.items())


# -- zip members: inflation ratio and bounded copies -------------------------------------------
def test_keras_deflated_weights_are_copied_in_pieces(tmp_path, baseline_kib, monkeypatch):
    """A 1.2 MB archive whose weights member inflates to 256 MiB: before, the whole member
    was inflated into memory (the peak grew by 256 MiB); now 1 MiB at a time."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where the weights are copied to
    compressed = keras_archive(tmp_path / "m.keras", 256)
    assert compressed < 2 * MIB
    code, err, kib = measured("convert", tmp_path / "m.keras", tmp_path / "out.npz")
    assert code == 0, err
    assert kib - baseline_kib < 48 << 10, (kib, baseline_kib)
    out = np.load(tmp_path / "out.npz")
    assert (out["layers/dense/vars/0"] == np.arange(6, dtype=np.float32)).all()
    assert not list(tmp_path.glob("uckpt-keras-*"))


def test_keras_weights_member_over_2_gib_is_copied_whole(tmp_path, monkeypatch):
    """Before: one os.write copied at most 2,147,479,552 bytes (Linux), the HDF5 file lost
    its end ("file signature not found": its superblock lies after 2 GiB of user block).
    Writes 2 GiB to tmp_path (slow: listed in conftest.SLOW_TESTS)."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    keras_archive(tmp_path / "big.keras", 2048)  # the HDF5 data after 2 GiB of zeros
    proc = cli("convert", tmp_path / "big.keras", tmp_path / "out.npz")
    assert proc.returncode == 0, proc.stderr
    out = np.load(tmp_path / "out.npz")
    assert (out["layers/dense/vars/0"] == np.arange(6, dtype=np.float32)).all()
    assert not list(tmp_path.glob("uckpt-keras-*"))


def _npz_of_zeros(path, n: int) -> int:
    raw = npy_header((n,)) + bytes(n)
    stream = zlib.compress(raw, 9)[2:-4]
    raw_zip(path, [(b"w.npy", stream, zlib.crc32(raw), len(raw), 8, 0)])
    return len(raw) // len(stream)


def test_zip_member_past_a_lowered_ratio_is_refused(tmp_path):
    """``--max-ratio`` below 1032 now bounds deflated zip members too (before: only HDF5
    filters and strided tensors), named with the member and its ratio."""
    ratio = _npz_of_zeros(tmp_path / "z.npz", 1 * MIB)
    assert 100 < ratio <= 1032
    convert(tmp_path / "z.npz", tmp_path / "a.npz")
    with pytest.raises(LimitExceededError, match=r"zip member 'w.npy' makes \d+ bytes out of "
                                                 r"\d+ stored, more than 50 per byte"):
        convert(tmp_path / "z.npz", tmp_path / "b.npz", limits=Limits(max_ratio=50))
    assert_error(cli("convert", tmp_path / "z.npz", tmp_path / "c.npz", "--max-ratio", "50"),
                 "zip member 'w.npy' makes", "--max-ratio R")


# -- Hugging Face indexes ----------------------------------------------------------------------
@pytest.fixture
def hf_dir(tmp_path):
    d = tmp_path / "hf"
    d.mkdir()
    np.savez(tmp_path / "w.npz", w=np.ones(3, np.float32))
    convert(tmp_path / "w.npz", d / "model.safetensors")
    return d


def _index(d, weight_map, **more):
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map,
                                                                  **more}))


@pytest.mark.parametrize("value,shown", [(["model.safetensors"], "a list of 1 items"),
                                         ({"f": 1}, "an object of 1 members"), (5, "5"),
                                         (None, "null")])
def test_hf_weight_map_value_not_a_string(hf_dir, tmp_path, value, shown):
    """Before: TypeError (unhashable list or dict) with a traceback from the CLI, or an
    error that did not name the key."""
    _index(hf_dir, {"w": value})
    index = hf_dir / "model.safetensors.index.json"
    for src in (index, hf_dir):
        with pytest.raises(CorruptCheckpointError) as info:
            convert(src, tmp_path / "out.npz", force=True)
        assert f"{index}: weight_map['w'] is {shown}, not the name of a shard file" \
            in str(info.value)
        assert info.value.leaf == "w" and info.value.path == str(index)
    assert_error(cli("convert", hf_dir, tmp_path / "cli.npz"), "weight_map['w'] is", shown)


@pytest.mark.parametrize("more,message", [
    ({"metadata": [1]}, "metadata is a list of 1 items, not an object"),
    ({"metadata": {"total_size": "12"}}, "metadata.total_size is '12', not a number of bytes"),
    ({"metadata": {"total_size": -1}}, "metadata.total_size is -1, not a number of bytes"),
])
def test_hf_index_metadata_of_the_wrong_type(hf_dir, tmp_path, more, message):
    """Before: ignored (the index converted as if it had no metadata)."""
    _index(hf_dir, {"w": "model.safetensors"}, **more)
    with pytest.raises(CorruptCheckpointError, match=message):
        convert(hf_dir, tmp_path / "out.npz")


def test_hf_other_index_with_a_list_for_weight_map(hf_dir, tmp_path):
    """A directory with both indexes reads the safetensors one and carries the other;
    before, the other's weight_map being a list raised AttributeError."""
    _index(hf_dir, {"w": "model.safetensors"})
    (hf_dir / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": [1]}))
    with pytest.raises(CorruptCheckpointError, match="pytorch_model.bin.index.json: not a "
                                                     "Hugging Face index"):
        convert(hf_dir, tmp_path / "out.npz")


# -- diff: two arrays at a time ----------------------------------------------------------------
def test_diff_holds_two_arrays_not_three(tmp_path, baseline_kib):
    """Before: equal arrays were compared whole (a bool per element: for bytes, a third
    array); found by the bombs of tests/test_fuzz_convert.py."""
    w = np.zeros(96 * MIB, np.uint8)
    w[-1] = 1
    np.savez(tmp_path / "a.npz", w=w)
    np.savez(tmp_path / "b.npz", w=w)
    del w
    code, err, kib = measured("diff", tmp_path / "a.npz", tmp_path / "b.npz")
    assert code == 0, err
    assert kib - baseline_kib < (2 * 96 + 32) << 10, (kib, baseline_kib)
