"""The chunk table of format 1.0: every chunk of a root or a part as one row of columns.

``{"count": N, "sources": [[base or null, file], ...], "layout": <Base64 of a zlib
stream>, "digests": <Base64>}``; the layout inflates to the columns array (u32), offset
(u64), length (u64), source (u32), codec (u8) and box (u64: each row's start, then its
shape), each as byte planes (:mod:`.columns`); the digests are the rows' CRC-32C
(u32) then their XXH3-128 digests (16 bytes). :func:`encode` writes a table;
:func:`decode` checks one and returns its rows as columns (:mod:`.rows`), every count and
text length checked before anything is decoded or allocated, every row rule checked on
whole columns.
"""
from __future__ import annotations

import zlib
from typing import TYPE_CHECKING, Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from ..runtime import memory
from .columns import Inflater, b64_length, b64decode, b64encode, planes, unplanes
from .model import Chunk, Pipeline
from .rows import Table
from .values import MAX_INT
from .values import show as _show

if TYPE_CHECKING:  # for annotations only: checks imports the model, which encodes through here
    from .checks import Checker

FIELDS = ("count", "sources", "layout", "digests")
DIGEST_BYTES = 20  # per row: u32 CRC-32C + 16-byte XXH3-128 digest
ROW_BYTES = 25  # per row, besides its box: u32 array, u64 offset, u64 length, u32 source, u8 codec
#: a compressed chunk decodes to at most this many bytes per stored byte (zstd's bound)
MAX_RATIO = 32768


def encode(rows: Sequence[Tuple[int, Chunk]], codec_index: Dict[Pipeline, int]) -> Dict[str, Any]:
    """The chunk table of ``rows`` (array index, chunk), in order; ``codec_index``: the
    index of each pipeline in the root's ``codecs``. The layout is deflated at level 1."""
    n = len(rows)
    sources: Dict[Tuple[Optional[str], str], int] = {}
    index = [sources.setdefault((c.base, c.file), len(sources)) for _, c in rows]
    boxes = [v for _, c in rows for v in (*c.start, *c.shape)]
    layout = b"".join((
        planes(np.fromiter((a for a, _ in rows), np.uint32, n), 4),
        planes(np.fromiter((c.offset for _, c in rows), np.uint64, n), 8),
        planes(np.fromiter((c.length for _, c in rows), np.uint64, n), 8),
        planes(np.array(index, dtype=np.uint32), 4),
        bytes(codec_index[c.codec] for _, c in rows),
        planes(np.array(boxes, dtype=np.uint64), 8)))
    crcs = np.fromiter((int(c.checksum[7:], 16) for _, c in rows), np.uint32, n)
    digests = crcs.astype("<u4").tobytes() + bytes.fromhex("".join(c.hash[9:] for _, c in rows))
    return {"count": n, "sources": [[b, f] for b, f in sources],
            "layout": b64encode(zlib.compress(layout, 1)),
            "digests": b64encode(digests)}


class Arrays(NamedTuple):
    """What the rows are checked against: the array table, decoded."""
    paths: List[str]
    shapes: List[Tuple[int, ...]]
    itemsize: np.ndarray  # uint64, per array
    ndim: np.ndarray  # int64, per array
    dims: np.ndarray  # uint64: every array's shape, one after another
    dims_at: np.ndarray  # int64: where each array's shape starts in ``dims``


def arrays_of(paths: List[str], shapes: List[Tuple[int, ...]], itemsizes: List[int]) -> Arrays:
    ndim = np.fromiter(map(len, shapes), np.int64, len(shapes))
    dims_at = np.zeros(len(shapes), np.int64)
    np.cumsum(ndim[:-1], out=dims_at[1:])
    dims = np.fromiter((d for s in shapes for d in s), np.uint64, int(ndim.sum()))
    return Arrays(paths, shapes, np.array(itemsizes, np.uint64), ndim, dims, dims_at)


def decode(p: Checker, t: Any, at: str, arrays: Arrays, codecs: Sequence[Pipeline],
           files: Dict[str, Any], bases: Dict[str, Dict[str, int]]
           ) -> Tuple[np.ndarray, Table]:
    """Check chunk table ``t`` (member ``at``) and return ``(array index of each row,
    the rows as columns)``; ``files``: name -> FileEntry; ``bases``: base -> file -> size."""
    p.need(t, at, dict, "a chunk table object")
    p.fields(t, at, FIELDS)
    n = p.nat(t["count"], at + ".count")
    digests_text = p.need(t["digests"], at + ".digests", str, "Base64 text")
    if len(digests_text) != b64_length(DIGEST_BYTES * n):  # bounds n before anything else
        p.fail(at + ".digests", f"{len(digests_text)} characters of Base64, but {n} rows "
                                f"need {b64_length(DIGEST_BYTES * n)} ({DIGEST_BYTES} bytes a row)")
    sizes, names, base_of = _sources(p, t["sources"], at + ".sources", n, files, bases)
    layout_text = p.need(t["layout"], at + ".layout", str, "Base64 text")
    z = Inflater(p.fail, b64decode(p.fail, layout_text, at + ".layout"), at + ".layout")
    array = unplanes(z.take(4 * n), 0, n, 4)
    bad = np.flatnonzero(array >= len(arrays.paths))
    if bad.size:
        k = int(bad[0])
        p.fail(at + ".layout", f"row {k}: array {int(array[k])} is not an index of the "
                               f"{len(arrays.paths)} arrays")
    ai = array.astype(np.int64)
    nd = arrays.ndim[ai]
    m = 2 * int(nd.sum())
    memory.check_table(n, m, p.where, at)
    rest = z.take(21 * n + 8 * m)
    z.end(ROW_BYTES * n + 8 * m)
    offset, length = unplanes(rest, 0, n, 8), unplanes(rest, 8 * n, n, 8)
    source, codec = unplanes(rest, 16 * n, n, 4), unplanes(rest, 20 * n, n, 1)
    box = unplanes(rest, 21 * n, m, 8)
    del rest
    digests = b64decode(p.fail, digests_text, at + ".digests")
    if len(digests) != DIGEST_BYTES * n:
        p.fail(at + ".digests", f"decodes to {len(digests)} bytes, not {DIGEST_BYTES * n} "
                                "(padding inside the text?)")

    def row(k: int) -> str:
        return f"row {k} (array {arrays.paths[int(ai[k])]!r:.80})"

    lay = at + ".layout"
    for name, values, limit in (("offset", offset, MAX_INT), ("length", length, MAX_INT),
                                ("source", source, len(names) - 1),
                                ("codec", codec, len(codecs) - 1)):
        bad = np.flatnonzero(values > np.uint64(limit)) if limit >= 0 else \
            np.arange(len(values))
        if bad.size:
            k = int(bad[0])
            p.fail(lay, f"{row(k)}: {name} {int(values[k])} " +
                   ("exceeds 2**63-1" if limit == MAX_INT else
                    f"is not an index of the {limit + 1} {name}s"))
    raw, whole = _boxes(p, lay, arrays, ai, nd, box, row)
    ends = offset + length  # (both below 2**63: no overflow)
    outside = np.flatnonzero(ends > np.array(sizes, dtype=np.uint64)[source])
    if outside.size:
        k = int(outside[0])
        p.fail(at, f"{row(k)}: bytes {int(offset[k])}..{int(ends[k])} lie outside "
                   f"{names[int(source[k])]!r} ({sizes[int(source[k])]} bytes)")
    _lengths(p, lay, length, raw, np.array([not c for c in codecs], bool)[codec], row)
    unused = np.flatnonzero(np.bincount(source.astype(np.intp), minlength=len(names)) == 0)
    if unused.size:
        p.fail(at + f".sources[{int(unused[0])}]", "no row is stored there (a writer "
                                                   "lists exactly the sources it uses)")
    box_at = np.zeros(n, np.int64)  # where each row's box starts in ``box``
    np.cumsum(2 * nd[:-1], out=box_at[1:])
    return ai, Table(source, offset, length, codec, box, box_at, nd.astype(np.uint8), whole,
                     digests, names, base_of, codecs)


def _boxes(p: Checker, lay: str, arrays: Arrays, ai: np.ndarray, nd: np.ndarray,
           box: np.ndarray, row: Any) -> Tuple[np.ndarray, np.ndarray]:
    """Check every row's box (inside its array, every extent at least 1); return each
    row's raw bytes (uint64) and whether its box is the whole array (bool)."""
    n = len(ai)
    if box.size and int(box.max()) > MAX_INT:
        k = int(np.searchsorted(np.cumsum(2 * nd), int(np.flatnonzero(box > MAX_INT)[0]),
                                side="right"))
        p.fail(lay, f"{row(k)}: a box value exceeds 2**63-1")
    at = np.zeros(n, np.int64)  # where each row's box starts in ``box``
    np.cumsum(2 * nd[:-1], out=at[1:])
    total = int(nd.sum())
    rows = np.repeat(np.arange(n), nd)
    d = np.arange(total) - np.repeat(at // 2, nd) if total else np.zeros(0, np.int64)
    start = box[np.repeat(at, nd) + d]
    extent = box[np.repeat(at, nd) + np.repeat(nd, nd) + d]
    full = arrays.dims[arrays.dims_at[ai[rows]] + d] if total else np.zeros(0, np.uint64)
    bad = np.flatnonzero((extent < 1) | (start + extent > full))
    if bad.size:
        j = int(bad[0])
        k, dim = int(rows[j]), int(d[j])
        p.fail(lay, f"{row(k)}: dimension {dim}: start {int(start[j])} and extent "
                    f"{int(extent[j])} do not lie inside the array's extent {int(full[j])} "
                    "(every extent is at least 1)")
    elements = np.ones(n, np.uint64)
    if total:
        np.multiply.at(elements, rows, extent)
    out: np.ndarray = elements * arrays.itemsize[ai]
    whole: np.ndarray = np.bincount(rows[(start != 0) | (extent != full)], minlength=n) == 0
    return out, whole


def _lengths(p: Checker, lay: str, length: np.ndarray, raw: np.ndarray, is_raw: np.ndarray,
             row: Any) -> None:
    """Raw rows hold exactly their box's bytes; compressed ones at least one byte and at
    most MAX_RATIO raw bytes per stored byte."""
    bad = np.flatnonzero(is_raw & (length != raw))
    if bad.size:
        k = int(bad[0])
        p.fail(lay, f"{row(k)}: a raw chunk of {int(length[k])} bytes, but its box holds "
                    f"{int(raw[k])}")
    least = (raw + np.uint64(MAX_RATIO - 1)) // np.uint64(MAX_RATIO)  # (no overflow)
    bad = np.flatnonzero(~is_raw & ((length == 0) | (length < least)))
    if bad.size:
        k = int(bad[0])
        p.fail(lay, f"{row(k)}: a compressed chunk of {int(length[k])} bytes cannot hold "
                    f"the {int(raw[k])} bytes of its box (at most {MAX_RATIO} raw bytes per "
                    "stored byte)")


def _sources(p: Checker, obj: Any, at: str, n: int, files: Dict[str, Any],
             bases: Dict[str, Dict[str, int]]
             ) -> Tuple[List[int], List[str], List[Optional[str]]]:
    """Sizes, file names and bases of the ``sources`` of ``n`` rows."""
    p.need(obj, at, list, "a list of [base or null, file name] pairs")
    if len(obj) > n or (n and not obj):
        p.fail(at, f"{len(obj)} sources; {n} rows have {min(n, 1)} to {n}")
    return read_sources(p, obj, at, files, bases)


def read_sources(p: Checker, obj: List[Any], at: str, files: Dict[str, Any],
                 bases: Dict[str, Dict[str, int]]
                 ) -> Tuple[List[int], List[str], List[Optional[str]]]:
    """Sizes, file names and bases of the pairs of list ``obj`` (member ``at``), each pair
    checked (a listed file, a listed base's file, no pair twice)."""
    sizes: List[int] = []
    names: List[str] = []
    base_of: List[Optional[str]] = []
    seen = set()
    for i, pair in enumerate(obj):
        here = f"{at}[{i}]"
        if type(pair) is not list or len(pair) != 2:
            p.fail(here, f"expected a pair [base or null, file name], got {_show(pair)}")
        base, name = pair
        p.need(name, here + "[1]", str, "a file name")
        if base is None:
            if name not in files:
                p.plain_name(name, here + "[1]", "file name")
                p.fail(here + "[1]", f"file {name!r} is not listed in 'files'")
            size = files[name].size
        else:
            p.need(base, here + "[0]", str, "a base checkpoint name or null")
            if base not in bases:
                p.fail(here + "[0]", f"base {base!r} is not listed in 'bases'")
            if name not in bases[base]:
                p.plain_name(name, here + "[1]", "file name")
                p.fail(here + "[1]", f"file {name!r} is not listed in 'bases'[{base!r}]")
            size = bases[base][name]
        if (base, name) in seen:
            p.fail(here, "this source is listed twice")
        seen.add((base, name))
        sizes.append(size)
        names.append(name)
        base_of.append(base)
    return sizes, names, base_of
