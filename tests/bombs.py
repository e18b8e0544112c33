"""Small checkpoints that declare huge arrays: decompression bombs (tests of bounded memory).

:func:`write_bomb` writes a valid checkpoint (its manifest sealed, every hash and root
right) holding one array of ``raw`` zero bytes stored as one Zstandard frame of RLE
blocks (128 KiB of output per 4 stored bytes: a 32,768x expansion, the most the format
allows), written by hand, so making a 1 GiB bomb costs neither memory nor time.
``hostile=True`` makes a frame that declares ``raw`` bytes but holds half of them, padded
to the length of the whole (a damaged checkpoint whose declaration alone is huge: refused
when its frame is walked or decoded).
"""
from pathlib import Path

import numpy as np
import xxhash
from crc32c import crc32c

import uckpt
from uckpt import checksum, hashing
from uckpt.format import Manifest
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


def write_bomb(directory: Path, raw: int, *, dtype: str = "uint8", codec: str = "zstd",
               hostile: bool = False, step=None) -> Path:
    """A checkpoint at ``directory`` of one array ``w`` of ``raw`` bytes of ``dtype`` zeros
    (``codec``: "zstd", or "zstd+bytegroup": zero planes are zero bytes too)."""
    itemsize = np.dtype(dtype).itemsize
    uckpt.save(directory, {"w": np.ones(256 // itemsize, dtype)}, step=step,
               compression="zstd")  # the template: its tree, files and fields
    m = Manifest.parse((directory / "manifest.json").read_bytes())
    frame = rle_frame(raw)
    if hostile:
        half = rle_frame(raw, raw // BLOCK // 2)
        frame = half + bytes(len(frame) - len(half))
    name = next(iter(m.files))
    (directory / name).write_bytes(frame)
    entry = m.arrays["w"]
    chunk = replace(entry.chunks[0], offset=0, length=len(frame), start=(0,),
                    shape=(raw // itemsize,), codec=codec,
                    checksum=checksum.format_checksum(crc32c(frame)),
                    hash=zeros_hash(raw))
    m.arrays["w"] = replace(entry, shape=(raw // itemsize,), chunks=(chunk,), root="")
    m.files[name] = replace(m.files[name], size=len(frame))
    (directory / "manifest.json").write_bytes(m.to_bytes())
    return directory
