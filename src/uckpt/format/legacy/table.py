"""The table of arrays stored whole (format version 6, docs/format.md section 16).

Arrays that are each one chunk covering the whole array are listed as rows of one
top-level ``table``: their paths, dtypes and shapes as JSON lists, their chunks' fields
in the binary columns of a grid (:mod:`.grid`). :func:`decode` checks one and adds its
array entries to those of ``arrays`` (every list and text length checked against the
number of rows before anything is decoded).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Set, Tuple

import numpy as np

from ... import dtypes
from ..model import ArrayEntry, Chunk, FileEntry
from . import grid
from ..values import MAX_DIMS, MAX_INT
from ..values import show as _show

FIELDS = ("paths", "dtypes", "shapes", "sources", "layout", "digests")
_DTYPE = {name: name for name in dtypes.NAMES}

if TYPE_CHECKING:
    from .parser import _Parser

#: what makes an array entry of a row: ``new_entry(path, dtype, shape, chunk)``
NewEntry = Callable[[str, str, Tuple[int, ...], Chunk], ArrayEntry]


def decode(p: _Parser, t: Any, listed: Dict[str, ArrayEntry], files: Dict[str, FileEntry],
           bases: Dict[str, Dict[str, int]], chunk_cls: grid.MakeChunk, new_entry: NewEntry,
           max_ratio: int) -> None:
    """Check ``table`` object ``t`` and add its array entries to ``listed`` (path -> entry,
    those of ``arrays``), in row order.

    ``p`` is the manifest parser (its ``fail``, ``need``, ``fields``, ``plain_name``,
    ``codecs``); ``files``: name -> FileEntry;
    ``bases``: base -> file -> size; ``new_entry(path, dtype, shape, chunk)`` makes an
    array entry; ``max_ratio``: raw bytes per stored byte a compressed chunk may hold."""
    at = "table"
    p.need(t, at, dict, "a table object")
    p.fields(t, at, FIELDS)
    paths = p.need(t["paths"], at + ".paths", list, "a list of array paths")
    n = len(paths)
    if n < 1:
        p.fail(at + ".paths", "a table has at least one row (leave it out instead)")
    names = p.need(t["dtypes"], at + ".dtypes", list, "a list of dtype names")
    shapes = p.need(t["shapes"], at + ".shapes", list, "a list of shapes")
    for field, values in (("dtypes", names), ("shapes", shapes)):
        if len(values) != n:
            p.fail(f"{at}.{field}", f"{len(values)} items for {n} paths")
    _check_paths(p, at, paths, listed)
    unknown = next((k for k, d in enumerate(names) if type(d) is not str or
                    d not in dtypes.NAMES), None)
    if unknown is not None:
        p.fail(f"{at}.dtypes[{unknown}]", f"{_show(names[unknown])} is not a dtype of the "
                                          f"format ({_row(paths, unknown)})")
    names[:] = map(_DTYPE.__getitem__, names)  # the format's own strings: not one per row
    expected = np.fromiter((_nbytes(p, at, paths, k, dtypes.itemsize(names[k]), shape)
                            for k, shape in enumerate(shapes)), np.uint64, n)
    cols = grid.read_columns(p, t, at, n, files, bases, lambda: expected, max_ratio,
                             lambda k: f"row {k} ({paths[k]!r:.80})")
    for path, name, chunk in zip(paths, names, cols.chunks(chunk_cls, _boxes(shapes))):
        listed[path] = new_entry(path, name, chunk.shape, chunk)


def _boxes(shapes: List[Any]) -> Iterator[grid.Box]:
    """``(start, shape)`` of each row: one tuple per distinct shape, shared by its rows;
    each JSON list replaced as its row is made (the lists and the tuples are not both held)."""
    seen: Dict[Tuple[int, ...], Tuple[int, ...]] = {}
    zeros: Dict[int, Tuple[int, ...]] = {}
    for k, given in enumerate(shapes):
        shape = tuple(given)
        shape = seen.setdefault(shape, shape)
        shapes[k] = None
        start = zeros.get(len(shape))
        if start is None:
            start = zeros[len(shape)] = (0,) * len(shape)
        yield start, shape


def _check_paths(p: _Parser, at: str, paths: List[Any], listed: Dict[str, ArrayEntry]) -> None:
    if not all(type(path) is str for path in paths):
        k = next(k for k, path in enumerate(paths) if type(path) is not str)
        p.fail(f"{at}.paths[{k}]", f"expected an array path (a string), got {_show(paths[k])}")
    if len(set(paths)) != len(paths):
        seen: Set[str] = set()
        for k, path in enumerate(paths):
            if path in seen:
                p.fail(f"{at}.paths[{k}]", f"array {path!r:.80} is listed twice")
            seen.add(path)
    both = set(paths).intersection(listed)
    if both:
        k = next(k for k, path in enumerate(paths) if path in both)
        p.fail(f"{at}.paths[{k}]", f"array {paths[k]!r:.80} is also listed in 'arrays'")


def _nbytes(p: _Parser, at: str, paths: List[str], k: int, itemsize: int, shape: Any) -> int:
    """The bytes of row ``k``'s array (of ``shape``), each rule of section 16.2 checked."""
    if type(shape) is not list or len(shape) > MAX_DIMS:
        p.fail(f"{at}.shapes[{k}]", f"expected a list of at most {MAX_DIMS} integers, got "
                                    f"{_show(shape)} ({_row(paths, k)})")
    size = itemsize
    for n in shape:
        if type(n) is not int or not 0 < n <= MAX_INT:
            p.fail(f"{at}.shapes[{k}]", f"{_show(n)} is not a dimension of a table row: an "
                                        f"integer from 1 to 2**63-1 ({_row(paths, k)}; an "
                                        "empty array is listed in 'arrays')")
        size *= n
    if size > MAX_INT:
        p.fail(f"{at}.shapes[{k}]", f"the array holds {size} bytes, more than 2**63-1 "
                                    f"({_row(paths, k)})")
    return size


def _row(paths: List[str], k: int) -> str:
    return f"row {k}, {paths[k]!r:.80}"

