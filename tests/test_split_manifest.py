"""A manifest no rank holds whole (issue 27): each rank writes its own part, a load reads
the root and only the parts that cover what it loads (docs/format.md sections 7, 13.1).

Thread ranks (:func:`uckpt.testing.run_ranks`) stand in for ranks; which parts a load
read is the reader's own accounting (its INFO record, ``CheckpointReader.parts_read``).
"""
from __future__ import annotations

import json
import logging
import re
import shutil

import numpy as np
import pytest

import uckpt
from uckpt import errors
from uckpt.codecs import hashing
from uckpt.format import encode_manifest_files
from uckpt.format.rows import made
from uckpt.loading.reader import CheckpointReader
from uckpt.testing import run_ranks

from spec_doc import reference_reader
from test_format import validator10  # noqa: F401 - a fixture

ROWS, COLS = 48, 8
FULL = {"w": np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS),
        "v": np.arange(ROWS * 3, dtype=np.int64).reshape(ROWS, 3) * 7}
BIAS = np.linspace(0, 1, 5, dtype=np.float32)  # replicated: every rank holds it whole


def shards(rank, world, zeros=False):
    """FSDP-style: rank ``rank``'s rows of each array, plus the replicated bias."""
    lo, hi = rank * ROWS // world, (rank + 1) * ROWS // world
    out = {k: uckpt.Shard(np.zeros_like(a[lo:hi]) if zeros else a[lo:hi].copy(), a.shape,
                          (lo, 0)) for k, a in FULL.items()}
    out["bias"] = np.zeros_like(BIAS) if zeros else BIAS.copy()
    return out


def save(path, world, **kw):
    outcomes = run_ranks(world, lambda c: uckpt.save(path, shards(c.rank, world), comm=c, **kw))
    for outcome in outcomes:
        assert not isinstance(outcome, BaseException), outcome
    return path


def load(path, world):
    """Load on ``world`` thread ranks; returns (each rank's state, parts each read)."""
    def job(c):
        state = shards(c.rank, world, zeros=True)
        uckpt.load(path, state, comm=c)
        return state
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())
    handler = Keep(logging.INFO)
    logger = logging.getLogger("uckpt.loading.reader")
    old = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        states = run_ranks(world, job)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
    read = {}
    for msg in records:
        m = re.match(r"rank (\d+) of \d+ read (\d+) of (\d+) manifest part", msg)
        if m:
            read[int(m.group(1))] = int(m.group(2))
    return states, read


def check(states, world):
    for rank, state in enumerate(states):
        assert not isinstance(state, BaseException), state
        want = shards(rank, world)
        for k in FULL:
            np.testing.assert_array_equal(state[k].array, want[k].array)
        np.testing.assert_array_equal(state["bias"], BIAS)


def root_doc(path):
    return json.loads((path / "manifest.json").read_bytes())


def test_each_rank_writes_its_own_part_and_the_root_holds_the_replicated_rows(tmp_path,
                                                                             validator10):  # noqa: F811
    path = save(tmp_path / "c", 3)
    doc = root_doc(path)
    assert doc["extensions"] == {"part-ranks": {"required": False},
                                 "part-roots": {"required": True}}
    assert doc["part-ranks:ranks"] == [0, 1, 2]
    assert len(doc["part-roots:roots"]) == 3  # each rank sent its part's root (section 13.2)
    assert [p["file"] for p in doc["parts"]] == [f"manifest.part-0000{r}.json" for r in range(3)]
    assert doc["chunks"]["count"] == 1  # the bias, written whole by one rank
    for rank, entry in enumerate(doc["parts"]):
        part = json.loads((path / entry["file"]).read_bytes())
        assert part["chunks"]["sources"] == [[None, f"data-0000{rank}.bin"]]  # its own rows
        assert part["chunks"]["count"] == 2 and entry["arrays"] == [[1, 2]]  # w and v
    m = uckpt.verify(path)  # every part read, sizes, CRC-32Cs, tiling and Merkle root checked
    assert m.merkle_root == doc["merkle_root"]
    again, parts = encode_manifest_files(m)  # the whole-manifest writer: 11.3's root
    whole_root = hashing.checkpoint_root({p: a.merkle_root() for p, a in m.arrays.items()})
    assert json.loads(again)["merkle_root"] == hashing.format_hash(whole_root)
    assert len(parts) == 3
    whole = uckpt.load(path)
    _, ref = reference_reader()["read_checkpoint"](str(path))  # docs/format.md section 17
    for k, a in FULL.items():
        np.testing.assert_array_equal(whole[k], a)
        assert ref[k].tobytes() == a.tobytes()
    validator10.validate(doc)
    for entry in doc["parts"]:
        validator10.validate(json.loads((path / entry["file"]).read_bytes()))


def test_a_replicated_save_is_a_root_alone(tmp_path):
    state = {"a": np.arange(10.0), "b": np.ones((3, 3), np.float32)}
    path = tmp_path / "c"
    for outcome in run_ranks(2, lambda c: uckpt.save(path, state, comm=c)):
        assert not isinstance(outcome, BaseException), outcome
    doc = root_doc(path)
    assert doc["parts"] == [] and doc["extensions"] == {} and doc["chunks"]["count"] == 2
    assert sorted(p.name for p in path.iterdir()) == ["data-00000.bin", "data-00001.bin",
                                                      "manifest.json"]


def test_a_load_on_the_same_world_reads_only_its_own_part(tmp_path):
    path = save(tmp_path / "c", 4)
    states, read = load(path, 4)
    check(states, 4)
    assert read == {0: 1, 1: 1, 2: 1, 3: 1}
    with CheckpointReader(path, rank=(2, 4)) as reader:  # the reader's own accounting
        box = np.zeros((12, COLS), np.float32)
        reader.read_arrays({"w": uckpt.Shard(box, FULL["w"].shape, (24, 0)), "bias": None})
        assert reader.parts_read == ["manifest.part-00002.json"]
        np.testing.assert_array_equal(box, FULL["w"][24:36])
        reader.read_arrays({"bias": None})  # replicated: in the root, no part needed
        assert reader.parts_read == ["manifest.part-00002.json"]


@pytest.mark.parametrize("written, loaders, most", [(4, 2, 2), (4, 3, 2), (2, 3, 2), (3, 1, 3)])
def test_resharding_reads_the_parts_that_cover_each_box(tmp_path, written, loaders, most):
    path = save(tmp_path / "c", written)
    states, read = load(path, loaders)
    check(states, loaders)
    assert set(read) == set(range(loaders)) and max(read.values()) <= most, read


def test_a_missing_part_is_named(tmp_path):
    path = save(tmp_path / "c", 3)
    (path / "manifest.part-00001.json").unlink()
    with pytest.raises(errors.CorruptCheckpointError, match=r"manifest\.part-00001\.json: the "
                       "manifest part listed in the root manifest is missing"):
        uckpt.load(path)
    states, _ = load(path, 3)  # only rank 1 needs it; every rank raises, naming it
    for outcome in states:
        assert isinstance(outcome, errors.DistributedError), outcome
        assert "rank 1: uckpt.errors.CorruptCheckpointError" in str(outcome)
        assert "manifest.part-00001.json" in str(outcome)


def test_a_damaged_part_is_named(tmp_path):
    path = save(tmp_path / "c", 3)
    part = path / "manifest.part-00002.json"
    data = bytearray(part.read_bytes())
    data[40] ^= 1
    part.write_bytes(bytes(data))
    with pytest.raises(errors.CorruptCheckpointError,
                       match=r"parts\[2\] \(manifest\.part-00002\.json\): the part holds .* "
                             "but the root lists"):
        uckpt.load(path)


def test_a_part_of_another_save_is_refused(tmp_path):
    path = save(tmp_path / "c", 3)
    other = tmp_path / "d"
    outcomes = run_ranks(3, lambda c: uckpt.save(other, {k: (uckpt.Shard(v.array + 1, v.global_shape, v.offsets) if isinstance(v, uckpt.Shard) else v) for k, v in shards(c.rank, 3).items()}, comm=c))  # noqa: E501
    assert not any(isinstance(o, BaseException) for o in outcomes), outcomes
    shutil.copyfile(other / "manifest.part-00000.json", path / "manifest.part-00000.json")
    states, _ = load(path, 3)
    for outcome in states:
        assert isinstance(outcome, errors.DistributedError), outcome
        assert re.search(r"rank 0: uckpt\.errors\.CorruptCheckpointError: .*parts\[0\] "
                         r"\(manifest\.part-00000\.json\): .*another save", str(outcome))


def test_node_local_replicas_each_get_every_part(tmp_path):
    """Two "nodes" (a directory each, ranks 0-1 and 2-3): each replica's root lists every
    part, so each holds every part (exchanged only because the replicas differ)."""
    def where(rank):
        return tmp_path / f"node{rank // 2}" / "c"
    outcomes = run_ranks(4, lambda c: uckpt.save(where(c.rank), shards(c.rank, 4), comm=c))
    assert not any(isinstance(o, BaseException) for o in outcomes), outcomes
    for node in range(2):
        d = tmp_path / f"node{node}" / "c"
        assert sorted(p.name for p in d.glob("manifest.part-*.json")) == [
            f"manifest.part-0000{r}.json" for r in range(4)]
        m = uckpt.manifest(d)  # every part read and checked against the root
        assert not m.parts_pending and len(m.arrays["w"].chunks) == 4

    def job(c):
        state = shards(c.rank, 4, zeros=True)
        del state["bias"]  # (held by one node only: node-local storage without redundancy)
        uckpt.load(where(c.rank), state, comm=c, strict=False)
        return state
    for rank, state in enumerate(run_ranks(4, job)):
        assert not isinstance(state, BaseException), state
        np.testing.assert_array_equal(state["w"].array, shards(rank, 4)["w"].array)


@pytest.mark.parametrize("bad, message", [
    ([0, 1], "2 ranks for 3 parts"), ([0, 1, 5], r"part-ranks:ranks\[2\].*rank 5 of a world of 3"),
    ([0, 1, 1], "a rank is listed twice"), ("0", "expected"),
])
def test_a_bad_part_ranks_member_is_refused(tmp_path, bad, message):
    from grid_listing import sealed

    path = save(tmp_path / "c", 3)
    doc = root_doc(path)
    doc["part-ranks:ranks"] = bad
    (path / "manifest.json").write_bytes(sealed(doc))
    with pytest.raises(errors.ManifestError, match=message):
        uckpt.manifest(path)


def test_chunks_made_together_equal_those_made_one_array_at_a_time(tmp_path):
    """rows.made (a load's plan makes the chunks of the arrays it reads whole together)
    gives each array's chunks as iterating it does: rows in the root and in parts (several
    tables per array), arrays of one chunk, and one of none."""
    path = save(tmp_path / "c", 3)
    m = uckpt.manifest(path)
    seqs = [a.chunks for a in m.arrays.values()]
    assert sorted(len(s) for s in seqs) == [1, 3, 3]  # "w", "v": a row per part
    assert made(seqs) == [list(s) for s in seqs]
    assert made(seqs[::-1]) == [list(s) for s in seqs[::-1]]
    uckpt.save(tmp_path / "d", {"e": np.zeros((0, 4), np.float32),
                                "m": np.arange(3000, dtype=np.int64).reshape(1000, 3)},
               options=uckpt.SaveOptions(chunk_bytes=4096, alignment=64))
    seqs = [a.chunks for a in uckpt.manifest(tmp_path / "d").arrays.values()]
    assert sorted(len(s) for s in seqs)[-1] > 1
    assert made(seqs) == [list(s) for s in seqs]
    assert made([seqs[-1], (), seqs[0]]) == [list(seqs[-1]), [], list(seqs[0])]
