"""The lazy reader of a split manifest (issue 27): ``open_checkpoint`` reads the root
manifest alone, and a leaf's read reads only the manifest parts that hold that array.

A real checkpoint of four thread ranks (:func:`uckpt.testing.run_ranks`) in which the
parts of ranks 2 and 3 hold rows of ``w`` alone; what was read is shown by the part files
a read needs (removed or damaged ones) and the reader's own INFO record.
"""
from __future__ import annotations

import logging
import shutil

import numpy as np
import pytest

import uckpt
from uckpt import errors
from uckpt.conversion import open_checkpoint
from uckpt.testing import run_ranks

W = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
X = np.arange(8 * 2, dtype=np.int64).reshape(8, 2) * 5  # rows on ranks 0 and 1 only
BIAS = np.linspace(0, 1, 5, dtype=np.float32)  # replicated: its rows are in the root
MISSING = "the manifest part listed in the root manifest is missing"


def shards(rank: int):
    lo = (rank * 4, rank * 4 + 4) if rank < 2 else (8, 8)
    return {"w": uckpt.Shard(W[2 * rank:2 * rank + 2].copy(), W.shape, (2 * rank, 0)),
            "x": uckpt.Shard(X[lo[0]:lo[1]].copy(), X.shape, (lo[0], 0)),
            "bias": BIAS.copy()}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("lazy") / "c"
    for outcome in run_ranks(4, lambda c: uckpt.save(path, shards(c.rank), comm=c)):
        assert not isinstance(outcome, BaseException), outcome
    return path


@pytest.fixture
def ckpt(saved, tmp_path):
    """A copy of the saved checkpoint, for a test to damage."""
    return shutil.copytree(saved, tmp_path / "c")


def test_the_checkpoint_is_split_as_the_tests_expect(ckpt):
    parts = uckpt.manifest(ckpt).parts
    assert [p.file for p in parts] == [f"manifest.part-0000{r}.json" for r in range(4)]


def test_opening_reads_the_root_alone(ckpt):
    for part in ckpt.glob("manifest.part-*.json"):
        part.unlink()
    with open_checkpoint(ckpt) as tree:  # no part is needed to open
        assert {k: (leaf.dtype, leaf.shape) for k, leaf in tree.root.items()} == {
            "w": ("float32", (8, 3)), "x": ("int64", (8, 2)), "bias": ("float32", (5,))}
        np.testing.assert_array_equal(tree.root["bias"].read(), BIAS)  # in the root
        with pytest.raises(errors.CorruptCheckpointError,
                           match=r"manifest\.part-0000[01]\.json: " + MISSING):
            tree.root["x"].read()


def test_a_leaf_reads_only_the_parts_holding_it(ckpt, caplog):
    for rank in (2, 3):
        (ckpt / f"manifest.part-0000{rank}.json").unlink()
    caplog.set_level(logging.INFO, logger="uckpt.loading.reader")
    with open_checkpoint(ckpt) as tree:
        np.testing.assert_array_equal(tree.root["x"].read(), X)
        assert "an on-demand reader read 2 of 4 manifest part(s)" in caplog.text
        with pytest.raises(errors.CorruptCheckpointError,
                           match=r"manifest\.part-0000[23]\.json: " + MISSING):
            tree.root["w"].read()


def test_every_leaf_is_what_load_reads(saved):
    loaded = uckpt.load(saved)
    with open_checkpoint(saved) as tree:
        assert sorted(tree.root) == sorted(loaded) == ["bias", "w", "x"]
        for name, leaf in tree.root.items():
            got = leaf.read()
            assert got.dtype == loaded[name].dtype and got.tobytes() == loaded[name].tobytes()


def test_a_damaged_part_is_named_by_the_leaf_that_needs_it(ckpt):
    part = ckpt / "manifest.part-00002.json"
    data = bytearray(part.read_bytes())
    data[40] ^= 1
    part.write_bytes(bytes(data))
    with open_checkpoint(ckpt) as tree:
        np.testing.assert_array_equal(tree.root["x"].read(), X)  # part 2 does not hold it
        with pytest.raises(errors.CorruptCheckpointError,
                           match=r"parts\[2\] \(manifest\.part-00002\.json\): the part holds"):
            tree.root["w"].read()


def test_streaming_a_leaf_of_a_split_checkpoint(ckpt):
    with open_checkpoint(ckpt, streaming=True) as tree:
        assert b"".join(b.tobytes() for b in tree.root["w"].blocks(20)) == W.tobytes()
    (ckpt / "manifest.part-00003.json").unlink()
    with open_checkpoint(ckpt, streaming=True) as tree:
        assert b"".join(b.tobytes() for b in tree.root["x"].blocks(24)) == X.tobytes()
        with pytest.raises(errors.CorruptCheckpointError,
                           match=r"manifest\.part-00003\.json: " + MISSING):
            list(tree.root["w"].blocks(20))
