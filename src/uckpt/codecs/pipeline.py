"""Chunk codec pipelines (docs/format.md): ``[]`` (raw), ``["zstd"]`` and
``["bytegroup", "zstd"]``.

:func:`encode` turns a chunk's raw bytes into what is stored (raw when compression
would not make it smaller); :func:`decode_into` turns stored bytes back into the raw
bytes, into a buffer the caller allocated of exactly the raw size, after checking the
frame's header (content size present and equal, no dictionary, a bounded window), so
that a hostile frame can neither make the reader allocate nor write more than the
manifest's shape implies. Every decoding failure is a
:class:`~uckpt.errors.CorruptCheckpointError` naming the file, the leaf and the offset.

Zstandard releases the GIL while it works, so chunks are encoded and decoded on plain
threads in parallel (the writer's and reader's thread pools).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np

from ..errors import CompressionError, CorruptCheckpointError

#: the codec pipelines of format 1.0 (the names applied in order when writing)
RAW: Tuple[str, ...] = ()
ZSTD: Tuple[str, ...] = ("zstd",)
BYTEGROUP: Tuple[str, ...] = ("bytegroup", "zstd")
COMPRESSED = (ZSTD, BYTEGROUP)
#: a Zstandard frame never decodes to more than this many bytes per stored byte (a block
#: yields at most 128 KiB and takes at least 4 bytes)
MAX_RATIO = 32768
#: the largest window a frame may ask for (Zstandard's default decoder limit)
MAX_WINDOW = 1 << 27
#: the values ``compression=`` takes (besides None): "zstd" picks the pipeline per dtype;
#: "zstd+bytegroup" asks for byte grouping for every dtype
COMPRESSIONS = ("none", "zstd", "zstd+bytegroup")
DEFAULT_LEVEL = 1
_BLOCK = 1 << 18  # byte planes are decoded this much at a time
_MAGIC = b"\x28\xb5\x2f\xfd"


@dataclass(frozen=True)
class Compression:
    """How a save or a tier compresses chunks: ``name`` one of :data:`COMPRESSIONS`
    (``"zstd"``: the pipeline ``bytegroup, zstd`` for dtypes of itemsize 2 or more,
    ``zstd`` for 1-byte ones); ``level`` Zstandard's level (1 is fast and nearly as
    small as 3)."""

    name: str = "zstd"
    level: int = DEFAULT_LEVEL

    def codec_for(self, itemsize: int) -> Tuple[str, ...]:
        """The pipeline of a chunk of elements of ``itemsize`` bytes."""
        if self.name == "zstd" and itemsize < 2:
            return ZSTD
        return BYTEGROUP


def label(pipeline: Tuple[str, ...]) -> str:
    """A pipeline for people: ``raw``, ``zstd``, ``bytegroup+zstd``."""
    return "+".join(pipeline) or "raw"


def compression_of(name, level: Optional[int] = None) -> Optional[Compression]:
    """The :class:`Compression` for a user's ``compression=`` (None, ``"none"``, a name of
    :data:`COMPRESSIONS`, or a Compression) and ``compression_level=``; None: store raw.
    Raises CompressionError (a ValueError) for anything else."""
    if isinstance(name, Compression):
        return name if level is None else Compression(name.name, _level(level))
    if name is None or name == "none":
        if level is not None:
            raise CompressionError(f"compression_level={level!r} given without a compression",
                                   hint='pass compression="zstd" too')
        return None
    if not isinstance(name, str) or name not in COMPRESSIONS:
        raise CompressionError(f"unknown compression {name!r}; uckpt knows "
                               f"{', '.join(repr(c) for c in COMPRESSIONS)} and None",
                               hint='use compression="zstd" (byte grouping for floats)')
    return Compression(name, DEFAULT_LEVEL if level is None else _level(level))


def _level(level) -> int:
    import zstandard

    top = zstandard.MAX_COMPRESSION_LEVEL
    if not isinstance(level, int) or isinstance(level, bool) or not -7 <= level <= top:
        raise CompressionError(f"compression_level must be an int from -7 to {top}, got "
                               f"{level!r}", hint="1 (the default) is fast; 3 to 9 smaller")
    return level


_local = threading.local()


#: Zstandard's hash table for byte planes at levels up to 1: 2^8 entries. Byte planes of
#: floats hold few repeats; what shrinks them is the entropy coding of the sign and
#: exponent planes. A table this small stays in the L1 cache and skips noise quickly:
#: less CPU time than level 1's own table (2^13 entries), and slightly smaller frames
#: (docs/benchmarks.md, "Figures behind choices in the code and the spec").
PLANES_HASH_LOG = 8


def _compressor(level: int, threads: int, planes: bool = False):
    import zstandard

    cache = getattr(_local, "compressors", None)
    if cache is None:
        cache = _local.compressors = {}
    key = (level, threads, planes and level <= 1)
    if key not in cache:
        params = zstandard.ZstdCompressionParameters(
            compression_level=level, hash_log=PLANES_HASH_LOG if key[2] else 0,
            write_content_size=1, write_checksum=0, threads=threads)
        cache[key] = zstandard.ZstdCompressor(compression_params=params)
    return cache[key]


def _decompressor():
    import zstandard

    d = getattr(_local, "decompressor", None)
    if d is None:
        d = _local.decompressor = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW)
    return d


#: little-endian words that byte planes are shifted out of, by itemsize
_WORDS = {2: np.dtype("<u2"), 4: np.dtype("<u4"), 8: np.dtype("<u8")}
_GROUP_BLOCK = 1 << 16  # items grouped at a time (in cache)


def group_bytes(raw: np.ndarray, itemsize: int, out: Optional[np.ndarray] = None) -> np.ndarray:
    """Planes of ``raw`` (flat uint8): byte j of every item, for j = 0 .. itemsize-1; in
    the first ``raw.nbytes`` of ``out`` (a flat uint8 array) when given.

    Items of 2, 4 or 8 bytes are read as little-endian words a block at a time, each
    plane a shifted and truncated copy of the block (vectorised, about twice as fast
    as a transposing copy); other sizes are transposed."""
    if itemsize == 1:
        return raw
    planes = (np.empty(raw.nbytes, dtype=np.uint8) if out is None else out[:raw.nbytes])
    grid = planes.reshape(itemsize, -1)
    kind = _WORDS.get(itemsize)
    if kind is None:
        np.copyto(grid, raw.reshape(-1, itemsize).T)
        return planes
    words = raw.view(kind)
    tmp = _block(kind)
    for i in range(0, len(words), _GROUP_BLOCK):
        block = words[i:i + _GROUP_BLOCK]
        shifted = tmp[:len(block)]
        np.copyto(grid[0, i:i + _GROUP_BLOCK], block, casting="unsafe")
        for j in range(1, itemsize):
            np.right_shift(block, 8 * j, out=shifted)
            np.copyto(grid[j, i:i + _GROUP_BLOCK], shifted, casting="unsafe")
    return planes


def _block(kind: np.dtype) -> np.ndarray:
    """This thread's buffer of ``_GROUP_BLOCK`` words of ``kind`` (kept: at most 512 KiB)."""
    blocks = getattr(_local, "blocks", None)
    if blocks is None:
        blocks = _local.blocks = {}
    if kind not in blocks:
        blocks[kind] = np.empty(_GROUP_BLOCK, dtype=kind)
    return blocks[kind]


def encode(compression: Compression, raw: np.ndarray, itemsize: int, threads: int = 0,
           memory=None):
    """``(codec, stored bytes)`` for a chunk's raw bytes (flat uint8): compressed (on
    ``threads`` more threads of Zstandard's own when > 1), or ``(RAW, raw)`` when the
    frame would not be smaller or there are no bytes.

    With ``memory`` (a :class:`~uckpt.saving.encode_memory.EncodeMemory`), byte planes go to
    the calling thread's scratch buffer, and the frame into a buffer it lends when it
    pools them (the stored bytes are then a view of it, which the caller gives back
    once written; the frame is streamed there, so content of a multiple of 128 KiB
    gets an empty last block, 3 bytes more); otherwise to new memory."""
    if raw.nbytes == 0:
        return RAW, raw
    codec = compression.codec_for(itemsize)
    content = raw
    if codec == BYTEGROUP:
        content = group_bytes(raw, itemsize, memory.scratch(raw.nbytes) if memory else None)
    cctx = _compressor(compression.level, threads if threads > 1 else 0, codec == BYTEGROUP)
    out = memory.take(raw.nbytes) if memory is not None else None
    if out is None:
        frame = cctx.compress(content)
        return (RAW, raw) if len(frame) >= raw.nbytes else (codec, frame)
    size = _compress_into(cctx, content, out)  # a frame that does not fit is no smaller
    if size is None:
        memory.give(out)
        return RAW, raw
    return codec, out[:size]


def _compress_into(cctx, content: np.ndarray, out: np.ndarray) -> Optional[int]:
    """Compress ``content`` as one frame (declaring its size) into ``out``; its length,
    or None if it does not fit in fewer than ``len(out)`` bytes."""
    reader = cctx.stream_reader(content, size=content.nbytes)
    view, done = memoryview(out), 0
    while done < len(view):
        n = reader.readinto(view[done:])
        if not n:
            return done
        done += n
    return None


def decode_into(codec: Tuple[str, ...], stored, out: np.ndarray, itemsize: int, *,
                where: str, leaf: str, offset: int) -> None:
    """Decode ``stored`` (a compressed chunk's bytes, CRC already checked) into ``out``, a
    writable C-contiguous uint8 array of exactly the chunk's raw size."""
    import zstandard

    damaged = damage(codec, where=where, leaf=leaf, offset=offset)
    want = out.nbytes
    params, header = check_header(bytes(memoryview(stored)[:18]), want, damaged)
    most = max_blocks(want)
    end = _frame_end(stored, header, params.has_checksum, most)
    if end is None:
        raise damaged("its frame is cut short")
    if end < 0:
        raise damaged(f"its frame has more than {most} blocks, the most {want} bytes may take")
    if end != len(memoryview(stored)):
        raise damaged(f"its frame is {end} bytes long, the chunk {len(memoryview(stored))}")
    try:
        _inflate(stored, out, damaged, itemsize if codec == BYTEGROUP else 1)
    except zstandard.ZstdError as e:
        raise damaged(f"Zstandard cannot decode it ({e})") from None


def damage(codec: Tuple[str, ...], *, where: str, leaf: str, offset: int):
    """The maker of the error a damaged compressed chunk raises: ``damage(...)(what)``."""
    def damaged(what: str) -> CorruptCheckpointError:
        return CorruptCheckpointError(
            f"{where}: compressed chunk of leaf {leaf!r} at byte offset {offset} "
            f"({label(codec)}) "
            f"is damaged: {what}", path=where, leaf=leaf, offset=offset,
            hint="the checkpoint was written wrongly or altered; restore an earlier one")
    return damaged


def check_header(head: bytes, want: int, damaged):
    """``(frame parameters, header size)`` of the frame starting ``head`` (a chunk's first
    stored bytes, up to 18), checked against docs/format.md section 5 for
    content of ``want`` bytes; ``damaged(what)`` makes the error raised."""
    import zstandard

    if head[:4] != _MAGIC:
        raise damaged("it does not start with a Zstandard frame")
    try:
        params = zstandard.get_frame_parameters(head)
        header = zstandard.frame_header_size(head)
    except zstandard.ZstdError as e:
        raise damaged(f"its frame header is unreadable ({e})") from None
    if params.content_size == zstandard.CONTENTSIZE_UNKNOWN:
        raise damaged("its frame does not declare its decompressed size; refused "
                      "before decompressing")
    if params.content_size != want:
        raise damaged(f"its frame declares {params.content_size} decompressed bytes, the "
                      f"manifest's shape implies {want}; refused before decompressing")
    if params.dict_id:
        raise damaged(f"its frame needs dictionary {params.dict_id}")
    if params.window_size > MAX_WINDOW:
        raise damaged(f"its frame asks for a {params.window_size}-byte window, more than "
                      f"{MAX_WINDOW}")
    return params, header


def max_blocks(raw_size: int) -> int:
    """The most blocks a frame of ``raw_size`` decoded bytes may have (docs/format.md
    section 5): bounds a reader's work by the content's size."""
    return 64 + raw_size // 2048


def _frame_end(stored, header: int, checksum: bool, most: int) -> Optional[int]:
    """Where the frame starting ``stored`` ends, walking its block headers (3 bytes each:
    last-block bit, type, size); None if it runs past the end, -1 after ``most`` blocks."""
    data = memoryview(stored).cast("B")
    at, size = header, len(data)
    for _ in range(most):
        if at + 3 > size:
            return None
        word = data[at] | data[at + 1] << 8 | data[at + 2] << 16
        kind, length = (word >> 1) & 3, word >> 3
        at += 3 + (1 if kind == 1 else length)  # an RLE block stores one byte
        if word & 1:  # the last block
            at += 4 if checksum else 0
            return at if at <= size else None
    return -1


def _inflate(stored, out: np.ndarray, damaged, planes: int) -> None:
    """Decode one frame into ``out``: exactly its size, no more. With ``planes`` > 1 the
    content is byte planes: decoded in blocks of ``_BLOCK`` bytes (in cache), each
    scattered into its plane's place among the elements."""
    reader = _decompressor().stream_reader(stored, read_across_frames=False)
    want = out.nbytes
    if planes == 1:
        view, done = memoryview(out).cast("B"), 0
        while done < want:
            n = reader.readinto(view[done:])
            if not n:
                raise damaged(f"its frame ends after {done} of {want} bytes")
            done += n
    else:
        items, count = out.reshape(-1, planes), want // planes
        block = np.empty(min(want, _BLOCK), dtype=np.uint8)
        done = 0
        while done < want:
            n = reader.readinto(memoryview(block)[:min(len(block), want - done)])
            if not n:
                raise damaged(f"its frame ends after {done} of {want} bytes")
            at = 0
            while at < n:  # a block may end one plane and start the next
                j, i = divmod(done + at, count)
                take = min(n - at, count - i)
                items[i:i + take, j] = block[at:at + take]
                at += take
            done += n
    if reader.read(1):
        raise damaged(f"its frame holds more than the {want} bytes it declares")
