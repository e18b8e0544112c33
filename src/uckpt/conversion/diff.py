"""``diff(a, b)``: compare two checkpoints of any supported formats, leaf by leaf.

Both are opened as trees of lazy leaves and compared by path: entries only in
one, arrays whose dtype or shape differ, arrays whose bits differ (with the
largest absolute difference and how many elements differ), plain values that
differ. Arrays are read one pair at a time and compared in blocks, so memory
stays about two arrays. Bit-exact equal arrays are not listed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import numpy as np

from .. import dtypes
from ..tree import join
from . import layouts
from .api import open_checkpoint
from .limits import Limits
from .model import Leaf, Obj, Tree, same_value, walk

_BLOCK = 1 << 20  # elements compared at a time


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
    with open_checkpoint(a, a_format, limits=limits) as ta, \
            open_checkpoint(b, b_format, limits=limits) as tb:
        report = DiffReport(str(a), str(b), ta.format, tb.format)
        ta.root, tb.root = layouts.comparable(ta.root, tb.root)  # a framework file vs uckpt
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
        return compare_arrays(path, x.read(), y.read())
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


def _equal(bx: np.ndarray, by: np.ndarray) -> bool:
    """Whether the bits are equal, compared a block at a time (``np.array_equal`` of the
    whole would allocate a bool per element: for bytes, a third array)."""
    return all(np.array_equal(bx[i:i + _BLOCK], by[i:i + _BLOCK])
               for i in range(0, len(bx), _BLOCK))


def compare_arrays(path: str, x: np.ndarray, y: np.ndarray) -> Optional[Difference]:
    bx, by = _bits(x), _bits(y)
    if _equal(bx, by):
        return None
    name = dtypes.name_of(x.dtype)
    wide = np.complex128 if name.startswith("complex") else np.float64
    fx, fy = x.reshape(-1), y.reshape(-1)
    differing, largest, nan = 0, 0.0, False
    for start in range(0, len(fx), _BLOCK):
        stop = start + _BLOCK
        neq = bx[start:stop] != by[start:stop]
        if neq.ndim > 1:
            neq = neq.any(axis=1)
        differing += int(neq.sum())
        if not neq.any():
            continue
        a = fx[start:stop][neq].astype(wide)
        b = fy[start:stop][neq].astype(wide)
        both_nan = np.isnan(a) & np.isnan(b)  # NaNs with different payloads
        d = np.abs(a[~both_nan] - b[~both_nan])
        if d.size:
            nan = nan or bool(np.isnan(d).any())
            real = d[~np.isnan(d)]
            if real.size:
                largest = max(largest, float(real.max()))
    return Difference(path, "values", max_abs_diff=math.nan if nan else largest,
                      differing=differing, size=int(x.size))
