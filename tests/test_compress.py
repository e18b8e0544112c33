"""Compressed checkpoints (docs/format.md section 5): round trips, layouts, bad input.

Every test saves real files under tmp_path and loads them back with ``uckpt.load``;
damaged inputs are made by editing the bytes on disk (and re-sealing the manifest
where the damage must reach the parser behind its checksum).
"""
import json
import struct

import crc32c
import ml_dtypes
import numpy as np
import pytest
import zstandard

import uckpt
from uckpt.format import FORMAT_VERSION
from uckpt import errors
from uckpt.format import integrity
from grid_listing import listed

RNG = np.random.default_rng(12)


def smooth(shape, dtype):
    """Weights-like values: normal, so byte grouping pays."""
    return RNG.standard_normal(shape).astype(dtype)


def every_dtype():
    return {
        "bool": RNG.random((50, 3)) < 0.1,
        "int8": RNG.integers(-5, 5, 300, dtype=np.int8),
        "int16": RNG.integers(-300, 300, 300).astype(np.int16),
        "int32": np.arange(1000, dtype=np.int32),
        "int64": RNG.integers(0, 1000, 500),
        "uint8": np.tile(np.arange(10, dtype=np.uint8), 40),
        "uint16": np.arange(600, dtype=np.uint16),
        "uint32": np.arange(600, dtype=np.uint32) * 7,
        "uint64": np.arange(300, dtype=np.uint64) << np.uint64(40),
        "float16": smooth(1000, np.float16),
        "float32": smooth((40, 25), np.float32),
        "float64": smooth(500, np.float64),
        "complex64": (smooth(300, np.float32) + 1j * smooth(300, np.float32)).astype(np.complex64),
        "complex128": np.exp(1j * np.linspace(0, 3, 200)),
        "bfloat16": smooth((64, 32), ml_dtypes.bfloat16),
        "float8_e4m3fn": smooth(800, np.float32).astype(ml_dtypes.float8_e4m3fn),
        "float8_e5m2": smooth(800, np.float32).astype(ml_dtypes.float8_e5m2),
    }


def assert_bitwise(got, want, where=""):
    assert isinstance(got, np.ndarray) and got.dtype == want.dtype and got.shape == want.shape, where
    assert got.tobytes() == want.tobytes(), where


def chunks_of(path):
    return {p: a.chunks for p, a in uckpt.manifest(path).arrays.items()}


def reseal(path, fn):
    """Edit the manifest as JSON and seal it anew (docs/format.md section 3.4)."""
    m = listed(json.loads((path / "manifest.json").read_bytes()))  # grids as chunk lists
    m.pop(integrity.FIELD)
    fn(m)
    text = json.dumps(m, separators=(",", ":"), ensure_ascii=False)
    (path / "manifest.json").write_bytes(integrity.seal(text[:-1].encode()))


def _without_v4_fields(m, version):
    """A version-4 manifest made into one of ``version`` (3 or older): without content
    hashes, Merkle roots and bases."""
    m.update(format_version=version)
    m.pop("bases"), m.pop("merkle_root")
    for a in m["arrays"].values():
        a.pop("root")
        for c in a["chunks"]:
            c.pop("hash")


def replace_chunk(path, leaf, stored: bytes, **fields):
    """Write ``stored`` as the (only) chunk of ``leaf`` at the end of the data file and
    point the manifest at it, with a matching CRC: damage that the CRC cannot see."""
    data = path / "data-00000.bin"
    offset = data.stat().st_size
    with open(data, "ab") as f:
        f.write(stored)

    def edit(m):
        m["files"]["data-00000.bin"]["size"] = offset + len(stored)
        chunk = m["arrays"][leaf]["chunks"][0]
        chunk.update(offset=offset, length=len(stored),
                     checksum=f"crc32c:{crc32c.crc32c(stored):08x}", **fields)
    reseal(path, edit)


# --- round trips ------------------------------------------------------------------------------
@pytest.mark.parametrize("compression", ["zstd", "zstd+bytegroup"])
def test_every_dtype_round_trips(tmp_path, compression):
    state = every_dtype()
    path = uckpt.save(tmp_path / "c", state, compression=compression)
    out = uckpt.load(path)
    for name, arr in state.items():
        assert_bitwise(out[name], arr, name)
    codecs = {p: c[0].codec for p, c in chunks_of(path).items()}
    assert codecs["float32"] == codecs["bfloat16"] == codecs["int64"] == ("bytegroup", "zstd")
    assert codecs["uint8"] == (("zstd",) if compression == "zstd" else ("bytegroup", "zstd"))
    assert uckpt.manifest(path).format_version == FORMAT_VERSION
    uckpt.verify(path)


def test_byte_planes_decoded_in_small_blocks(tmp_path, monkeypatch):
    """Byte planes are decoded a block at a time; blocks that end inside a plane, or span
    two, land in the right places (a block of 777 bytes: never aligned to a plane)."""
    from uckpt.codecs import pipeline as codecs

    monkeypatch.setattr(codecs, "_BLOCK", 777)
    state = every_dtype()
    out = uckpt.load(uckpt.save(tmp_path / "c", state, compression="zstd"))
    for name, arr in state.items():
        assert_bitwise(out[name], arr, name)


def test_compressed_is_smaller_and_layout_is_packed(tmp_path):
    state = {"w": smooth((256, 256), np.float32), "b": smooth((256, 256), ml_dtypes.bfloat16)}
    raw = uckpt.save(tmp_path / "raw", state)
    packed = uckpt.save(tmp_path / "zstd", state, compression="zstd")
    raw_size = (raw / "data-00000.bin").stat().st_size
    size = (packed / "data-00000.bin").stat().st_size
    assert size < 0.9 * raw_size
    m = uckpt.manifest(packed)
    assert m.files["data-00000.bin"].size == size
    ends = sorted((c.offset, c.offset + c.length) for a in m.arrays.values() for c in a.chunks)
    assert ends[0][0] == 0 and ends[-1][1] == size and ends[1][0] % 64 == 0  # the default
    assert_bitwise(uckpt.load(packed)["b"], state["b"])


def test_empty_scalar_and_values(tmp_path):
    state = {"empty": np.zeros((0, 4), dtype=np.float32), "zero_d": np.array(3.5),
             "scalar": np.float32(2.5), "blob": b"abc" * 100, "none": None, "n": 7}
    out = uckpt.load(uckpt.save(tmp_path / "c", state, compression="zstd"))
    assert_bitwise(out["empty"], state["empty"])
    assert_bitwise(out["zero_d"], state["zero_d"])
    assert out["scalar"] == np.float32(2.5) and isinstance(out["scalar"], np.float32)
    assert out["blob"] == state["blob"] and out["none"] is None and out["n"] == 7
    chunks = chunks_of(tmp_path / "c")
    assert chunks["empty"] == () and chunks["zero_d"][0].codec == ()  # 8 bytes: no gain
    assert chunks["blob"][0].codec == ("zstd",)


def test_incompressible_chunks_are_stored_raw(tmp_path):
    """Random bytes do not shrink: stored raw, beside compressed chunks of the same array."""
    noise = RNG.integers(0, 256, 8192, dtype=np.uint8)
    mixed = np.concatenate([np.zeros(8192, dtype=np.uint8), noise])
    path = uckpt.save(tmp_path / "c", {"noise": noise, "mixed": mixed},
                      options=uckpt.SaveOptions(chunk_bytes=4096, compression="zstd"))
    chunks = chunks_of(path)
    assert {c.codec for c in chunks["noise"]} == {()}
    assert {c.codec for c in chunks["mixed"]} == {(), ("zstd",)}
    assert all(c.length == 4096 for c in chunks["noise"])
    out = uckpt.load(path)
    assert_bitwise(out["noise"], noise)
    assert_bitwise(out["mixed"], mixed)


def test_mixed_codecs_in_one_checkpoint(tmp_path):
    state = {"f": smooth((400, 10), np.float32), "u8": np.zeros(500, dtype=np.uint8),
             "noise": RNG.integers(0, 256, 300, dtype=np.uint8), "tiny": np.ones(2)}
    path = uckpt.save(tmp_path / "c", state, options=uckpt.SaveOptions(
        chunk_bytes=4096, compression="zstd", compression_level=5))
    codecs = {c.codec for cs in chunks_of(path).values() for c in cs}
    assert codecs == {(), ("zstd",), ("bytegroup", "zstd")}
    out = uckpt.load(path)
    for k, v in state.items():
        assert_bitwise(out[k], v, k)


def test_async_save_compresses_in_the_background(tmp_path):
    state = {"w": smooth((300, 300), np.float32)}
    want = state["w"].copy()
    handle = uckpt.save(tmp_path / "c", state, compression="zstd", blocking=False)
    state["w"][:] = 0  # after the snapshot: does not reach the checkpoint
    path = handle.wait()
    assert chunks_of(path)["w"][0].codec == ("bytegroup", "zstd")
    assert_bitwise(uckpt.load(path)["w"], want)


def test_partial_loads_read_only_needed_chunks(tmp_path):
    """A box of a compressed array: only the chunks it intersects are decoded."""
    full = np.round(smooth((64, 64), np.float32) * 8) / 8
    path = uckpt.save(tmp_path / "c", {"w": full},
                      options=uckpt.SaveOptions(chunk_bytes=1024, compression="zstd"))
    chunks = chunks_of(path)["w"]
    assert len(chunks) > 4 and all(c.codec == ("bytegroup", "zstd") for c in chunks)
    # damage the last chunk: a box that does not touch it still loads
    last = max(chunks, key=lambda c: c.start[0])
    with open(path / "data-00000.bin", "r+b") as f:
        f.seek(last.offset + last.length // 2)
        f.write(b"\xff\x00\xff")
    box = np.zeros((10, 64), dtype=np.float32)
    uckpt.load(path, {"w": uckpt.Shard(box, (64, 64), (5, 0))})
    assert_bitwise(box, full[5:15])
    with pytest.raises(errors.ChecksumMismatchError, match="'w'"):
        uckpt.load(path)


def test_consolidate_can_compress(tmp_path):
    state = {"w": smooth((100, 100), np.float32)}
    src = uckpt.save(tmp_path / "raw", state)
    dst = uckpt.consolidate(src, tmp_path / "packed", compression="zstd")
    assert chunks_of(dst)["w"][0].codec == ("bytegroup", "zstd")
    assert_bitwise(uckpt.load(dst)["w"], state["w"])


# --- options ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, match", [
    ({"compression": "gzip"}, "unknown compression 'gzip'"),
    ({"compression": 3}, "unknown compression 3"),
    ({"compression": "zstd", "compression_level": 99}, "compression_level must be"),
    ({"compression": "zstd", "compression_level": "fast"}, "compression_level must be"),
    ({"compression_level": 3}, "without a compression"),
])
def test_bad_compression_options(tmp_path, kwargs, match):
    with pytest.raises(errors.CompressionError, match=match) as info:
        uckpt.save(tmp_path / "c", {"x": np.ones(3)}, **kwargs)
    assert isinstance(info.value, ValueError)
    assert not (tmp_path / "c").exists()


def test_none_means_raw(tmp_path):
    path = uckpt.save(tmp_path / "c", {"x": np.zeros(1000)}, compression="none")
    assert chunks_of(path)["x"][0].codec == ()


# --- bad input ----------------------------------------------------------------------------------
@pytest.fixture
def packed(tmp_path):
    state = {"w": smooth((128, 64), np.float32), "ids": np.arange(4000, dtype=np.int64) % 97}
    return uckpt.save(tmp_path / "packed", state, compression="zstd"), state


def test_damaged_compressed_bytes_are_a_checksum_mismatch(packed):
    path, _ = packed
    chunk = chunks_of(path)["w"][0]
    with open(path / "data-00000.bin", "r+b") as f:
        f.seek(chunk.offset + 40)
        f.write(b"\x00\x01\x02")
    with pytest.raises(errors.ChecksumMismatchError, match="leaf 'w'"):
        uckpt.load(path)
    with pytest.raises(errors.ChecksumMismatchError, match="leaf 'w'"):
        uckpt.verify(path)


def _frame(content: bytes, **kw) -> bytes:
    return zstandard.ZstdCompressor(level=1, **kw).compress(content)


def _with_dictionary_id(frame: bytes) -> bytes:
    """``frame`` with a 1-byte Dictionary_ID (7) in its header (RFC 8878 3.1.1.1)."""
    fhd = frame[4]
    at = 5 if fhd & 0x20 else 6  # a single-segment frame has no window descriptor
    return frame[:4] + bytes([fhd | 1]) + frame[5:at] + b"\x07" + frame[at:]


def test_undecodable_frame_names_the_leaf(packed):
    """Bytes whose CRC matches but that Zstandard cannot decode: CorruptCheckpointError
    naming the leaf, never zstandard's own exception."""
    path, state = packed
    good = _frame(state["ids"].view(np.uint8).reshape(-1, 8).T.tobytes())
    bad = bytearray(good)
    for i in range(len(bad) // 2, len(bad) - 4):
        bad[i] ^= 0x5A
    replace_chunk(path, "ids", bytes(bad))
    with pytest.raises(errors.CorruptCheckpointError, match="leaf 'ids'") as info:
        uckpt.load(path)
    assert not isinstance(info.value, zstandard.ZstdError)
    # the CRC of the stored bytes matches, but verify (version 4) decodes every compressed
    # chunk to check its content hash
    with pytest.raises(errors.CorruptCheckpointError, match="leaf 'ids'"):
        uckpt.verify(path)


@pytest.mark.parametrize("case", ["larger", "smaller", "no size", "not zstd", "trailing",
                                  "two frames", "cut short", "dictionary"])
def test_bad_frames_are_refused_before_decoding(packed, case):
    path, state = packed
    content = state["ids"].view(np.uint8).reshape(-1, 8).T.tobytes()
    frames = {
        "larger": _frame(content + bytes(64)),
        "smaller": _frame(content[:-8]),
        "no size": _frame(content, write_content_size=False),
        "not zstd": b"\x00" * 200,
        "trailing": _frame(content) + b"\x00\x00\x00",
        "two frames": _frame(content[:16000]) + _frame(content[16000:]),
        "cut short": _frame(content)[:-3],
        "dictionary": _with_dictionary_id(_frame(content)),
    }
    replace_chunk(path, "ids", frames[case])
    with pytest.raises(errors.CorruptCheckpointError, match="leaf 'ids'.*damaged"):
        uckpt.load(path)


def test_frame_of_many_tiny_blocks_is_refused(packed):
    """A frame padded with millions of empty blocks (3 bytes each) is refused after at
    most 64 + U / 2048 of them: walking a chunk costs what its content size allows."""
    import time

    path, state = packed
    content = state["ids"].view(np.uint8).reshape(-1, 8).T.tobytes()
    good = _frame(content, write_content_size=True)
    header = zstandard.frame_header_size(good)
    hostile = good[:header] + b"\x00\x00\x00" * 2_000_000 + good[header:]  # empty raw blocks
    replace_chunk(path, "ids", hostile)
    started = time.monotonic()
    with pytest.raises(errors.CorruptCheckpointError, match="more than 79 blocks"):
        uckpt.load(path)
    assert time.monotonic() - started < 30  # a hard bound against a hang, not a speed test


def test_decompression_bomb_is_refused_before_allocating(packed):
    """A tiny frame declaring 2**40 bytes: the manifest's shape implies less, and the
    frame is refused from its header alone (the load would otherwise need a terabyte)."""
    path, _ = packed
    header = b"\x28\xb5\x2f\xfd" + bytes([0xE0]) + struct.pack("<Q", 1 << 40)  # FCS 8 bytes
    replace_chunk(path, "ids", header + b"\x01\x00\x00")  # one empty last raw block
    with pytest.raises(errors.CorruptCheckpointError, match="declares 1099511627776"):
        uckpt.load(path)


def test_declared_size_beyond_ratio_is_refused_before_allocating(packed):
    """A manifest claiming a huge array over a few compressed bytes is a ManifestError:
    no Zstandard frame decodes to more than 32768 bytes per stored byte."""
    path, _ = packed

    def huge(m):
        entry = m["arrays"]["ids"]
        entry["shape"] = [1 << 40]
        entry["chunks"][0]["shape"] = [1 << 40]
    reseal(path, huge)
    with pytest.raises(errors.ManifestError, match="cannot hold"):
        uckpt.load(path)


def test_zstd_codec_in_a_version_2_manifest_is_refused(packed):
    path, _ = packed
    reseal(path, lambda m: _without_v4_fields(m, version=2))
    with pytest.raises(errors.ManifestError, match="unknown codec 'zstd\\+bytegroup' for leaf"):
        uckpt.load(path)


# --- the encoding pipeline ------------------------------------------------------------------------
def test_ordered_map_keeps_order_and_bounds_what_it_holds():
    """Compressed chunks are encoded a few ahead of the writing: results come in order,
    and no item starts more than ``window`` ahead of the consumer."""
    import threading
    import time

    from uckpt.runtime.parallel import ordered_map

    lock, started, ahead = threading.Lock(), [0], []
    consumed = [0]

    def fn(x):
        with lock:
            started[0] += 1
            ahead.append(started[0] - consumed[0])
        time.sleep(0.001 * (x % 3))
        return x * x

    out = []
    for value in ordered_map(fn, list(range(60)), threads=4, window=5):
        out.append(value)
        with lock:
            consumed[0] += 1
    assert out == [x * x for x in range(60)]
    assert max(ahead) <= 5


def test_ordered_map_raises_and_stops():
    from uckpt.runtime.parallel import ordered_map

    calls = []

    def fn(x):
        calls.append(x)
        if x == 7:
            raise OSError("disk on fire")
        return x

    with pytest.raises(OSError, match="disk on fire"):
        list(ordered_map(fn, list(range(1000)), threads=3, window=4))
    assert len(calls) < 20  # nothing started far beyond the failure


def test_save_error_while_compressing_leaves_nothing(tmp_path, monkeypatch):
    """A failure in a compressing thread fails the save: nothing committed, no debris."""
    from uckpt.codecs import pipeline as codecs

    def broken(*args, **kwargs):
        raise MemoryError("no memory for the frame")

    monkeypatch.setattr(codecs, "encode", broken)
    with pytest.raises(MemoryError):
        uckpt.save(tmp_path / "c", {"w": smooth((100, 100), np.float32)}, compression="zstd")
    assert list(tmp_path.iterdir()) == []
