"""``uckpt.open`` (issue 29 item 2): keys, shapes, dtypes and metadata without reading data;
``ck[key]`` and ``ck.slice(key)[...]`` read only the chunks they need, every one checked.

Bytes read are counted by a real blob store: the POSIX store with every read going through
its ``read_into`` (no open-file fast path), tallied per object."""
import collections
import threading

import numpy as np
import pytest

import uckpt
from uckpt.errors import ChecksumMismatchError, UnknownKeyError, UnsupportedIndexError
from uckpt.storage.blob.base import BlobReader
from uckpt.storage.blob.posix import PosixStore
from uckpt.storage.checkpoint import BlobCheckpointStore


class CountingStore(PosixStore):
    """The POSIX blob store, counting the bytes read from each object."""

    def __init__(self, root):
        super().__init__(root)
        self.read = collections.Counter()
        self._guard = threading.Lock()

    def read_into(self, key, offset, buf):
        n = super().read_into(key, offset, buf)
        with self._guard:
            self.read[key] += n
        return n

    def open_reader(self, key):
        return BlobReader(self, key)  # each range through read_into

    open_medium_reader = open_reader


def counted(root, name):
    """(blob store, checkpoint source) of checkpoint ``name`` under ``root``, counting."""
    blob = CountingStore(root)
    return blob, BlobCheckpointStore(blob, "", str(root)).source(name)


def chunks_of(path, key):
    return uckpt.manifest(path).arrays[key].chunks


def state():
    rng = np.random.default_rng(0)
    return {"model": {f"layer{i}.weight": rng.standard_normal((64, 256), dtype=np.float32)
                      for i in range(8)},
            "embed": np.arange(4096 * 16, dtype=np.float32).reshape(4096, 16),
            "opt": {"lr": 0.5, "name": "adam", "betas": [0.9, 0.99]},
            "blob": b"abc", "scalar": np.float64(2.5)}


@pytest.fixture
def saved(tmp_path):
    # embed (256 KiB) cut into 16 KiB slabs of 256 rows
    uckpt.save(tmp_path / "ck", state(), step=7, metadata={"run": "r1"},
               options=uckpt.SaveOptions(chunk_bytes=16 << 10))
    return tmp_path / "ck"


def test_open_reads_the_manifest_and_no_data(saved):
    blob, source = counted(saved.parent, "ck")
    with uckpt.open(source) as ck:
        assert sorted(ck.keys()) == sorted(
            [f"model/layer{i}.weight" for i in range(8)] + ["embed", "blob", "scalar"])
        assert ck.shape("embed") == (4096, 16) and ck.dtype("embed") == "float32"
        assert ck.shape("model/layer3.weight") == (64, 256)
        assert ck.step == 7 and ck.metadata == {"run": "r1"}
        assert ck.plain_values() == {"opt/lr": 0.5, "opt/name": "adam", "opt/betas/0": 0.9,
                                     "opt/betas/1": 0.99}
        assert "embed" in ck and len(ck) == 11
    assert dict(blob.read) == {"ck/manifest.json": (saved / "manifest.json").stat().st_size}


def test_one_array_reads_its_chunks_and_the_manifest_alone(saved):
    blob, source = counted(saved.parent, "ck")
    want = state()["model"]["layer3.weight"]
    with uckpt.open(source) as ck:
        got = ck["model/layer3.weight"]
    np.testing.assert_array_equal(got, want)
    assert got.dtype == np.float32
    stored = sum(c.length for c in chunks_of(saved, "model/layer3.weight"))
    assert stored == want.nbytes
    assert sum(blob.read.values()) == (saved / "manifest.json").stat().st_size + stored


def test_slice_reads_only_the_chunks_holding_its_rows(saved):
    chunks = chunks_of(saved, "embed")
    assert len(chunks) == 16 and all(c.shape[0] == 256 for c in chunks)
    blob, source = counted(saved.parent, "ck")
    embed = state()["embed"]
    with uckpt.open(source) as ck:
        before = sum(blob.read.values())
        np.testing.assert_array_equal(ck.slice("embed")[1000:1100], embed[1000:1100])
        # rows 768..1023 and 1024..1279: two of the 16 chunks
        assert sum(blob.read.values()) - before == chunks[3].length + chunks[4].length
        np.testing.assert_array_equal(ck.slice("embed")[1000:1030, 3:5], embed[1000:1030, 3:5])
        np.testing.assert_array_equal(ck.slice("embed")[-1], embed[-1])
        np.testing.assert_array_equal(ck.slice("embed")[5, ...], embed[5])
        np.testing.assert_array_equal(ck.slice("embed")[..., 2], embed[:, 2])
        np.testing.assert_array_equal(ck.slice("embed")[4000:9999], embed[4000:])
        assert ck.slice("embed")[10:10].shape == (0, 16)
        assert ck.get_slice("embed").get_shape() == [4096, 16]
    # rows 1000..1029 (chunks 3 and 4 again: nothing is cached), row 4095 (chunk 15), row 5
    # (chunk 0), a column of all rows (all 16 chunks), rows 4000.. (chunk 15), an empty box
    lengths = [c.length for c in chunks]
    assert sum(blob.read.values()) - before == \
        2 * (lengths[3] + lengths[4]) + lengths[15] + lengths[0] + sum(lengths) + lengths[15]


def test_values_of_other_leaf_kinds(saved):
    with uckpt.open(saved) as ck:
        assert ck["blob"].tobytes() == b"abc"
        assert ck["scalar"].shape == () and ck["scalar"][()] == 2.5
        assert ck.slice("scalar")[...][()] == 2.5


def test_a_tied_array_is_listed_once_and_read_by_either_path(tmp_path):
    shared = np.arange(12, dtype=np.float32).reshape(3, 4)
    uckpt.save(tmp_path / "ck", {"embed": shared, "decoder": shared})
    with uckpt.open(tmp_path / "ck") as ck:
        assert ck.keys() == ["embed"] and "decoder" in ck
        np.testing.assert_array_equal(ck["decoder"], shared)
        np.testing.assert_array_equal(ck.slice("decoder")[1], shared[1])


def damage(path, key, index):
    """Flip one byte inside chunk ``index`` of array ``key``."""
    chunk = chunks_of(path, key)[index]
    data = path / chunk.file
    raw = bytearray(data.read_bytes())
    raw[chunk.offset + chunk.length // 2] ^= 0xFF
    data.write_bytes(bytes(raw))


def test_damage_outside_the_selection_does_not_stop_a_read_inside_it_raises(saved):
    damage(saved, "embed", 3)  # rows 768..1023
    embed = state()["embed"]
    with uckpt.open(saved) as ck:
        np.testing.assert_array_equal(ck["model/layer0.weight"],
                                      state()["model"]["layer0.weight"])
        np.testing.assert_array_equal(ck.slice("embed")[0:768], embed[:768])
        np.testing.assert_array_equal(ck.slice("embed")[1024:2000], embed[1024:2000])
        with pytest.raises(ChecksumMismatchError, match=r"checksum mismatch in leaf 'embed'"):
            ck.slice("embed")[1000:1001]
        with pytest.raises(ChecksumMismatchError, match=r"leaf 'embed'"):
            ck["embed"]


def test_compressed_and_incremental_checkpoints(tmp_path):
    a = state()
    options = uckpt.SaveOptions(incremental_chunk_bytes=16 << 10, compression="zstd")
    uckpt.save(tmp_path / "base", a, incremental=True, options=options)
    b = state()
    b["embed"][2048:2100] += 1  # one slab of embed changes; the rest refers to the base
    uckpt.save(tmp_path / "next", b, base=tmp_path / "base", options=options)
    chunks = chunks_of(tmp_path / "next", "embed")
    assert any(c.base for c in chunks) and not all(c.base for c in chunks)
    assert any(c.codec for c in chunks_of(tmp_path / "base", "embed"))
    blob, source = counted(tmp_path, "next")
    with uckpt.open(source) as ck:
        np.testing.assert_array_equal(ck.slice("embed")[2040:2110], b["embed"][2040:2110])
        np.testing.assert_array_equal(ck["embed"], b["embed"])
        np.testing.assert_array_equal(ck["model/layer5.weight"], b["model"]["layer5.weight"])
    assert any(k.startswith("base/") for k in blob.read)  # chunks read through the base


def test_s3_checkpoint(s3_server, s3_bucket):
    url = f"s3://{s3_bucket}/lazy/ck"
    uckpt.save(url, state(), storage_options=s3_server.storage_options,
               options=uckpt.SaveOptions(chunk_bytes=16 << 10))
    with uckpt.open(url, storage_options=s3_server.storage_options) as ck:
        assert ck.shape("embed") == (4096, 16)
        np.testing.assert_array_equal(ck.slice("embed")[300:600], state()["embed"][300:600])
        np.testing.assert_array_equal(ck["model/layer1.weight"],
                                      state()["model"]["layer1.weight"])


def test_missing_key_names_it_and_the_nearest(saved):
    with uckpt.open(saved) as ck:
        with pytest.raises(UnknownKeyError, match=r"array 'model/layer3.weigth' names no leaf"
                                                   r".*nearest: 'model/layer3.weight'") as e:
            ck["model/layer3.weigth"]
        assert isinstance(e.value, KeyError)
        with pytest.raises(KeyError, match="'nope'"):
            ck.shape("nope")


@pytest.mark.parametrize("index, words", [
    (np.s_[::2], "step 2 in dimension 0"),
    (np.s_[None], "NoneType in dimension 0"),
    (np.s_[[1, 2]], "list in dimension 0"),
    (np.s_[1, 2, 3], "3 indices for an array of 2 dimension"),
    (np.s_[4096], "index 4096 is out of range for dimension 0 of size 4096"),
    (np.s_[..., ...], "single ellipsis"),
])
def test_unsupported_index_is_refused(saved, index, words):
    with uckpt.open(saved) as ck:
        with pytest.raises(UnsupportedIndexError, match=words) as e:
            ck.slice("embed")[index]
        assert isinstance(e.value, IndexError) and "step-1 slices" in str(e.value)


def test_one_tensor_of_a_2gb_checkpoint_reads_its_chunks_and_the_manifest(tmp_path):
    """The acceptance's case at its size (slow: 2 GiB written): 16 arrays of 128 MiB."""
    big = {f"layer{i}": np.full((1 << 15, 1 << 10), i, dtype=np.float32) for i in range(16)}
    uckpt.save(tmp_path / "ck", big)
    del big
    blob, source = counted(tmp_path, "ck")
    with uckpt.open(source) as ck:
        got = ck["layer9"]
    assert got.shape == (1 << 15, 1 << 10) and (got == 9).all()
    stored = sum(c.length for c in chunks_of(tmp_path / "ck", "layer9"))
    assert stored == got.nbytes
    assert sum(blob.read.values()) == (tmp_path / "ck" / "manifest.json").stat().st_size + stored
