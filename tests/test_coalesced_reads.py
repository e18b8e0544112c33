"""Loads read adjacent chunks of a data file together (uckpt.loading.readruns): one vectored read
into the arrays' own memory, then each chunk's checksum. Every byte is still checked, and
a damaged or cut file still names the leaf and the offset."""
import os

import numpy as np
import pytest

import uckpt
from uckpt import errors
from uckpt.storage import fsutil
from uckpt.loading import reader as reader_mod
from uckpt.loading.reader import CheckpointReader
from uckpt.loading.readruns import MAX_READS, plan_runs, split_whole
from conftest import flip_byte


def small_state(n=40):
    rng = np.random.default_rng(0)
    state = {f"t{i:03d}": rng.standard_normal((i % 7 + 1, 5)).astype(np.float32)
             for i in range(n)}
    state["big"] = np.arange(3 << 18, dtype=np.float64).reshape(-1, 1024)  # 6 MiB, streamed
    state["scalar"] = np.float32(3.5)
    state["empty"] = np.zeros((0, 4), dtype=np.int16)
    return state


def by_offset(manifest):
    return sorted(((c.offset, path) for path, e in manifest.arrays.items() for c in e.chunks
                   if c.length), key=lambda x: x[0])


def test_runs_group_adjacent_small_chunks(tmp_path):
    path = uckpt.save(tmp_path / "ck", small_state())
    m = uckpt.manifest(path)
    reads = []
    for e in m.arrays.values():
        whole, rest = split_whole(e, np.empty(e.shape, e.dtype if e.dtype != "bfloat16" else
                                              np.uint16), [c for c in e.chunks if all(c.shape)])
        assert rest == []
        reads.extend(whole)
    runs = plan_runs(reads, 1 << 20)
    sizes = [len(r) for r in runs]
    assert max(sizes) > 10  # the small arrays share a run
    assert sum(sizes) == len(reads)
    for run in runs:  # a run is in file order, its reads within MAX_GAP of each other
        offsets = [p.offset for p in run]
        assert offsets == sorted(offsets) and len(run) <= MAX_READS
        if len(run) > 1:
            assert sum(p.chunk.length for p in run) <= 1 << 20
    big = [r for r in runs if r[0].entry.path == "big"]
    assert len(big) == 1 and len(big[0]) == 1  # larger than a block: a run of its own


def test_load_into_place_and_allocating_match(tmp_path):
    state = small_state()
    path = uckpt.save(tmp_path / "ck", state)
    fresh = uckpt.load(path)
    target = {k: np.zeros_like(v) if isinstance(v, np.ndarray) else v for k, v in state.items()}
    views = {k: v for k, v in target.items() if isinstance(v, np.ndarray)}
    uckpt.load(path, target)
    for k, v in state.items():
        np.testing.assert_array_equal(fresh[k], v)
        np.testing.assert_array_equal(target[k], v)
        if k in views:  # read into the array itself
            assert target[k] is views[k]


def test_flipped_byte_in_the_middle_of_a_run_names_its_leaf(tmp_path):
    path = uckpt.save(tmp_path / "ck", small_state())
    m = uckpt.manifest(path)
    offset, leaf = by_offset(m)[5]  # a small array with neighbours on both sides
    assert leaf.startswith("t")
    flip_byte(path / "data-00000.bin", offset + 1)
    for target in (None, {k: np.zeros_like(v) if isinstance(v, np.ndarray) else v
                          for k, v in small_state().items()}):
        with pytest.raises(errors.ChecksumMismatchError) as ei:
            uckpt.load(path, target)
        assert ei.value.leaf == leaf and ei.value.offset == offset
        assert f"leaf {leaf!r}" in str(ei.value) and "data-00000.bin" in str(ei.value)


def test_file_cut_after_its_size_was_checked_names_the_leaf(tmp_path):
    """A file that shrinks between the size check and the read: the vectored read comes
    back short, and the chunks are read again one by one to tell which leaf is cut."""
    state = {k: v for k, v in small_state().items() if k.startswith("t")}  # one run
    path = uckpt.save(tmp_path / "ck", state)
    m = uckpt.manifest(path)
    offset, leaf = by_offset(m)[-1]  # the last array: the only one cut
    data = path / "data-00000.bin"
    with CheckpointReader(path) as reader:
        reader.open_files(["data-00000.bin"])  # sizes checked now
        os.truncate(data, offset + 2)
        with pytest.raises(errors.TruncatedDataError) as ei:
            reader.read_arrays({p: None for p in m.arrays})
    assert ei.value.leaf == leaf and ei.value.offset == offset + 2
    assert "the file ends at" in str(ei.value)


def test_compressed_and_partial_chunks_still_load(tmp_path):
    """Chunks read in no run (compressed; rows of a box) load on their own,
    beside the runs of the others."""
    state = small_state(12)
    state["rows"] = np.arange(16 * 1024, dtype=np.int32).reshape(64, 256)  # 4 chunks
    small = uckpt.SaveOptions(chunk_bytes=4096)
    path = uckpt.save(tmp_path / "ck", state, options=small)
    assert len(uckpt.manifest(path).arrays["rows"].chunks) > 1
    box = np.zeros((10, 256), dtype=np.int32)
    with CheckpointReader(path) as reader:
        got = reader.read_arrays({"rows": uckpt.Shard(box, (64, 256), (30, 0)), "t001": None})
    np.testing.assert_array_equal(box, state["rows"][30:40])
    np.testing.assert_array_equal(got["t001"], state["t001"])
    zpath = uckpt.save(tmp_path / "z", state,
                       options=uckpt.SaveOptions(chunk_bytes=4096, compression="zstd"))
    out = uckpt.load(zpath)
    for k, v in state.items():
        np.testing.assert_array_equal(out[k], v)


def test_preadv_into_fills_many_buffers_and_stops_at_eof(tmp_path):
    data = np.random.default_rng(1).integers(0, 256, 5000, dtype=np.uint8)
    f = tmp_path / "f"
    f.write_bytes(data.tobytes())
    n = fsutil.IOV_MAX + 300  # more buffers than one preadv takes
    bufs = [np.empty(3, np.uint8) for _ in range(n)] + [bytearray(0), np.empty(7, np.uint8)]
    fd = os.open(f, os.O_RDONLY)
    try:
        assert fsutil.preadv_into(fd, bufs, 11) == 3 * n + 7
        np.testing.assert_array_equal(np.concatenate([np.asarray(b, np.uint8) for b in bufs]),
                                      data[11:11 + 3 * n + 7])
        tail = [np.empty(40, np.uint8), np.empty(40, np.uint8)]
        assert fsutil.preadv_into(fd, tail, 4950) == 50  # short only where the file ends
        np.testing.assert_array_equal(np.concatenate(tail)[:50], data[4950:])
    finally:
        os.close(fd)


@pytest.mark.parametrize("arena", [256, reader_mod.ARENA_BYTES])
def test_allocating_load_carves_arrays_from_few_regions(tmp_path, monkeypatch, arena):
    """An allocating load's arrays share a few allocations (each array 64-byte aligned,
    none overlapping another); values, dtypes and shapes are the saved ones."""
    monkeypatch.setattr(reader_mod, "ARENA_BYTES", arena)
    state = small_state(20)
    state["flag"] = np.array([True, False, True])
    path = uckpt.save(tmp_path / "ck", state)
    out = uckpt.load(path)
    arrays = [v for v in out.values() if isinstance(v, np.ndarray)]
    for k, v in state.items():
        np.testing.assert_array_equal(out[k], v)
        assert np.asarray(out[k]).dtype == np.asarray(v).dtype
    spans = sorted((a.ctypes.data, a.ctypes.data + a.nbytes) for a in arrays if a.nbytes)
    assert all(lo % 64 == 0 for lo, _ in spans)
    assert all(hi <= lo for (_, hi), (lo, _) in zip(spans, spans[1:]))  # no overlap
    regions = {id(a.base) for a in arrays if a.base is not None}
    assert 1 <= len(regions) <= (len(arrays) if arena == 256 else 2)
    out["t000"][...] = 0  # writable, and writing one array leaves the others alone
    np.testing.assert_array_equal(out["t001"], state["t001"])


def test_pwritev_all_writes_more_buffers_than_one_call_takes(tmp_path):
    rng = np.random.default_rng(2)
    n = fsutil.IOV_MAX + 300
    bufs = [bytearray(0)] + [rng.integers(0, 256, 3, dtype=np.uint8) for _ in range(n)] + \
        [memoryview(b"tail"), bytearray(0)]
    f = tmp_path / "f"
    f.write_bytes(b"x" * 5)
    fd = os.open(f, os.O_RDWR)
    try:
        fsutil.pwritev_all(fd, bufs, 5)
        got = bytearray(3 * n + 4)
        assert fsutil.pread_into(fd, got, 5) == len(got)
    finally:
        os.close(fd)
    want = b"".join(bytes(np.asarray(b, np.uint8)) if not isinstance(b, memoryview) else bytes(b)
                    for b in bufs)
    assert bytes(got) == want and f.read_bytes()[:5] == b"xxxxx"
