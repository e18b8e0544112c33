"""The NumPy reader of docs/format-legacy.md reads the pre-release golden checkpoints (format
versions 1 to 6) as uckpt loads them, checks their manifests and chunks, and refuses other
versions (format 1.0 included: docs/format.md's reader reads that). Its CRC-32C is
tested beside the reference reader's, in test_format10_spec.py."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import uckpt
from format10_writer import seal
from spec_doc import as_read, legacy_reader
from test_format import assert_same
from uckpt.loading.reader import CheckpointReader

DATA = Path(__file__).resolve().parent / "data"
GOLDENS = {v: DATA / f"golden_v{v}" for v in range(1, 7)}
EACH_GOLDEN = [pytest.param(v, name, id=f"v{v}-{name}")
               for v in GOLDENS for name in ("all_types", "example", "sharded")]
EACH_GOLDEN.append(pytest.param(3, "codecs", id="v3-codecs"))


@pytest.fixture(scope="module")
def reader():
    return legacy_reader()


@pytest.mark.parametrize("version, name", EACH_GOLDEN)
def test_legacy_reader_reads_golden(reader, version, name):
    directory = GOLDENS[version] / name
    m, arrays = reader["read_checkpoint"](str(directory))
    with CheckpointReader(directory) as r:
        want = r.read_arrays({p: None for p in r.manifest.arrays})
    assert m["format_version"] == version and list(arrays) == list(want)
    for path in want:
        assert_same(arrays[path], as_read(want[path]), path)
    assert_same(reader["decode"](m["tree"], arrays), as_read(uckpt.load(directory)))


@pytest.mark.parametrize("version", [4, 5, 6])
def test_legacy_reader_follows_references_of_the_golden_chain(reader, version):
    m, arrays = reader["read_checkpoint"](str(GOLDENS[version] / "chain" / "step_00000002"))
    assert list(m["bases"]) == ["step_00000001"]
    with CheckpointReader(GOLDENS[version] / "chain" / "step_00000002") as r:
        want = r.read_arrays({"w": None})
    assert_same(arrays["w"], want["w"])


def test_legacy_reader_keeps_aliases(reader):
    m, arrays = reader["read_checkpoint"](str(GOLDENS[6] / "all_types"))
    state = reader["decode"](m["tree"], arrays)
    assert state["shared"] is state["tied"]["again"]


def test_legacy_reader_detects_manifest_damage(reader, tmp_path):
    """Every changed byte of a version-6 manifest is caught (a sample of offsets)."""
    directory = shutil.copytree(GOLDENS[6] / "example", tmp_path / "example")
    path = directory / "manifest.json"
    raw = path.read_bytes()
    rng = np.random.default_rng(12)
    offsets = sorted(set(rng.integers(0, len(raw), 40).tolist()) |
                     set(range(len(raw) - 40, len(raw))))
    for offset in offsets:
        damaged = bytearray(raw)
        damaged[offset] = (raw[offset] + int(rng.integers(1, 256))) % 256
        path.write_bytes(bytes(damaged))
        with pytest.raises(ValueError):  # damaged, not JSON (or not UTF-8), not uckpt 1 to 6
            reader["read_checkpoint"](str(directory))
    path.write_bytes(raw)
    reader["read_checkpoint"](str(directory))


def test_legacy_reader_detects_chunk_damage(reader, tmp_path):
    directory = shutil.copytree(GOLDENS[6] / "example", tmp_path / "example")
    with open(directory / "data-00000.bin", "r+b") as f:
        f.seek(65)  # the second byte of model/b's chunk (offset 64)
        f.write(b"\x40")
    with pytest.raises(ValueError, match="model/b.*offset 64"):
        reader["read_checkpoint"](str(directory))


@pytest.mark.parametrize("version", [7, "1.0"])
def test_legacy_reader_refuses_other_versions(reader, tmp_path, version):
    directory = shutil.copytree(GOLDENS[6] / "example", tmp_path / "example")
    doc = json.loads((directory / "manifest.json").read_bytes())
    del doc["manifest_checksum"]
    doc["format_version"] = version
    (directory / "manifest.json").write_bytes(seal(doc))
    with pytest.raises(ValueError, match="version 1 to 6"):
        reader["read_checkpoint"](str(directory))
