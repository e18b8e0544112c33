"""The compact listing of an evenly cut array (format version 5, docs/format.md section 15).

An array cut into slabs of ``rows`` along one ``axis`` is listed as one ``grid`` object:
the slabs' boxes follow from the array's shape, and their per-chunk fields are two
binary columns in Base64: ``digests`` (CRC-32C ``u32`` each, then the 16-byte content
hashes) and ``layout`` (a zlib stream of the offset, length, source and codec columns,
each stored as byte planes). :func:`decode` checks and reads one back (every size and
count checked before anything is decoded or allocated); version 6's table shares
:func:`read_columns`.
"""
from __future__ import annotations

import math
import zlib
from collections.abc import Sequence as _Sequence
from typing import (TYPE_CHECKING, Any, Callable, Dict, Iterable, Iterator, List, NamedTuple,
                    Optional, Tuple, Union, overload)

import numpy as np
from numpy.typing import NDArray

from ..chunk_table import read_sources
from ..columns import b64_length, b64decode
from ..model import Chunk, FileEntry, Pipeline
from ..values import MAX_INT

if TYPE_CHECKING:
    from .parser import _Parser

#: what makes a chunk of its fields (:func:`uckpt.format.model.make_chunk`)
MakeChunk = Callable[[str, int, int, Tuple[int, ...], Tuple[int, ...], Pipeline, str, str,
                      Optional[str]], Chunk]
#: a box: ``(start, shape)``
Box = Tuple[Tuple[int, ...], Tuple[int, ...]]
#: a column of unsigned integers, one per chunk
Column = NDArray[np.unsignedinteger[Any]]

FIELDS = ("axis", "rows", "count", "sources", "layout", "digests")
CODEC_NUMBERS = ("raw", "zstd", "zstd+bytegroup")  # the codec column's values, in order
PIPELINES = ((), ("zstd",), ("bytegroup", "zstd"))  # the 1.0 pipeline of each
DIGEST_BYTES = 20  # per slab: u32 CRC-32C + 16-byte XXH3-128 digest
LAYOUT_BYTES = 21  # per slab: u64 offset + u64 length + u32 source + u8 codec
_COLUMNS = (("offset", 8), ("length", 8), ("source", 4), ("codec", 1))


def _slab_shape(shape: Tuple[int, ...], axis: int, rows: int, k: int) -> Tuple[int, ...]:
    shape = tuple(shape)
    return shape[:axis] + (min(rows, shape[axis] - k * rows),) + shape[axis + 1:]


def decode(p: _Parser, g: Any, loc: str, dtype_size: int, shape: Tuple[int, ...],
           files: Dict[str, FileEntry], bases: Dict[str, Dict[str, int]],
           chunk_cls: MakeChunk, max_ratio: int) -> Slabs:
    """Check grid object ``g`` of array entry ``loc`` (an array of ``shape``, elements of
    ``dtype_size`` bytes) and return its chunks (``chunk_cls``) in slab order. ``p`` is
    the manifest parser (its ``fail``, ``need``, ``nat``, ``fields``, ``plain_name``,
    ``codecs``); ``max_ratio``: raw bytes per stored byte a compressed chunk may hold;
    ``files``: name -> FileEntry; ``bases``: base -> file -> size."""
    at = loc + ".grid"
    p.need(g, at, dict, "a grid object")
    p.fields(g, at, FIELDS)
    if not shape:
        p.fail(at, "a 0-d array cannot be cut into slabs; list its chunk in 'chunks'")
    axis = p.nat(g["axis"], at + ".axis")
    if axis >= len(shape):
        p.fail(at + ".axis", f"axis {axis} is not below the array's {len(shape)} dimensions")
    rows = p.nat(g["rows"], at + ".rows")
    if rows < 1:
        p.fail(at + ".rows", "must be at least 1")
    n = p.nat(g["count"], at + ".count")
    extent = shape[axis]
    if n < 1 or n != -(-extent // rows) or 0 in shape:
        p.fail(at + ".count", f"{n} slabs, but an array of shape {list(shape)} cut every {rows} "
                              f"along axis {axis} has {-(-extent // rows)}"
               + (" (an empty array is listed with 'chunks')" if 0 in shape else ""))
    row_bytes = dtype_size * math.prod(shape) // extent
    last = extent - (n - 1) * rows

    def expected() -> NDArray[np.uint64]:  # (made once the text lengths have been checked)
        out = np.full(n, rows * row_bytes if n > 1 else 0, dtype=np.uint64)
        out[-1] = last * row_bytes
        return out

    cols = read_columns(p, g, at, n, files, bases, expected, max_ratio, _slab)
    return Slabs(cols, chunk_cls, shape, axis, rows)


def _slab(k: int) -> str:
    return f"slab {k}"


class Slabs(_Sequence[Chunk]):
    """The chunks of a grid, in slab order: a read-only sequence equal to the tuple of
    them, each chunk made from the compact columns when it is read and not kept (a chunk
    object and its strings take ten times the bytes of its slab in the manifest)."""

    __slots__ = ("_cols", "_make", "_shape", "_axis", "_rows")

    def __init__(self, cols: "Columns", chunk_cls: MakeChunk, shape: Tuple[int, ...], axis: int,
                 rows: int) -> None:
        self._cols, self._make = cols, chunk_cls
        self._shape, self._axis, self._rows = shape, axis, rows

    def __len__(self) -> int:
        return len(self._cols.offset)

    def _boxes(self, ks: Iterable[int]) -> Iterator[Box]:
        shape, axis, rows = self._shape, self._axis, self._rows
        before, after = (0,) * axis, (0,) * (len(shape) - axis - 1)
        full = shape[:axis] + (rows,) + shape[axis + 1:]
        last = len(self) - 1
        for k in ks:
            yield before + (k * rows,) + after, full if k < last else \
                _slab_shape(shape, axis, rows, k)

    def __iter__(self) -> Iterator[Chunk]:
        return self._cols.chunks(self._make, self._boxes(range(len(self))))

    @overload
    def __getitem__(self, k: int) -> Chunk: ...

    @overload
    def __getitem__(self, k: slice) -> Tuple[Chunk, ...]: ...

    def __getitem__(self, k: Union[int, slice]) -> Union[Chunk, Tuple[Chunk, ...]]:
        if isinstance(k, slice):
            return tuple(self[i] for i in range(len(self))[k])
        n = len(self)
        k = k + n if -n <= k < 0 else k
        if not 0 <= k < n:
            raise IndexError("slab index out of range")
        return self._cols.chunk(self._make, k, *next(self._boxes((k,))))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, (tuple, Slabs)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"Slabs({len(self)} chunks of an array of shape {list(self._shape)})"


#: chunks made from the columns at a time (bounds the per-field lists made for them)
_BLOCK = 4096


class Columns(NamedTuple):
    """The per-chunk fields the columns hold, compact (NumPy arrays and bytes) in row (slab)
    order; :meth:`chunks` makes the chunk objects from them."""
    source: Column  # index into names / base_of
    offset: Column
    length: Column
    codec: Column  # index into CODEC_NUMBERS
    digests: bytes  # the decoded ``digests`` column
    names: List[str]
    base_of: List[Optional[str]]

    def chunk(self, chunk_cls: MakeChunk, k: int, start: Tuple[int, ...],
              shape: Tuple[int, ...]) -> Chunk:
        """``chunk_cls`` of row (slab) ``k``, of box ``start``, ``shape``."""
        n, digests, s = len(self.offset), self.digests, int(self.source[k])
        return chunk_cls(self.names[s], int(self.offset[k]), int(self.length[k]), start, shape,
                         PIPELINES[int(self.codec[k])],
                         "crc32c:%08x" % int.from_bytes(digests[4 * k:4 * k + 4], "little"),
                         "xxh3-128:" + digests[4 * n + 16 * k:4 * n + 16 * k + 16].hex(),
                         self.base_of[s])

    def chunks(self, chunk_cls: MakeChunk, boxes: Iterable[Box]) -> Iterator[Chunk]:
        """``chunk_cls`` of each row (slab), in order, of ``(start, shape)`` from ``boxes``;
        made a block at a time, so no list of a field for every row is ever held."""
        n = len(self.offset)
        names, base_of, digests = self.names, self.base_of, self.digests
        crcs = np.frombuffer(digests, "<u4", n)
        each = iter(boxes)
        for at in range(0, n, _BLOCK):
            end = min(n, at + _BLOCK)
            hexes = digests[4 * n + 16 * at:4 * n + 16 * end].hex()
            for k, (s, off, ln, c, crc) in enumerate(zip(
                    self.source[at:end].tolist(), self.offset[at:end].tolist(),
                    self.length[at:end].tolist(), self.codec[at:end].tolist(),
                    crcs[at:end].tolist())):
                start, shape = next(each)
                yield chunk_cls(names[s], off, ln, start, shape, PIPELINES[c],
                                "crc32c:%08x" % crc, "xxh3-128:" + hexes[32 * k:32 * k + 32],
                                base_of[s])


def read_columns(p: _Parser, obj: Dict[str, Any], at: str, n: int,
                 files: Dict[str, FileEntry], bases: Dict[str, Dict[str, int]],
                 expected: Callable[[], NDArray[np.uint64]], max_ratio: int,
                 label: Callable[[int], str]) -> Columns:
    """Check and decode the ``sources``, ``layout`` and ``digests`` of ``obj`` (a grid or a
    table at ``at``) for ``n`` chunks whose boxes hold ``expected()`` raw bytes each
    (uint64); ``label(k)`` names chunk ``k`` in errors. Text lengths are checked before
    anything is decoded or allocated."""
    unit = label(0).split()[0]
    digests_text = p.need(obj["digests"], at + ".digests", str, "Base64 text")
    if len(digests_text) != b64_length(DIGEST_BYTES * n):  # before decoding anything
        p.fail(at + ".digests", f"{len(digests_text)} characters of Base64, but {n} {unit}s "
                                f"need {b64_length(DIGEST_BYTES * n)} ({DIGEST_BYTES} bytes a "
                                f"{unit})")
    sizes, names, base_of = _sources(p, obj["sources"], at + ".sources", n, files, bases, unit)
    layout = _inflate(p, p.need(obj["layout"], at + ".layout", str, "Base64 text"),
                      at + ".layout", LAYOUT_BYTES * n, unit)
    digests = _b64(p, digests_text, at + ".digests")
    if len(digests) != DIGEST_BYTES * n:
        p.fail(at + ".digests", f"decodes to {len(digests)} bytes, not {DIGEST_BYTES * n} "
                                f"(padding inside the text?)")
    cols: Dict[str, Column] = {}
    pos = 0
    for name, width in _COLUMNS:
        planes = np.frombuffer(layout, np.uint8, width * n, pos).reshape(width, n)
        cols[name] = np.ascontiguousarray(planes.T).view(f"<u{width}").reshape(n).astype(
            np.uint64 if width == 8 else np.uint32 if width == 4 else np.uint8)
        pos += width * n
    del layout, planes  # (decoded: not held while the chunks are made)
    offset, length, source, codec = (cols[c] for c, _ in _COLUMNS)
    _check_columns(p, at, offset, length, source, codec, len(names), p.codecs, label)
    # every chunk within its file (both terms below 2**63: their sum fits uint64)
    ends = offset + length
    outside = np.flatnonzero(ends > np.array(sizes, dtype=np.uint64)[source])
    if outside.size:
        k = int(outside[0])
        p.fail(at, f"{label(k)}: bytes {int(offset[k])}..{int(ends[k])} lie outside "
                   f"{names[int(source[k])]!r} ({sizes[int(source[k])]} bytes)")
    _check_lengths(p, at, length, codec, expected(), max_ratio, label)
    unused = np.flatnonzero(np.bincount(source.astype(np.intp), minlength=len(names)) == 0)
    if unused.size:
        p.fail(at + f".sources[{int(unused[0])}]", f"no {unit} is stored there (a writer "
                                                   "lists exactly the sources it uses)")
    return Columns(source, offset, length, codec, digests, names, base_of)


def _sources(p: _Parser, obj: Any, at: str, n: int, files: Dict[str, FileEntry],
             bases: Dict[str, Dict[str, int]], unit: str
             ) -> Tuple[List[int], List[str], List[Optional[str]]]:
    """Sizes, file names and bases of the ``sources`` of ``n`` slabs or rows (``unit``)."""
    p.need(obj, at, list, "a list of [base or null, file name] pairs")
    if not 1 <= len(obj) <= n:
        p.fail(at, f"{len(obj)} sources; {n} {unit}s have 1 to {n}")
    return read_sources(p, obj, at, files, bases)


def _b64(p: _Parser, text: str, at: str) -> bytes:
    return b64decode(p.fail, text, at)


def _inflate(p: _Parser, text: str, at: str, expected: int, unit: str) -> bytes:
    """The zlib stream of Base64 ``text`` inflated to exactly ``expected`` bytes (never more)."""
    stream = _b64(p, text, at)
    z = zlib.decompressobj()
    try:
        out = z.decompress(stream, expected + 1)
    except zlib.error as e:
        p.fail(at, f"not a zlib stream: {e}")
    if len(out) != expected or not z.eof:
        p.fail(at, f"inflates to {'more than' if len(out) > expected else 'only'} "
                   f"{min(len(out), expected)} bytes{'' if z.eof else ' (the stream is cut short)'}"
                   f"; {expected // LAYOUT_BYTES} {unit}s need exactly {expected} "
                   f"({LAYOUT_BYTES} a {unit})")
    if z.unused_data:
        p.fail(at, f"{len(z.unused_data)} bytes follow the end of the zlib stream")
    return out


def _check_columns(p: _Parser, at: str, offset: Column, length: Column, source: Column,
                   codec: Column, nsources: int, codecs: Tuple[str, ...],
                   label: Callable[[int], str]) -> None:
    for name, values, limit in (("offset", offset, MAX_INT), ("length", length, MAX_INT),
                                ("source", source, nsources - 1)):
        bad = np.flatnonzero(values > np.uint64(limit))
        if bad.size:
            k = int(bad[0])
            p.fail(at + ".layout", f"{label(k)}: {name} {int(values[k])} "
                   + ("exceeds 2**63-1" if limit == MAX_INT else
                      f"is not an index of the {nsources} sources"))
    allowed = [i for i, c in enumerate(CODEC_NUMBERS) if c in codecs]
    bad = np.flatnonzero(~np.isin(codec, np.array(allowed, dtype=np.uint64)))
    if bad.size:
        k = int(bad[0])
        p.fail(at + ".layout", f"{label(k)}: codec number {int(codec[k])} is not one of "
                               f"{', '.join(f'{i} ({CODEC_NUMBERS[i]})' for i in allowed)}")


def _check_lengths(p: _Parser, at: str, length: Column, codec: Column,
                   expected: NDArray[np.uint64], max_ratio: int,
                   label: Callable[[int], str]) -> None:
    """Raw chunks hold exactly their box's bytes (``expected``); compressed ones at most
    32768 raw bytes per stored byte (and at least one stored byte)."""
    raw = codec == 0
    bad = np.flatnonzero(raw & (length != expected))
    if bad.size:
        k = int(bad[0])
        p.fail(at + ".layout", f"{label(k)}: a raw chunk of {int(length[k])} bytes, but "
                               f"its box holds {int(expected[k])}")
    # ceil(expected / ratio): no overflow (expected < 2**63), unlike length * ratio
    least = (expected + np.uint64(max_ratio - 1)) // np.uint64(max_ratio)
    bad = np.flatnonzero(~raw & ((length == 0) | (length < least)))
    if bad.size:
        k = int(bad[0])
        p.fail(at + ".layout", f"{label(k)}: a {CODEC_NUMBERS[int(codec[k])]} chunk of "
                               f"{int(length[k])} bytes cannot hold the {int(expected[k])} bytes "
                               f"of its box (at most {max_ratio} raw bytes per stored byte)")
