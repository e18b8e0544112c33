"""Small checkpoints that declare huge arrays: decompression bombs (tests of bounded memory).

:func:`write_bomb` writes a valid checkpoint (its manifest sealed, every hash and root
right) holding one array of ``raw`` zero bytes stored as one Zstandard frame of RLE
blocks (128 KiB of output per 4 stored bytes: a 32,768x expansion, the most the format
allows), written by hand, so making a 1 GiB bomb costs neither memory nor time.
``hostile=True`` makes a frame that declares ``raw`` bytes but holds half of them, padded
to the length of the whole (a damaged checkpoint whose declaration alone is huge: refused
when its frame is walked or decoded).

Zip archives for the tests of ``uckpt convert``: :func:`raw_zip` writes them by hand
(sizes and names may lie), :func:`deflated_zeros` makes deflate streams of many MiB of
zeros in milliseconds, :func:`keras_archive` a ``.keras`` archive whose weights member is
deflated.
"""
import io
import struct
import zlib
from pathlib import Path

import numpy as np
import xxhash
from crc32c import crc32c

import uckpt
from uckpt.codecs import checksum, hashing
from uckpt.format import Manifest
from uckpt.format import encode_manifest, parse_manifest
from dataclasses import replace

BLOCK = 1 << 17


def rle_frame(raw: int, blocks: int = -1) -> bytes:
    """One Zstandard frame declaring ``raw`` bytes (a multiple of 128 KiB) of zeros, as
    RLE blocks of 128 KiB (only the first ``blocks`` of them, if given)."""
    assert raw % BLOCK == 0 and raw > 0
    n = raw // BLOCK if blocks < 0 else blocks
    head = b"\x28\xb5\x2f\xfd" + bytes([0xC0, 7 << 3]) + raw.to_bytes(8, "little")
    block = ((BLOCK << 3) | (1 << 1)).to_bytes(3, "little") + b"\x00"
    last = ((BLOCK << 3) | (1 << 1) | 1).to_bytes(3, "little") + b"\x00"
    return head + block * (n - 1) + last


def zeros_hash(raw: int) -> str:
    h = xxhash.xxh3_128()
    zero = bytes(1 << 20)
    for at in range(0, raw, len(zero)):
        h.update(zero[:min(len(zero), raw - at)])
    return hashing.format_hash(h.digest())


#: the codec pipeline of each ``codec`` name write_bomb takes
PIPELINES = {"zstd": ("zstd",), "zstd+bytegroup": ("bytegroup", "zstd")}


def write_bomb(directory: Path, raw: int, *, dtype: str = "uint8", codec: str = "zstd",
               hostile: bool = False, step=None) -> Path:
    """A checkpoint at ``directory`` of one array ``w`` of ``raw`` bytes of ``dtype`` zeros
    (``codec``: "zstd", or "zstd+bytegroup": zero planes are zero bytes too)."""
    itemsize = np.dtype(dtype).itemsize
    uckpt.save(directory, {"w": np.ones(256 // itemsize, dtype)}, step=step,
               compression="zstd")  # the template: its tree, files and fields
    m = parse_manifest((directory / "manifest.json").read_bytes())
    frame = rle_frame(raw)
    if hostile:
        half = rle_frame(raw, raw // BLOCK // 2)
        frame = half + bytes(len(frame) - len(half))
    name = next(iter(m.files))
    (directory / name).write_bytes(frame)
    entry = m.arrays["w"]
    chunk = replace(entry.chunks[0], offset=0, length=len(frame), start=(0,),
                    shape=(raw // itemsize,), codec=PIPELINES[codec],
                    checksum=checksum.format_checksum(crc32c(frame)),
                    hash=zeros_hash(raw))
    m.arrays["w"] = replace(entry, shape=(raw // itemsize,), chunks=(chunk,), root="")
    m.files[name] = replace(m.files[name], size=len(frame))
    (directory / "manifest.json").write_bytes(encode_manifest(m))
    return directory


# -- zip archives and deflate streams ------------------------------------------------------
MIB = 1 << 20


def raw_zip(path, members):
    """Write a zip archive by hand: ``members`` are (name bytes, data as stored, CRC-32,
    declared size, method, flags), so sizes and names may lie."""
    out, central = bytearray(), bytearray()
    for name, data, crc, size, method, flags in members:
        fields = struct.pack("<HHHHHIIIHH", 20, flags, method, 0, 0x21, crc, len(data), size,
                             len(name), 0)
        central += b"PK\x01\x02" + struct.pack("<H", 20) + fields + \
            struct.pack("<HHHII", 0, 0, 0, 0, len(out)) + name
        out += b"PK\x03\x04" + fields + name + data
    end = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, len(members), len(members),
                      len(central), len(out), 0)
    Path(path).write_bytes(bytes(out + central + end))


def npy_header(shape, descr="|u1") -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False,
                                               "shape": shape})
    return buf.getvalue()


def deflated_zeros(mib: int, head: bytes = b"", tail: bytes = b""):
    """(raw deflate stream, CRC-32, size) of ``head``, ``mib`` MiB of zeros and ``tail``,
    made fast: after a full flush the compressor's output for the same MiB is the same."""
    zero = bytes(MIB)
    z = zlib.compressobj(1, zlib.DEFLATED, -15)
    first = z.compress(head) + z.flush(zlib.Z_FULL_FLUSH)
    block = z.compress(zero) + z.flush(zlib.Z_FULL_FLUSH)
    crc = zlib.crc32(head)
    for _ in range(mib):
        crc = zlib.crc32(zero, crc)
    stream = first + block * mib + z.compress(tail) + z.flush()
    return stream, zlib.crc32(tail, crc), len(head) + mib * MIB + len(tail)


def keras_archive(path, mib: int, lie: int = 0) -> int:
    """A .keras archive whose deflated weights member is an HDF5 file with a user block of
    ``mib`` MiB of zeros (its data lies after them; ``mib`` a power of 2), declaring its
    true size plus ``lie`` (modulo 2^32); returns the member's compressed size."""
    import h5py

    h5 = Path(path).with_suffix(".h5")
    with h5py.File(h5, "w", userblock_size=mib * MIB) as f:  # a sparse file
        f["layers/dense/vars/0"] = np.arange(6, dtype=np.float32)
    with open(h5, "rb") as f:
        f.seek(mib * MIB)
        stream, crc, size = deflated_zeros(mib, tail=f.read())
    h5.unlink()
    config = b'{"class_name": "Sequential"}'
    raw_zip(path, [(b"config.json", config, zlib.crc32(config), len(config), 0, 0),
                   (b"model.weights.h5", stream, crc, max(0, size + lie) % (1 << 32), 8, 0)])
    return len(stream)
