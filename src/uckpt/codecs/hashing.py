"""Content hashes of chunks and the Merkle trees built from them (docs/format.md, 11.2).

A chunk's *content hash* is the XXH3-128 of its raw bytes: the box's elements in C
order, little-endian, before any codec. It names what a chunk holds, wherever it is
stored and however it is encoded, so an incremental save compares the hashes of the new
state with those of the previous checkpoint (held in memory) and writes only the chunks
whose hash changed. XXH3 is not cryptographic: like the CRC-32C of every stored chunk it
catches accidents, not tampering.

The trees, byte for byte (``H`` is XXH3-128, its 16-byte digest in canonical
big-endian order; ``u32``/``u64`` little-endian unsigned integers):

* leaf of a chunk: ``H(0x00 | u32 ndim | u64 start[0..ndim) | u64 shape[0..ndim) |
  hash of the chunk's bytes)``;
* inner node: ``H(0x01 | left | right)``; a level of nodes is paired left to right, and
  an odd last node goes up to the next level unchanged;
* an array's root: ``H(0x02 | dtype name (UTF-8) | 0x00 | u32 ndim | u64 shape[..] |
  u64 number of chunks | root of the tree of its chunk leaves``, the leaves in the
  order of their ``start`` (lexicographic); the last part is absent when the array
  has no chunk, so an empty array has a root too;
* a checkpoint's root: leaves ``H(0x03 | u64 byte length of the path | the array's
  path (UTF-8) | the array's root)`` in the order of the paths' UTF-8 bytes, then
  ``H(0x04 | u64 number of arrays | root of the tree of those leaves)`` (the last part
  absent for a checkpoint without arrays).

Under extension ``part-roots`` (docs/format.md section 13.2) a split checkpoint's root is
finished from one root per chunk table instead:

* row leaf: ``H(0x05 | u32 array index | chunk leaf)``; a table's root
  (:func:`rows_root`): ``H(0x06 | u64 number of rows | root of the tree of its row
  leaves)``, the leaves ordered by (array index, start), the last part absent without rows;
* ``merkle_root`` (:func:`split_root`): ``H(0x07 | u64 number of parts | root of the
  root's table | root of each part's table, in the order of ``parts``)``.

Hashing releases the GIL (measured: a Python thread runs at full speed beside it), so
chunks are hashed on ``knobs.io_threads`` threads.
"""
from __future__ import annotations

import re
import struct
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import xxhash

from .. import knobs
from .checksum import crc32c
from ..runtime.parallel import parallel_map

ALGORITHM = "xxh3-128"
DIGEST_BYTES = 16
PREFIX = ALGORITHM + ":"
#: how many hashes are computed on one thread before another is worth starting
_PARALLEL_BYTES = 1 << 20

_digest = xxhash.xxh3_128_digest
_HASH_TEXT = re.compile(re.escape(PREFIX) + "[0-9a-f]{%d}" % (2 * DIGEST_BYTES))
_HASHES_TEXT = re.compile("(?:%s)*" % _HASH_TEXT.pattern)


def digest(data) -> bytes:
    """The 16-byte XXH3-128 digest of a buffer (bytes, memoryview, contiguous uint8 array)."""
    return _digest(data)


def hasher():
    """A streaming XXH3-128 (``update(block)``, then ``digest()``)."""
    return xxhash.xxh3_128()


#: :func:`crc_and_digest` goes over its buffer in blocks of this size (kept in cache)
FUSED_BLOCK_BYTES = 256 << 10


def crc_and_digest(data) -> Tuple[int, bytes]:
    """The CRC-32C and the XXH3-128 digest of a flat byte buffer in one pass over memory:
    block by block, the hash reading each block while the checksum left it in cache
    (chunks of 64 MiB: about a fifth less CPU time than two passes)."""
    view = memoryview(data).cast("B")
    if len(view) <= FUSED_BLOCK_BYTES:
        return crc32c(view), _digest(view)
    h, value = xxhash.xxh3_128(), 0
    for at in range(0, len(view), FUSED_BLOCK_BYTES):
        block = view[at:at + FUSED_BLOCK_BYTES]
        value = crc32c(block, value)
        h.update(block)
    return value, h.digest()


def format_hash(value: bytes) -> str:
    return PREFIX + value.hex()


def parse_hashes(texts: Sequence[str]) -> List[bytes]:
    """:func:`parse_hash` of each of ``texts``, checked together (one regex over them)."""
    if len(texts) < 16 or not all(type(t) is str for t in texts) or \
            set(map(len, texts)) != {len(PREFIX) + 2 * DIGEST_BYTES} or \
            not _HASHES_TEXT.fullmatch("".join(texts)):
        return [parse_hash(t) for t in texts]  # (names the first bad one)
    raw = bytes.fromhex("".join(texts).replace(PREFIX, ""))
    return [raw[k:k + DIGEST_BYTES] for k in range(0, len(raw), DIGEST_BYTES)]


def parse_hash(text: str) -> bytes:
    """The digest of ``xxh3-128:`` + 32 lowercase hex digits; ValueError otherwise."""
    if not (isinstance(text, str) and _HASH_TEXT.fullmatch(text)):
        raise ValueError(f"hash {text!r} is not of the form {PREFIX!r} + 32 lowercase hex digits")
    return bytes.fromhex(text[len(PREFIX):])


def of(data) -> str:
    return format_hash(digest(data))


def digests(buffers: Sequence, threads: Optional[int] = None) -> List[bytes]:
    """The digests of many buffers, on up to ``threads`` threads (``knobs.io_threads``)."""
    total = sum(memoryview(b).nbytes for b in buffers)
    n = threads or knobs.io_threads
    if total < _PARALLEL_BYTES * 2 or len(buffers) < 2:
        n = 1
    return parallel_map(_digest, buffers, n, "uckpt-hash")


# -- Merkle trees ---------------------------------------------------------------------------------
def _combine(nodes: List[bytes]) -> bytes:
    """The root of a tree over ``nodes`` (at least one): pairs left to right, an odd last
    node promoted unchanged."""
    while len(nodes) > 1:
        nxt = [_digest(b"\x01" + nodes[i] + nodes[i + 1]) for i in range(0, len(nodes) - 1, 2)]
        if len(nodes) % 2:
            nxt.append(nodes[-1])
        nodes = nxt
    return nodes[0]


def _u64s(values: Iterable[int]) -> bytes:
    values = tuple(values)
    return struct.pack(f"<{len(values)}Q", *values)


def chunk_leaf(start: Sequence[int], shape: Sequence[int], content: bytes) -> bytes:
    return _digest(b"\x00" + struct.pack("<I", len(start)) + _u64s(start) + _u64s(shape) + content)


def _chunk_leaves(ndim: int, ordered: Sequence[Tuple[Sequence[int], Sequence[int], bytes]]
                  ) -> List[bytes]:
    """:func:`chunk_leaf` of each of ``ordered``, their ``ndim``-dimensional boxes packed
    into one table with NumPy first (a hundred thousand chunks in a fraction of a second)."""
    n = len(ordered)
    if n < 16 or any(len(s) != ndim or len(sh) != ndim for s, sh, _ in ordered):
        return [chunk_leaf(s, sh, d) for s, sh, d in ordered]
    width = 5 + 16 * ndim + DIGEST_BYTES
    table = np.zeros((n, width), dtype=np.uint8)
    table[:, 1:5] = np.frombuffer(struct.pack("<I", ndim), dtype=np.uint8)
    for column, values in ((5, [s for s, _, _ in ordered]),
                           (5 + 8 * ndim, [sh for _, sh, _ in ordered])):
        table[:, column:column + 8 * ndim] = np.array(values, dtype="<u8").reshape(
            n, ndim).view(np.uint8).reshape(n, 8 * ndim)
    table[:, width - DIGEST_BYTES:] = np.frombuffer(
        b"".join(d for _, _, d in ordered), dtype=np.uint8).reshape(n, DIGEST_BYTES)
    rows = memoryview(table.tobytes())
    return [_digest(rows[k:k + width]) for k in range(0, n * width, width)]


def array_root(dtype: str, shape: Sequence[int],
               chunks: Iterable[Tuple[Sequence[int], Sequence[int], bytes]]) -> bytes:
    """The root of an array from its chunks ``(start, shape, content digest)``, any order."""
    leaves = _chunk_leaves(len(shape), sorted(chunks, key=lambda c: tuple(c[0])))
    head = (b"\x02" + dtype.encode("utf-8") + b"\x00" + struct.pack("<I", len(shape)) +
            _u64s(shape) + struct.pack("<Q", len(leaves)))
    return _digest(head + (_combine(leaves) if leaves else b""))


def checkpoint_root(arrays: Mapping[str, bytes]) -> bytes:
    """The root of a checkpoint from its arrays' roots (path -> root)."""
    items = sorted((p.encode("utf-8"), r) for p, r in arrays.items())
    leaves = [_digest(b"\x03" + struct.pack("<Q", len(p)) + p + r) for p, r in items]
    return _digest(b"\x04" + struct.pack("<Q", len(leaves)) +
                   (_combine(leaves) if leaves else b""))



Row = Tuple[int, Sequence[int], Sequence[int], bytes]


def rows_root(rows: Sequence[Row]) -> bytes:
    """The root of a chunk table (extension ``part-roots``) from its rows ``(array index,
    start, shape, content digest)``, in any order; 16 bytes, defined for no rows too."""
    ordered = sorted(rows, key=lambda r: (r[0], tuple(r[1]), tuple(r[2]), r[3]))
    by_ndim: Dict[int, List[int]] = {}
    for k, (_, start, _, _) in enumerate(ordered):
        by_ndim.setdefault(len(start), []).append(k)
    leaves: List[bytes] = [b""] * len(ordered)
    for ndim, ks in by_ndim.items():
        for k, leaf in zip(ks, _chunk_leaves(ndim, [ordered[k][1:] for k in ks])):
            leaves[k] = leaf
    tagged = [_digest(b"\x05" + struct.pack("<I", r[0]) + leaf) for r, leaf in zip(ordered, leaves)]
    return _digest(b"\x06" + struct.pack("<Q", len(tagged)) + (_combine(tagged) if tagged else b""))


def split_root(table_root: bytes, part_roots: Sequence[bytes]) -> bytes:
    """A split checkpoint's ``merkle_root`` (extension ``part-roots``) from the root of the
    root's chunk table and the roots of its parts (:func:`rows_root`, in the order of ``parts``)."""
    return _digest(b"\x07" + struct.pack("<Q", len(part_roots)) + table_root + b"".join(part_roots))
