"""Every bad input gets a specific error naming what and where, and nothing saved is lost."""
import errno
import hashlib
import json
import os

from pathlib import Path

import numpy as np
import pytest

import uckpt
from uckpt import errors
from uckpt.format import integrity
from conftest import flip_byte, mount_tmpfs
from grid_listing import listed

STATE = {"w": np.arange(64, dtype=np.float32).reshape(8, 8), "b": np.ones(8), "epoch": 2}


def digest(directory):
    """Hash of every file under a directory, to prove nothing changed."""
    h = hashlib.sha256()
    for root, _, files in sorted(os.walk(directory)):
        for f in sorted(files):
            p = os.path.join(root, f)
            h.update(p.encode() + open(p, "rb").read())
    return h.hexdigest()


@pytest.fixture
def good(tmp_path):
    path = uckpt.save(tmp_path / "good", STATE)
    return path, digest(path)


def assert_intact(good):
    path, before = good
    assert digest(path) == before
    out = uckpt.load(path)
    np.testing.assert_array_equal(out["w"], STATE["w"])


def edit_manifest(path, fn):
    """Edit a manifest as JSON and write it back as the writer would, its checksum (format
    version 2) computed anew, so that the edit reaches the parser behind the check."""
    m = listed(json.loads((path / "manifest.json").read_bytes()))  # grids as chunk lists
    sealed = m.pop(integrity.FIELD, None) is not None
    fn(m)
    text = json.dumps(m, separators=(",", ":"), ensure_ascii=False)
    data = integrity.seal(text[:-1].encode()) if sealed else (text + "\n").encode()
    (path / "manifest.json").write_bytes(data)


@pytest.fixture
def victim(tmp_path):
    return uckpt.save(tmp_path / "victim", STATE)


def test_missing_directory(tmp_path, good):
    with pytest.raises(errors.CheckpointNotFoundError, match="does not exist") as ei:
        uckpt.load(tmp_path / "nope")
    assert isinstance(ei.value, FileNotFoundError)
    assert_intact(good)


def test_not_a_checkpoint(tmp_path, good):
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("hello")
    with pytest.raises(errors.NotACheckpointError, match="no manifest.json") as ei:
        uckpt.load(tmp_path / "plain")
    assert isinstance(ei.value, ValueError)
    with pytest.raises(errors.NotACheckpointError, match="is a file"):
        uckpt.load(tmp_path / "plain" / "notes.txt")
    assert_intact(good)


@pytest.mark.parametrize("version, pattern", [
    ("2.0", "(?s)format_version '2.0' is not supported.*upgrade uckpt"),
    ("1.1", "(?s)format_version '1.1' is not supported.*upgrade uckpt"),
    (99, "(?s)format_version 99 is not supported.*never written by uckpt"),
    (0, "(?s)format_version 0 is not supported.*never released"),
    (1.0, "format_version: expected the string \"1.0\""),
])
def test_unknown_format_version(victim, good, version, pattern):
    """Format 1.0 is the string "1.0"; another string is a later format; an integer other
    than the pre-release 1 to 6 was never written."""
    raw = json.loads((victim / "manifest.json").read_bytes())
    raw.update(format_version=version)
    del raw[integrity.FIELD]
    text = json.dumps(raw, separators=(",", ":"))
    (victim / "manifest.json").write_bytes(integrity.seal(text[:-1].encode()))
    with pytest.raises(errors.FormatVersionError if version != 1.0 else errors.ManifestError,
                       match=pattern):
        uckpt.load(victim)
    assert_intact(good)


@pytest.mark.parametrize("mutate, pattern", [
    (lambda m: m.pop("arrays"), "missing field.*arrays"),
    (lambda m: m.update(extra=1), "unknown field.*extra"),
    (lambda m: m.update(world_size="1"), "world_size: expected a non-negative integer"),
    (lambda m: m["arrays"]["w"].update(shape="8x8"), r"arrays\['w'\].shape: expected a list"),
    (lambda m: m["arrays"]["w"].update(dtype="float128"), "unknown dtype 'float128'"),
    (lambda m: m["arrays"]["w"]["chunks"][0].update(checksum="md5:1"), "checksum"),
    (lambda m: m["arrays"]["w"]["chunks"][0].update(codec="zip"), "unknown codec 'zip'"),
    (lambda m: m["tree"]["items"]["w"].update(type="pickle"), "unknown node type 'pickle'"),
    (lambda m: m["tree"]["items"]["w"].update(path="ghost"), "'ghost' is not listed"),
    (lambda m: m["arrays"]["w"]["chunks"][0].update(shape=[4, 8]), "shape \\[4, 8\\] holds 128"),
    (lambda m: m["arrays"]["w"]["chunks"][0].update(shape=[4, 8], length=128),
     "cover 32 elements, the array has 64"),
], ids=["missing", "unknown", "type", "shape-type", "dtype", "checksum", "codec", "node", "ref",
        "length", "coverage"])
def test_malformed_manifest(victim, good, mutate, pattern):
    edit_manifest(victim, mutate)
    with pytest.raises(errors.ManifestError, match=pattern) as ei:
        uckpt.load(victim)
    assert "manifest.json" in str(ei.value)
    assert_intact(good)


def test_invalid_json_manifest(victim):
    (victim / "manifest.json").write_bytes(b"{not json")
    with pytest.raises(errors.ManifestError, match="not valid UTF-8 JSON"):
        uckpt.load(victim)


def test_chunk_outside_its_file(victim, good):
    edit_manifest(victim, lambda m: m["arrays"]["w"]["chunks"][0].update(offset=10 ** 9))
    with pytest.raises(errors.ManifestError, match="lie outside 'data-00000.bin'"):
        uckpt.load(victim)
    assert_intact(good)


@pytest.mark.parametrize("name", ["../escape.bin", "/etc/passwd", ".hidden", "a/b.bin", ".."])
def test_path_escaping_the_checkpoint(victim, good, name):
    def mutate(m):
        m["files"][name] = m["files"].pop("data-00000.bin")
        for a in m["arrays"].values():
            for c in a["chunks"]:
                c["file"] = name
    edit_manifest(victim, mutate)
    with pytest.raises(errors.UnsafePathError, match="not a plain file name"):
        uckpt.load(victim)
    assert_intact(good)


def test_flipped_byte_names_file_leaf_offset(victim, good):
    m = uckpt.manifest(victim)
    chunk = m.arrays["b"].chunks[0]
    flip_byte(victim / chunk.file, chunk.offset + 3)
    with pytest.raises(errors.ChecksumMismatchError) as ei:
        uckpt.load(victim)
    msg = str(ei.value)
    assert "data-00000.bin" in msg and "'b'" in msg and f"byte offset {chunk.offset}" in msg
    assert ei.value.leaf == "b" and ei.value.offset == chunk.offset
    with pytest.raises(errors.ChecksumMismatchError):
        uckpt.verify(victim)
    assert_intact(good)


def test_truncated_data_file(victim, good):
    data = victim / "data-00000.bin"
    os.truncate(data, data.stat().st_size - 5)
    with pytest.raises(errors.TruncatedDataError, match="truncated") as ei:
        uckpt.load(victim)
    assert ei.value.path.endswith("data-00000.bin")
    assert_intact(good)


def test_missing_data_file(victim):
    (victim / "data-00000.bin").unlink()
    with pytest.raises(errors.CheckpointNotFoundError, match="data-00000.bin.*missing"):
        uckpt.load(victim)


def test_object_no_adapter_knows(tmp_path, good):
    class Opaque:
        pass

    with pytest.raises(errors.UnsupportedObjectError, match="Opaque at 'thing/x'") as ei:
        uckpt.save(tmp_path / "c", {"thing": {"x": Opaque()}})
    assert isinstance(ei.value, TypeError)
    assert not (tmp_path / "c").exists() and not list(tmp_path.glob(".c*"))
    assert_intact(good)


def test_unknown_dtype_refused(tmp_path):
    with pytest.raises(errors.UnsupportedDtypeError, match="leaf 'names'"):
        uckpt.save(tmp_path / "c", {"names": np.array(["a", "b"])})
    with pytest.raises(errors.UnsupportedDtypeError):
        uckpt.save(tmp_path / "c", {"objs": np.array([object()])})


def test_shape_and_dtype_mismatch_on_load(good):
    path, _ = good
    with pytest.raises(errors.ShapeMismatchError, match=r"'w'.*\[8, 8\].*\[4, 16\]"):
        uckpt.load(path, {"w": np.zeros((4, 16), np.float32), "b": None, "epoch": None})
    b = np.zeros(8, np.float32)
    with pytest.raises(errors.DtypeMismatchError, match="'b'.*float64.*float32"):
        uckpt.load(path, {"w": None, "b": b, "epoch": None})
    assert not b.any()
    assert_intact(good)


def test_save_over_committed_checkpoint_refused(good):
    path, _ = good
    with pytest.raises(errors.CheckpointExistsError, match="already holds a committed") as ei:
        uckpt.save(path, {"other": np.zeros(3)})
    assert isinstance(ei.value, FileExistsError)
    assert_intact(good)
    uckpt.save(path, {"other": np.zeros(3)}, overwrite=True)
    assert list(uckpt.load(path)) == ["other"]
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]


def test_save_into_foreign_directory_refused(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("precious")
    for overwrite in (False, True):
        with pytest.raises(errors.CheckpointExistsError, match="not a uckpt checkpoint"):
            uckpt.save(tmp_path / "mine", STATE, overwrite=overwrite)
    assert (tmp_path / "mine" / "thesis.tex").read_text() == "precious"


def test_bad_metadata_and_step(tmp_path):
    with pytest.raises(errors.ManifestError, match="not JSON-serialisable"):
        uckpt.save(tmp_path / "c", STATE, metadata={"f": object()})
    with pytest.raises(errors.ManifestError, match="not JSON-serialisable"):
        uckpt.save(tmp_path / "c", STATE, metadata={"f": float("nan")})
    with pytest.raises(ValueError, match="step"):
        uckpt.save(tmp_path / "c", STATE, step=-1)
    assert not (tmp_path / "c").exists()


@pytest.fixture
def tiny_fs(tmp_path):
    """A 1 MiB tmpfs (needs root); skipped where mounting is not allowed."""
    yield from mount_tmpfs(tmp_path / "tiny", "1m")


def test_disk_full_on_a_real_small_filesystem(tiny_fs):
    first = uckpt.save(tiny_fs / "first", {"w": np.ones(1000, np.float32)})
    before = digest(first)
    big = {"w": np.ones(2 << 20, np.float32)}  # 8 MiB does not fit in 1 MiB
    with pytest.raises(errors.StorageFullError, match="no space left") as ei:
        uckpt.save(tiny_fs / "second", big)
    assert ei.value.errno == errno.ENOSPC and isinstance(ei.value, OSError)
    assert not (tiny_fs / "second").exists()
    assert sorted(p.name for p in tiny_fs.iterdir()) == ["first"]  # temp files removed
    assert digest(first) == before
    np.testing.assert_array_equal(uckpt.load(first)["w"], np.ones(1000, np.float32))


def test_incremental_save_that_fits_although_its_reservation_does_not(tiny_fs):
    """An incremental save reserves room for every chunk it might write (the whole state)
    before it knows which changed; on a nearly full disk that reservation fails, and the
    save must go on and write the few chunks that changed."""
    frozen = np.arange(150_000, dtype=np.float32)  # 600 kB of the 1 MiB disk, unchanged
    one = uckpt.save(tiny_fs / "one", {"frozen": frozen, "head": np.zeros(64)},
                     incremental=True)
    two = uckpt.save(tiny_fs / "two", {"frozen": frozen, "head": np.ones(64)}, base=one)
    out = uckpt.load(two)
    np.testing.assert_array_equal(out["frozen"], frozen)
    np.testing.assert_array_equal(out["head"], np.ones(64))
    assert uckpt.manifest(two).bases  # the frozen array is a reference, not a copy
    assert sum(f.stat().st_size for f in Path(two).iterdir()) < 100_000


def test_disk_full_injected_at_the_write_call(tmp_path, good, monkeypatch):
    """Same guarantee where preallocation is unsupported and the write itself fails."""
    import uckpt.storage.fsutil as fsutil

    def full(fd, buffers, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fsutil, "preallocate", lambda fd, size: None)
    monkeypatch.setattr(fsutil, "pwritev_all", full)
    with pytest.raises(errors.StorageFullError):
        uckpt.save(tmp_path / "second", STATE)
    assert not (tmp_path / "second").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert_intact(good)


def test_mixed_str_and_int_keys_are_refused_at_save(tmp_path):
    with pytest.raises(errors.UnsupportedObjectError, match="mixes str and int keys"):
        uckpt.save(tmp_path / "ck", {"d": {0: 1, "0": 2}})
    assert not (tmp_path / "ck").exists()


def test_key_type_must_match_on_restore(tmp_path):
    uckpt.save(tmp_path / "ck", {"d": {0: np.ones(2), 10: np.ones(2)}})
    with pytest.raises(errors.KeyMismatchError, match="key '0' is str, the checkpoint's keys here are int"):
        uckpt.load(tmp_path / "ck", {"d": {"0": np.zeros(2), "10": np.zeros(2)}})
    state = {"d": {0: np.zeros(2), 10: np.zeros(2)}}
    uckpt.load(tmp_path / "ck", state)
    assert (state["d"][0] == 1).all() and (state["d"][10] == 1).all()
