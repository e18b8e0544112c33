"""The pipeline of compressed saves (uckpt.saving.writer, uckpt.saving.encode_memory, uckpt.runtime.parallel):
byte planes, reused encoder memory, encoding ahead by bytes, and data files streamed
through a page-aligned buffer with O_DIRECT. Files are real, under tmp_path."""
import threading
import time

import ml_dtypes
import numpy as np
import pytest
import zstandard

import uckpt
import uckpt.knobs as knobs
from uckpt.codecs import pipeline as codecs
from uckpt.storage.blob import posix_io
from uckpt.saving.encode_memory import POOLED_BYTES, EncodeMemory
from uckpt.runtime.parallel import ordered_map

RNG = np.random.default_rng(7)


# --- byte planes --------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.int64,
                                   np.complex64, np.complex128, np.dtype(">f4")])
@pytest.mark.parametrize("count", [1, 3, codecs._GROUP_BLOCK - 1, codecs._GROUP_BLOCK + 5])
def test_byte_planes_are_the_transposed_bytes(dtype, count):
    raw = (RNG.standard_normal(count) * 100).astype(dtype).view(np.uint8).reshape(-1)
    itemsize = np.dtype(dtype).itemsize
    want = raw.reshape(-1, itemsize).T.reshape(-1)
    assert np.array_equal(codecs.group_bytes(raw, itemsize), want)
    out = np.full(raw.nbytes + 50, 9, dtype=np.uint8)
    planes = codecs.group_bytes(raw, itemsize, out)
    assert np.shares_memory(planes, out) and np.array_equal(planes, want)
    assert (out[raw.nbytes:] == 9).all()  # nothing written past the planes


@pytest.mark.parametrize("pooled", [False, True])
def test_plane_frames_are_plain_zstandard_frames(pooled):
    """Whatever the hash table and the memory, a frame is a Zstandard frame of the
    planes that declares their size and decodes with a default decoder."""
    raw = RNG.standard_normal(100_000).astype(np.float32).view(np.uint8)
    memory = EncodeMemory(pool=pooled)
    codec, stored = codecs.encode(codecs.Compression(), raw, 4, 0, memory)
    assert codec == codecs.BYTEGROUP and len(stored) < raw.nbytes
    frame = bytes(stored)
    assert zstandard.get_frame_parameters(frame).content_size == raw.nbytes
    planes = zstandard.ZstdDecompressor().decompress(frame)
    assert planes == raw.reshape(-1, 4).T.tobytes()
    plain = codecs.encode(codecs.Compression(), raw, 4)[1]  # no memory: same frame
    assert bytes(plain) == frame


def test_incompressible_chunk_into_pooled_memory_is_raw():
    raw = RNG.integers(0, 256, 200_000, dtype=np.uint8)
    memory = EncodeMemory()
    codec, stored = codecs.encode(codecs.Compression(), raw, 1, 0, memory)
    assert codec == codecs.RAW and stored is raw
    assert [len(free) for free in memory._free.values()] == [1]  # its buffer went back
    assert memory._lent == {}


# --- encoder memory -----------------------------------------------------------------------------
def test_encode_memory_lends_and_reuses_buffers():
    memory = EncodeMemory()
    a = memory.take(POOLED_BYTES * 3)
    assert a.nbytes == POOLED_BYTES * 3 and a.dtype == np.uint8
    memory.give(a[:100])  # a view of it gives it back
    b = memory.take(POOLED_BYTES * 3 + 1)  # the same size class: the same memory
    assert np.shares_memory(a, b)
    memory.give(np.empty(POOLED_BYTES * 4, dtype=np.uint8))  # not lent: ignored
    memory.give(b"bytes")
    assert not any(memory._free.values())
    assert memory.take(POOLED_BYTES - 1) is None  # small: made anew by the caller
    assert EncodeMemory(pool=False).take(POOLED_BYTES * 8) is None
    s = memory.scratch(1000)
    assert memory.scratch(500) is s and memory.scratch(5000).nbytes >= 5000
    other = []
    t = threading.Thread(target=lambda: other.append(memory.scratch(10)))
    t.start()
    t.join()
    assert not np.shares_memory(other[0], memory.scratch(10))  # per thread


def test_compressed_save_through_reused_buffers_round_trips(tmp_path, monkeypatch):
    """Many chunks share a few frame buffers and a small stream buffer: every chunk
    still holds its own bytes."""
    monkeypatch.setattr(knobs, "stream_buffer_bytes", 3 * 4096)
    monkeypatch.setattr(knobs, "compress_ahead_bytes", 1 << 20)
    state = {"w": RNG.standard_normal((512, 1024)).astype(np.float32),
             "h": RNG.standard_normal((300, 700)).astype(ml_dtypes.bfloat16),
             "noise": RNG.integers(0, 256, 700_000, dtype=np.uint8),
             "ids": np.arange(100_000, dtype=np.int64), "b": np.ones(3, dtype=np.float32)}
    path = uckpt.save(tmp_path / "c", state,
                      options=uckpt.SaveOptions(chunk_bytes=96 << 10, compression="zstd"))
    chunks = uckpt.manifest(path).arrays
    assert len(chunks["w"].chunks) > 10
    assert {c.codec for c in chunks["noise"].chunks} == {()}
    out = uckpt.load(path)
    for k, v in state.items():
        assert out[k].tobytes() == v.tobytes(), k
    uckpt.verify(path)


def test_split_only_for_a_large_share_of_the_file(tmp_path, monkeypatch):
    """A chunk is compressed on Zstandard's own threads too only when it is more than
    1 / compress_threads of its file; the frames load either way."""
    monkeypatch.setattr(knobs, "compress_split_bytes", 64 << 10)
    monkeypatch.setattr(knobs, "compress_threads", 2)
    seen = []
    encode = codecs.encode

    def spy(compression, raw, itemsize, threads=0, memory=None):
        seen.append((raw.nbytes, threads))
        return encode(compression, raw, itemsize, threads, memory)

    monkeypatch.setattr(codecs, "encode", spy)
    big = RNG.standard_normal(300_000).astype(np.float32)
    small = RNG.standard_normal(40_000).astype(np.float32)
    path = uckpt.save(tmp_path / "c", {"big": big, "small": small}, compression="zstd")
    assert dict(seen) == {big.nbytes: 2, small.nbytes: 0}
    out = uckpt.load(path)
    assert out["big"].tobytes() == big.tobytes() and out["small"].tobytes() == small.tobytes()


# --- encoding ahead -----------------------------------------------------------------------------
def test_ordered_map_goes_further_ahead_for_small_items():
    """Small items are encoded up to ahead_bytes ahead, large ones window at most."""
    lock, started, consumed, ahead = threading.Lock(), [0], [0], []
    sizes = [10] * 40 + [1000] * 20

    def fn(i):
        with lock:
            started[0] += 1
            ahead.append((i, started[0] - consumed[0]))
        return i

    out = []
    for value in ordered_map(fn, list(range(60)), threads=3, window=2, sizes=sizes,
                             ahead_bytes=100):
        time.sleep(0.002)  # a slow consumer: the threads run ahead as far as allowed
        out.append(value)
        with lock:
            consumed[0] += 1
    assert out == list(range(60))
    assert max(n for i, n in ahead if i < 30) > 2  # small ones: beyond the window
    assert max(n for i, n in ahead if i < 30) <= 11  # ... by ahead_bytes (10 of 10)
    assert max(n for i, n in ahead if i >= 45) <= 3  # large ones: the window (+1: the
    # consumer counts what it took a little after ordered_map does)


# --- streamed data files ------------------------------------------------------------------------
def test_stream_writes_gaps_as_zeros_and_pieces_of_any_size(tmp_path, monkeypatch):
    """Pieces smaller and larger than the buffer, at unaligned offsets with gaps: the
    file holds them and zeros; each piece's memory may be reused once the next is
    taken (it was copied)."""
    monkeypatch.setattr(knobs, "stream_buffer_bytes", 2 * 4096)
    places, end = [], 0
    for n, gap in [(10, 0), (5000, 3), (30_000, 61), (1, 0), (4096, 4096 * 3 + 7), (9000, 1)]:
        places.append((end + gap, RNG.integers(1, 256, n, dtype=np.uint8)))
        end = end + gap + n
    want = np.zeros(end, dtype=np.uint8)
    for offset, data in places:
        want[offset:offset + len(data)] = data

    def pieces():
        for offset, data in places:
            buf = data.copy()
            yield offset, buf
            buf[:] = 0  # reused by the caller

    posix_io.write_stream(tmp_path / "f", pieces())
    assert (tmp_path / "f").read_bytes() == want.tobytes()
    posix_io.write_stream(tmp_path / "empty", iter(()))
    assert (tmp_path / "empty").read_bytes() == b""
    with pytest.raises(FileExistsError):  # never overwrites
        posix_io.write_stream(tmp_path / "f", iter(()))


def test_direct_file_falls_back_to_buffered_writes(tmp_path):
    """A write O_DIRECT refuses (unaligned) goes through the page cache instead."""
    out = posix_io.DirectFile(tmp_path / "f")
    try:
        out.pwrite(memoryview(b"x" * 4096 * 2)[1:4000], 3)
        assert not out.direct  # refused: buffered from here on
        out.finish(4003)
    finally:
        out.close()
    assert (tmp_path / "f").read_bytes() == b"\0" * 3 + b"x" * 3999 + b"\0"
