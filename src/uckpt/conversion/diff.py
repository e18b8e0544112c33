"""``diff(a, b)``: compare two checkpoints of any supported formats, leaf by leaf.

Both are opened as trees of lazy leaves and compared by path: entries only in
one, arrays whose dtype or shape differ, arrays whose bits differ (with the
largest absolute difference and how many elements differ), plain values that
differ. Bit-exact equal arrays are not listed.

Arrays are compared one pair at a time, as two streams of their bytes in flat C
order cut into blocks of ``BLOCK_BYTES`` (``Leaf.blocks``). A leaf of a uckpt
checkpoint whose chunks tile it in flat order (one chunk, or slabs along the first
axis: what uckpt writes) streams, every chunk checked as the reader checks it, so
its side holds a constant whatever size its manifest declares; any other leaf (other
formats, uckpt arrays chunked along other axes) is read whole, under the load's
memory limit.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import zip_longest
from typing import Any, Dict, Iterator, List, Optional

import numpy as np

from .. import dtypes
from ..tree.flatten import join
from . import hf_parts, layouts
from .api import open_checkpoint
from .limits import Limits
from .interchange import Leaf, Obj, Tree, same_value, walk

_BLOCK = 1 << 20  # elements compared at a time
#: bytes of each side compared at a time (a multiple of every itemsize)
BLOCK_BYTES = 4 << 20


@dataclass
class Difference:
    path: str
    kind: str  # only_a, only_b, dtype, shape, values, value, type
    a: Optional[str] = None  # what A holds, as text
    b: Optional[str] = None
    max_abs_diff: Optional[float] = None  # kind "values"; NaN where a NaN meets a number
    differing: Optional[int] = None  # kind "values": elements whose bits differ
    size: Optional[int] = None

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"path": self.path, "kind": self.kind}
        for k in ("a", "b", "differing", "size"):
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        if self.kind == "values":
            m = self.max_abs_diff
            out["max_abs_diff"] = m if m is not None and math.isfinite(m) else str(m)
        return out

    def text(self) -> str:
        if self.kind == "only_a":
            return f"only in A: {self.path}  {self.a}"
        if self.kind == "only_b":
            return f"only in B: {self.path}  {self.b}"
        if self.kind == "values":
            return (f"values differ: {self.path}  max abs diff {self.max_abs_diff:.6g} "
                    f"({self.differing} of {self.size} elements)")
        return f"{self.kind} differs: {self.path}  {self.a} vs {self.b}"


@dataclass
class DiffReport:
    a: str
    b: str
    a_format: str
    b_format: str
    differences: List[Difference] = field(default_factory=list)
    compared: int = 0  # entries present in both

    @property
    def identical(self) -> bool:
        return not self.differences

    def to_json(self) -> Dict[str, Any]:
        return {"a": self.a, "b": self.b, "a_format": self.a_format, "b_format": self.b_format,
                "identical": self.identical, "compared": self.compared,
                "differences": [d.to_json() for d in self.differences]}


def entries(tree: Tree) -> Dict[str, Any]:
    """Every array and plain value by path; empty containers count as values."""
    out: Dict[str, Any] = {}
    for parts, node in walk(tree.root):
        if isinstance(node, Obj):
            continue
        if isinstance(node, (dict, list, tuple)):
            if not node and parts:
                out[join(parts)] = node
            continue
        out[join(parts)] = node
    return out


def describe(node: Any) -> str:
    if isinstance(node, Leaf):
        return f"{node.dtype} {tuple(node.shape)}"
    text = repr(node)
    return text if len(text) <= 60 else text[:57] + "..."


def diff(a, b, *, a_format: Optional[str] = None, b_format: Optional[str] = None,
         limits: Optional[Limits] = None) -> DiffReport:
    """Compare checkpoints ``a`` and ``b`` (any supported formats, detected from content);
    ``limits`` as for :func:`~uckpt.conversion.convert`."""
    with open_checkpoint(a, a_format, limits=limits, streaming=True) as ta, \
            open_checkpoint(b, b_format, limits=limits, streaming=True) as tb:
        report = DiffReport(str(a), str(b), ta.format, tb.format)
        ta.root, tb.root = layouts.comparable(ta.root, tb.root)  # a framework file vs uckpt
        ta.root, tb.root = hf_parts.comparable(ta.root, tb.root, ta.format, tb.format)
        ea, eb = entries(ta), entries(tb)
        for path, node in ea.items():
            if path not in eb:
                report.differences.append(Difference(path, "only_a", a=describe(node)))
                continue
            report.compared += 1
            d = compare(path, node, eb[path])
            if d is not None:
                report.differences.append(d)
        report.differences += [Difference(p, "only_b", b=describe(n))
                               for p, n in eb.items() if p not in ea]
    return report


def compare(path: str, x: Any, y: Any) -> Optional[Difference]:
    if isinstance(x, Leaf) and isinstance(y, Leaf):
        if x.dtype != y.dtype:
            return Difference(path, "dtype", a=x.dtype, b=y.dtype)
        if tuple(x.shape) != tuple(y.shape):
            return Difference(path, "shape", a=str(tuple(x.shape)), b=str(tuple(y.shape)))
        return compare_leaves(path, x, y)
    if isinstance(x, Leaf) or isinstance(y, Leaf):
        return Difference(path, "type", a=describe(x), b=describe(y))
    if isinstance(x, (dict, list, tuple)) or isinstance(y, (dict, list, tuple)):
        same = type(x) is type(y) and not x and not y
    else:
        same = same_value(x, y)
    return None if same else Difference(path, "value", a=describe(x), b=describe(y))


def _bits(arr: np.ndarray) -> np.ndarray:
    """One unsigned integer per element (two for 16-byte elements) holding its bits."""
    size = arr.dtype.itemsize
    flat = arr.reshape(-1)
    if size > 8:
        return flat.view(np.uint64).reshape(len(flat), size // 8)
    return flat.view(np.dtype(f"<u{size}"))


def _even(blocks: Iterator[np.ndarray], size: int) -> Iterator[np.ndarray]:
    """``blocks`` (flat uint8) cut again into blocks of ``size`` bytes (the last may be
    shorter): views where a block holds a whole one, else copied into one buffer; each
    valid until the next is asked for."""
    buf = np.empty(0, dtype=np.uint8)
    fill = 0
    for block in blocks:
        at, n = 0, len(block)
        while at < n:
            if not fill and n - at >= size:
                yield block[at:at + size]
                at += size
                continue
            if not len(buf):
                buf = np.empty(size, dtype=np.uint8)
            take = min(size - fill, n - at)
            buf[fill:fill + take] = block[at:at + take]
            fill, at = fill + take, at + take
            if fill == size:
                yield buf
                fill = 0
    if fill:
        yield buf[:fill]


def compare_leaves(path: str, x: Leaf, y: Leaf) -> Optional[Difference]:
    """Compare two leaves of one dtype and shape, as streams of ``BLOCK_BYTES`` blocks
    (both streams run to their end, so every chunk's check is made)."""
    kind = dtypes.to_numpy(x.dtype)
    tally = _Tally(x.dtype)
    for bx, by in zip_longest(_even(x.blocks(BLOCK_BYTES), BLOCK_BYTES),
                              _even(y.blocks(BLOCK_BYTES), BLOCK_BYTES)):
        tally.add(bx.view(kind), by.view(kind))
    return tally.difference(path, math.prod(x.shape))


class _Tally:
    """What differs between two arrays of dtype ``name``, given a pair of blocks (flat,
    typed, of equal length) at a time: how many elements differ in their bits, and the
    largest absolute difference (NaN where a NaN meets a number)."""

    def __init__(self, name: str) -> None:
        self.wide = np.complex128 if name.startswith("complex") else np.float64
        self.differing, self.largest, self.nan = 0, 0.0, False

    def add(self, x: np.ndarray, y: np.ndarray) -> None:
        bx, by = _bits(x), _bits(y)
        if np.array_equal(bx, by):
            return
        neq = bx != by
        if neq.ndim > 1:
            neq = neq.any(axis=1)
        self.differing += int(neq.sum())
        a = x[neq].astype(self.wide)
        b = y[neq].astype(self.wide)
        both_nan = np.isnan(a) & np.isnan(b)  # NaNs with different payloads
        d = np.abs(a[~both_nan] - b[~both_nan])
        if d.size:
            self.nan = self.nan or bool(np.isnan(d).any())
            real = d[~np.isnan(d)]
            if real.size:
                self.largest = max(self.largest, float(real.max()))

    def difference(self, path: str, size: int) -> Optional[Difference]:
        if not self.differing:
            return None
        return Difference(path, "values", max_abs_diff=math.nan if self.nan else self.largest,
                          differing=self.differing, size=size)


def compare_arrays(path: str, x: np.ndarray, y: np.ndarray) -> Optional[Difference]:
    """Compare two arrays in memory of one dtype and shape, ``_BLOCK`` elements at a time."""
    tally = _Tally(dtypes.name_of(x.dtype))
    fx, fy = x.reshape(-1), y.reshape(-1)
    for start in range(0, len(fx), _BLOCK):
        tally.add(fx[start:start + _BLOCK], fy[start:start + _BLOCK])
    return tally.difference(path, int(x.size))
