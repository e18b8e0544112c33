"""Extension part-roots (docs/format.md section 13.2): a split checkpoint's merkle_root
finished from one root per chunk table, so the committer gets 16 bytes per part, not per chunk.

* golden_1.0/part_roots (written by uckpt on two ranks) loads bit for bit on 1, 2 and 3
  ranks, verifies (API and CLI) and the reference reader reads it;
* a rank's record to the committer does not grow with the number of chunks it wrote;
* damaged variants are refused naming the member or the part: a wrong part root, a wrong
  count, the member without the declaration, the extension declared optional, a part whose
  rows do not give its root.
"""
import base64
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import format10_writer as fw
import uckpt
from uckpt import errors
from uckpt.codecs import hashing
from uckpt.saving import own_parts
from uckpt.testing import run_ranks
from grid_listing import golden
from spec_doc import reference_reader
from test_format10_spec import manifest as doc_of, reseal

GOLDEN = Path(__file__).resolve().parent / "data" / "golden_1.0" / "part_roots"


def copy(tmp_path):
    return Path(shutil.copytree(GOLDEN, tmp_path / "c"))


# --- the golden checkpoint --------------------------------------------------------------------
def test_golden_declares_the_extension_and_loads_bitwise():
    doc = doc_of(GOLDEN)
    assert doc["extensions"]["part-roots"] == {"required": True}
    assert len(doc["part-roots:roots"]) == len(doc["parts"]) == 2
    assert doc["chunks"]["count"] == 1  # the replicated array's row
    got, want = uckpt.load(GOLDEN), golden.part_roots_expected()
    assert list(got) == list(want) and got["epoch"] == 9
    for k in ("w", "b"):
        assert (got[k].dtype, got[k].shape, got[k].tobytes()) == \
            (want[k].dtype, want[k].shape, want[k].tobytes())
    assert uckpt.verify(GOLDEN).merkle_root == doc["merkle_root"]


@pytest.mark.parametrize("world", [1, 2, 3])
def test_golden_loads_on_any_number_of_ranks(world):
    def job(c):
        state = golden.part_roots_state(c.rank, world)
        state = {"w": uckpt.Shard(np.zeros_like(state["w"].array), state["w"].global_shape,
                                  state["w"].offsets), "b": np.zeros(3), "epoch": 0}
        uckpt.load(GOLDEN, state, comm=c)
        return state
    full = golden.part_roots_expected()
    for rank, state in enumerate(run_ranks(world, job)):
        assert not isinstance(state, BaseException), state
        want = golden.part_roots_state(rank, world)["w"]
        assert state["w"].array.tobytes() == want.array.tobytes()
        assert state["b"].tobytes() == full["b"].tobytes() and state["epoch"] == 9


def test_cli_verifies_the_golden():
    out = subprocess.run([sys.executable, "-m", "uckpt", "verify", str(GOLDEN)],
                         capture_output=True, text=True)
    assert out.returncode == 0 and "OK:" in out.stdout, out.stderr


def test_reference_reader_reads_the_golden():
    _, arrays = reference_reader()["read_checkpoint"](str(GOLDEN))
    want = golden.part_roots_expected()
    assert arrays["w"].tobytes() == want["w"].tobytes()
    assert arrays["b"].tobytes() == want["b"].tobytes()


# --- what the committer receives --------------------------------------------------------------
def test_a_ranks_record_does_not_grow_with_its_chunks(tmp_path, monkeypatch):
    """Issue 27: each rank sends its part's root (16 bytes), not 16 bytes per chunk."""
    records = []
    real = own_parts.own_record

    def keep(*args):
        records.append(real(*args))
        return records[-1]
    monkeypatch.setattr(own_parts, "own_record", keep)
    sizes = {}
    for rows in (8, 256):
        records.clear()
        w = np.arange(rows * 64, dtype=np.float32).reshape(rows, 64)

        def save(c, w=w, rows=rows):
            half = rows // 2 * c.rank
            return uckpt.save(tmp_path / f"c{rows}", {
                "w": uckpt.Shard(w[half:half + rows // 2], w.shape, (half, 0)),
                "b": np.ones(4)}, comm=c, options=uckpt.SaveOptions(chunk_bytes=256))
        assert all(not isinstance(o, BaseException) for o in run_ranks(2, save))
        assert len(records) == 2
        sizes[rows] = [len(json.dumps(r)) for r in records]
        uckpt.verify(tmp_path / f"c{rows}")
    parts = json.loads((tmp_path / "c256" / "manifest.part-00001.json").read_bytes())
    assert parts["chunks"]["count"] >= 64  # many chunks per rank
    # (main: 16 bytes more per chunk; here at most a digit more in the part's size)
    assert sum(sizes[256]) - sum(sizes[8]) <= 4, sizes


# --- damaged variants -------------------------------------------------------------------------
def test_a_wrong_part_root_is_refused_naming_merkle_root(tmp_path):
    path = copy(tmp_path)
    doc = doc_of(path)
    doc["part-roots:roots"][1] = hashing.of(b"another")
    reseal(path, doc)
    with pytest.raises(errors.ManifestError, match=r"merkle_root: .*part-roots:roots"):
        uckpt.manifest(path)
    with pytest.raises(ValueError, match="merkle_root does not match"):
        reference_reader()["read_checkpoint"](str(path))


def test_a_part_whose_rows_do_not_give_its_root_is_refused_naming_it(tmp_path):
    """A part sealed by its entry (size, CRC-32C) whose rows differ from what the committer
    hashed: one content hash changed, the entry updated, the root's roots not."""
    path = copy(tmp_path)
    doc = doc_of(path)
    name = doc["parts"][1]["file"]
    part = json.loads((path / name).read_bytes())
    digests = bytearray(base64.b64decode(part["chunks"]["digests"]))
    digests[-1] ^= 1
    part["chunks"]["digests"] = base64.b64encode(bytes(digests)).decode()
    data = json.dumps(part, separators=(",", ":")).encode() + b"\n"
    (path / name).write_bytes(data)
    doc["parts"][1].update(size=len(data), checksum=f"crc32c:{fw.crc32c(data):08x}")
    reseal(path, doc)
    with pytest.raises(errors.CorruptCheckpointError,
                       match=r"parts\[1\] \(manifest.part-00001.json\): the part's rows give"):
        uckpt.load(path)
    with pytest.raises(ValueError, match=r"parts\[1\] .*rows give another root"):
        reference_reader()["read_checkpoint"](str(path))


@pytest.mark.parametrize("edit, error, words", [
    (lambda d: d["part-roots:roots"].pop(), errors.ManifestError,
     r"part-roots:roots: 1 roots for 2 parts"),
    (lambda d: d["part-roots:roots"].__setitem__(0, "xxh3-128:XY"), errors.ManifestError,
     r"part-roots:roots\[0\]: expected 'xxh3-128:'"),
    (lambda d: d.pop("part-roots:roots"), errors.ManifestError,
     r"extension 'part-roots' is declared, but 'part-roots:roots' is missing"),
    (lambda d: d["extensions"].pop("part-roots"), errors.ManifestError,
     r"unknown field\(s\) 'part-roots:roots'"),
    (lambda d: d["extensions"].update({"part-roots": {"required": False}}), errors.ManifestError,
     r"extensions\['part-roots'\]: .*declared \{\"required\": true\}, not false"),
])
def test_a_malformed_declaration_or_member_is_refused_naming_it(tmp_path, edit, error, words):
    path = copy(tmp_path)
    doc = doc_of(path)
    edit(doc)
    reseal(path, doc)
    with pytest.raises(error, match=words):
        uckpt.manifest(path)
    with pytest.raises(ValueError):
        reference_reader()["read_checkpoint"](str(path))


def test_the_independent_writers_checkpoint_is_read_and_verified(tmp_path):
    expected = fw.build("part_roots", tmp_path / "c")
    got = uckpt.load(tmp_path / "c")
    assert got["layer"]["weight"].tobytes() == expected["layer/weight"].tobytes()
    assert uckpt.verify(tmp_path / "c").part_roots is not None
