"""The rows of format 1.0's chunk tables kept as columns, made into chunks when read.

A :class:`Chunk` object and its strings take ten times or more the bytes its row takes in
the manifest; the decoded columns (NumPy arrays and the digests' bytes) take about two or
three. :class:`Table` holds one decoded chunk table (the root's or a part's); :class:`Rows`,
an array's ``chunks``, is a read-only sequence over its rows in one or more tables, equal
to the tuple of their chunks, each chunk made when it is read and not kept (as version
5's ``Slabs``).
"""
from __future__ import annotations

from typing import (Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple,
                    Union, overload)

import numpy as np

from .model import Chunk, Pipeline, make_chunk

#: chunks made from the columns at a time (bounds the per-field lists made for them)
_BLOCK = 4096
#: up to this many rows are made one at a time, from single items of the columns
_FEW = 8


class Table:
    """One decoded chunk table: per row its source, offset, length, codec and box (start
    then shape, from ``box_at``, ``nd`` values each), whether that box is its whole array
    (``whole``), and the digests' bytes (CRC-32C u32 LE of every row, then the 16-byte
    XXH3-128 digests); ``part``: the index of the part it is, -1 for the root's."""

    __slots__ = ("source", "offset", "length", "codec", "box", "box_at", "nd", "whole",
                 "digests", "names", "base_of", "codecs", "part")

    def __init__(self, source: np.ndarray, offset: np.ndarray, length: np.ndarray,
                 codec: np.ndarray, box: np.ndarray, box_at: np.ndarray, nd: np.ndarray,
                 whole: np.ndarray, digests: bytes, names: List[str],
                 base_of: List[Optional[str]], codecs: Sequence[Pipeline]) -> None:
        self.source, self.offset, self.length, self.codec = source, offset, length, codec
        self.box, self.box_at, self.nd, self.whole = box, box_at, nd, whole
        self.digests = digests
        self.names, self.base_of, self.codecs = names, base_of, codecs
        self.part = -1

    def chunks(self, ks: np.ndarray) -> Iterator[Chunk]:
        """The chunks of rows ``ks``, in order, made a block at a time (no list of a field
        for every row is ever held)."""
        if len(ks) <= _FEW:  # (the common case: an array of one chunk; fancy indexing
            for k in ks.tolist():  # the columns costs more than reading a few items)
                yield self.chunk(k)
            return
        for at in range(0, len(ks), _BLOCK):
            yield from self._block(ks[at:at + _BLOCK])

    def _block(self, ks: np.ndarray) -> List[Chunk]:
        """The chunks of rows ``ks``, each column read once for all of them."""
        n = len(self.offset)
        two = 2 * self.nd[ks].astype(np.int64)  # box values per row
        ends = np.cumsum(two)
        boxes = self.box[np.repeat(self.box_at[ks] - (ends - two), two) +
                         np.arange(int(ends[-1]) if len(ends) else 0)].tolist()
        crcs = np.frombuffer(self.digests, "<u4", n)[ks].tolist()
        hashes = np.frombuffer(self.digests, np.uint8, 16 * n, 4 * n).reshape(n, 16)[ks] \
            .tobytes().hex()
        names, base_of, codecs = self.names, self.base_of, self.codecs
        out: List[Chunk] = []
        b = 0
        for j, (s, off, ln, c, crc, d) in enumerate(zip(
                self.source[ks].tolist(), self.offset[ks].tolist(), self.length[ks].tolist(),
                self.codec[ks].tolist(), crcs, self.nd[ks].tolist())):
            out.append(make_chunk(names[s], off, ln, tuple(boxes[b:b + d]),
                                  tuple(boxes[b + d:b + 2 * d]), codecs[c], "crc32c:%08x" % crc,
                                  "xxh3-128:" + hashes[32 * j:32 * j + 32], base_of[s]))
            b += 2 * d
        return out

    def chunk(self, k: int) -> Chunk:
        """The chunk of row ``k``, its fields read one by one."""
        d, b, s = self.nd.item(k), self.box_at.item(k), self.source.item(k)
        values = self.box[b:b + 2 * d].tolist()
        h = 4 * len(self.offset) + 16 * k
        return make_chunk(self.names[s], self.offset.item(k), self.length.item(k),
                          tuple(values[:d]), tuple(values[d:]), self.codecs[self.codec.item(k)],
                          "crc32c:%08x" % int.from_bytes(self.digests[4 * k:4 * k + 4], "little"),
                          "xxh3-128:" + self.digests[h:h + 16].hex(), self.base_of[s])

    def corners(self, ks: np.ndarray, ndim: int) -> Tuple[np.ndarray, np.ndarray]:
        """The starts and ends (int64, one row of ``ndim`` each) of rows ``ks`` (all of
        one array of ``ndim`` dimensions)."""
        at = self.box_at[ks][:, None] + np.arange(ndim)
        starts = self.box[at].astype(np.int64)
        return starts, starts + self.box[at + ndim].astype(np.int64)

    def bases_used(self) -> Iterable[Tuple[str, str]]:
        """The (base, file) pairs of the table's rows stored in a base."""
        used = np.bincount(self.source, minlength=len(self.names))  # (np.unique imports numpy.ma)
        return ((b, self.names[s]) for s in np.flatnonzero(used).tolist()
                if (b := self.base_of[s]) is not None)


class Rows(Sequence[Chunk]):
    """The chunks of an array: its rows ``order[lo:hi]`` of a :class:`Table`, then those of
    ``rest`` (rows in further tables: parts), in order; a read-only sequence equal to the
    tuple of them, each chunk made from the columns when it is read. (Five slots, no
    tuples or array views of its own: a manifest may list a million arrays.)"""

    __slots__ = ("_table", "_order", "_lo", "_hi", "_rest")

    def __init__(self, table: Optional[Table], order: Optional[np.ndarray], lo: int, hi: int,
                 rest: Optional[Rows] = None) -> None:
        self._table, self._order, self._lo, self._hi, self._rest = table, order, lo, hi, rest

    def _segments(self) -> Iterator[Tuple[Table, np.ndarray]]:
        """(table, row indices) of each table holding rows, in order."""
        r: Optional[Rows] = self
        while r is not None:
            if r._table is not None and r._order is not None and r._hi > r._lo:
                yield r._table, r._order[r._lo:r._hi]
            r = r._rest

    def segments(self) -> List[Tuple[Table, np.ndarray]]:
        """(table, row indices) of each table holding rows of the array, in order."""
        return list(self._segments())

    def __len__(self) -> int:
        return self._hi - self._lo + (len(self._rest) if self._rest is not None else 0)

    def __iter__(self) -> Iterator[Chunk]:
        t = self._table
        if self._rest is None and t is not None and self._order is not None \
                and self._hi - self._lo == 1:  # (the common case: one chunk)
            return iter((t.chunk(self._order.item(self._lo)),))
        return self._chunks()

    def _chunks(self) -> Iterator[Chunk]:
        for table, ks in self._segments():
            yield from table.chunks(ks)

    @overload
    def __getitem__(self, k: int) -> Chunk: ...

    @overload
    def __getitem__(self, k: slice) -> Tuple[Chunk, ...]: ...

    def __getitem__(self, k: Union[int, slice]) -> Union[Chunk, Tuple[Chunk, ...]]:
        n = len(self)
        if isinstance(k, slice):
            return tuple(self[i] for i in range(n)[k])
        k = k + n if -n <= k < 0 else k
        if not 0 <= k < n:
            raise IndexError("chunk index out of range")
        for table, ks in self._segments():
            if k < len(ks):
                return next(table.chunks(ks[k:k + 1]))
            k -= len(ks)
        raise AssertionError("unreachable")  # pragma: no cover

    def corners(self, ndim: int) -> Tuple[np.ndarray, np.ndarray]:
        """Every chunk's start and end (int64 arrays of ``len(self)`` rows, ``ndim``
        columns), from the columns."""
        got = [t.corners(ks, ndim) for t, ks in self._segments()]
        if not got:
            return np.zeros((0, ndim), np.int64), np.zeros((0, ndim), np.int64)
        if len(got) == 1:
            return got[0]
        return (np.concatenate([s for s, _ in got]).reshape(-1, ndim),
                np.concatenate([e for _, e in got]).reshape(-1, ndim))

    def whole(self) -> bool:
        """Is this one chunk whose box is the whole array?"""
        return self._rest is None and self._table is not None and self._order is not None \
            and self._hi - self._lo == 1 \
            and bool(self._table.whole.item(self._order.item(self._lo)))

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, (tuple, Rows)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"Rows({len(self)} chunks)"


def made(seqs: Sequence[Sequence[Chunk]]) -> List[List[Chunk]]:
    """The chunks of each of ``seqs`` (arrays' ``chunks``) as lists, the rows of
    :class:`Rows` of one table made together, each column read once: a load's plan,
    which holds the chunks of every array it reads anyway, asks for them this way."""
    out: List[List[Chunk]] = [[] for _ in seqs]
    groups: Dict[int, Tuple[Table, np.ndarray, List[Tuple[int, int, int]]]] = {}
    for i, r in enumerate(seqs):
        if type(r) is Rows and r._rest is None and r._table is not None \
                and r._order is not None:
            if r._hi > r._lo:  # (the rows of one order array are all of one table)
                groups.setdefault(id(r._order), (r._table, r._order, []))[2].append(
                    (i, r._lo, r._hi))
        else:
            out[i] = list(r)
    for table, order, spans in groups.values():
        lo = np.array([a for _, a, _ in spans], np.int64)
        counts = np.array([b for _, _, b in spans], np.int64) - lo
        ends = np.cumsum(counts)
        ks = order[np.repeat(lo - (ends - counts), counts) + np.arange(int(ends[-1]))]
        chunks = [c for at in range(0, len(ks), _BLOCK) for c in table._block(ks[at:at + _BLOCK])]
        for (i, _, _), a, b in zip(spans, (ends - counts).tolist(), ends.tolist()):
            out[i] = chunks[a:b]
    return out
