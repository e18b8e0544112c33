"""The interchange between formats: an ordered tree of lazy leaves.

A reader turns its input into a :class:`Tree` whose ``root`` is built of

* ``dict`` (keys all ``str`` or all ``int``, in order), ``list``, ``tuple``;
* :class:`Obj`: a framework object saved by a uckpt adapter (its class and its state);
* :class:`Leaf`: an array that knows its neutral dtype and shape and reads itself
  only when asked (one leaf in memory at a time keeps conversions bounded);
* plain values: ``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``.

The same :class:`Leaf` object at two places is one array stored twice (tied
weights). ``Tree.extras`` maps a node's path to what some format keeps beside
the tree (HDF5 attributes, an ``OrderedDict``'s pickled attributes, a uckpt
checkpoint's step and metadata); writers keep what they understand.

Paths are uckpt's array paths (``docs/format.md`` section 8.1): components
joined with ``/``, ``~`` and ``/`` inside a component written ``~0`` and ``~1``.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from .. import dtypes
from ..errors import CorruptCheckpointError, UnsupportedObjectError
from ..tree.flatten import MAX_DEPTH, escape, join
from .unpickler import Sealed

PLAIN = (type(None), bool, int, float, str, bytes)
MAX_NDIM = 64 if int(np.__version__.split(".")[0]) >= 2 else 32  # NumPy's limit


def check_shape(shape: Any, itemsize: int, where_: str, what: str) -> Tuple[int, ...]:
    """``shape`` as a tuple, if NumPy can hold an array of it: at most 64 dimensions, each
    an int >= 0, fewer than 2**63 bytes in all. Raises :class:`CorruptCheckpointError`."""
    ok = isinstance(shape, (tuple, list)) and len(shape) <= MAX_NDIM and \
        all(type(n) is int and 0 <= n < (1 << 63) for n in shape)
    if ok and math.prod(shape) * itemsize >= (1 << 63):
        ok = False
    if not ok:
        text = repr(tuple(shape)) if isinstance(shape, (tuple, list)) else repr(shape)
        raise CorruptCheckpointError(
            f"{where_}: {what} has a shape no array can have: {text[:120]}", path=where_,
            hint=f"a shape is at most {MAX_NDIM} sizes >= 0 of fewer than 2**63 bytes in all")
    return tuple(shape)


def contiguous(arr: np.ndarray) -> np.ndarray:
    """``arr`` in C order, keeping its shape (``np.ascontiguousarray`` makes 0-d arrays 1-d)."""
    return arr if arr.flags.c_contiguous else arr.copy(order="C")


@dataclass(eq=False)
class Leaf(Sealed):
    """An array of neutral ``dtype`` and ``shape`` that ``reader()`` produces on demand.

    ``kind`` is ``"array"``, or ``"scalar"`` for a NumPy scalar (a 0-d array given
    back as ``np.float32(...)`` and so on). ``stream(nbytes)``, where the source has one,
    gives the array's bytes as :meth:`blocks` does, in memory bounded by a constant;
    ``span(start, count)`` a run of its flat elements.
    """

    dtype: str
    shape: Tuple[int, ...]
    reader: Callable[[], np.ndarray] = field(repr=False)
    kind: str = "array"
    stream: Optional[Callable[[int], Iterator[np.ndarray]]] = field(default=None, repr=False)
    #: ``span(start, count)``, where the source has one: elements ``[start, start + count)``
    #: of the flat array, read alone (a slice of a partition without reading all of it)
    span: Optional[Callable[[int, int], np.ndarray]] = field(default=None, repr=False)

    @property
    def nbytes(self) -> int:
        return dtypes.nbytes(self.dtype, self.shape)

    def read(self) -> np.ndarray:
        """The array: C-contiguous, little-endian, of exactly this dtype and shape."""
        arr = self.reader()
        want = dtypes.to_numpy(self.dtype)
        if arr.dtype != want or tuple(arr.shape) != tuple(self.shape):
            raise CorruptCheckpointError(
                f"a {self.dtype} array of shape {tuple(self.shape)} was expected, "
                f"{arr.dtype} of shape {tuple(arr.shape)} was read")
        return contiguous(arr)

    def blocks(self, nbytes: int) -> Iterator[np.ndarray]:
        """The array's bytes in flat C order (little-endian), as flat uint8 arrays of at
        most ``nbytes`` (each valid until the next is asked for): streamed where the leaf
        can (``stream``), else read whole (:meth:`read`) and cut."""
        if self.stream is None:
            flat = self.read().reshape(-1).view(np.uint8)
            for at in range(0, len(flat), nbytes):
                yield flat[at:at + nbytes]
            return
        done = 0
        for block in self.stream(nbytes):
            done += len(block)
            if done > self.nbytes:
                break
            yield block
        if done != self.nbytes:
            raise CorruptCheckpointError(
                f"a {self.dtype} array of shape {tuple(self.shape)} ({self.nbytes} bytes) "
                f"was expected, {'more' if done > self.nbytes else done} bytes were read")

    @classmethod
    def of(cls, arr: np.ndarray, kind: str = "array") -> "Leaf":
        """A leaf holding an array already in memory."""
        arr = contiguous(dtypes.as_little_endian(np.asarray(arr)))
        return cls(dtypes.name_of(arr.dtype), tuple(arr.shape), lambda: arr, kind)


@dataclass
class Obj:
    """A framework object in a uckpt checkpoint (an ``object`` node): adapter, class, state."""

    adapter: str
    cls: str
    state: Any


@dataclass
class Tree:
    """What a reader found: the tree, what formats keep beside it, and what it had to change."""

    root: Any
    format: str
    extras: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)  # warnings raised while reading
    closers: List[Callable[[], None]] = field(default_factory=list, repr=False)

    def close(self) -> None:
        while self.closers:
            self.closers.pop()()

    def __enter__(self) -> "Tree":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextmanager
def reading(fmt: str, *closers: Callable[[], None]) -> Iterator[Tree]:
    """An empty tree for a reader to fill; closed (files released) if reading fails."""
    tree = Tree(None, fmt, closers=list(closers))
    try:
        yield tree
    except BaseException:
        tree.close()
        raise


def where(parts: List[str]) -> str:
    return join(parts) or "<root>"


def children(node: Any) -> Optional[List[Tuple[str, Any]]]:
    """The (path component, child) pairs of a dict, list or tuple; None for anything else."""
    if isinstance(node, dict):
        return [(escape(key_text(k, [])), v) for k, v in node.items()]
    if isinstance(node, (list, tuple)):
        return [(str(i), v) for i, v in enumerate(node)]
    return None


def walk(root: Any) -> Iterator[Tuple[List[str], Any]]:
    """Every node, depth first, with its path components (containers before their items;
    an :class:`Obj` adds no path component)."""
    stack: List[Tuple[List[str], Any, int]] = [([], root, 0)]
    while stack:
        parts, node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise UnsupportedObjectError(f"the tree nests deeper than {MAX_DEPTH} levels at "
                                         f"{where(parts)!r}")
        yield parts, node
        if isinstance(node, Obj):
            stack.append((parts, node.state, depth + 1))
            continue
        for name, child in reversed(children(node) or []):
            stack.append((parts + [name], child, depth + 1))


def leaves(root: Any) -> Iterator[Tuple[str, Leaf]]:
    """(path, leaf) for every array leaf, in tree order (a shared leaf once per place)."""
    for parts, node in walk(root):
        if isinstance(node, Leaf):
            yield join(parts), node


def unique_leaves(root: Any) -> List[Tuple[str, Leaf]]:
    """``(path, leaf)`` of every leaf under ``root``, an aliased one (tied weights) once."""
    seen, out = set(), []
    for path, leaf in leaves(root):
        if id(leaf) not in seen:
            seen.add(id(leaf))
            out.append((path, leaf))
    return out


def nest(items: List[Tuple[str, Any]], notes: List[str], what: str,
         split: Callable[[str], Sequence[Any]] = lambda name: name.split("/")) -> Dict[Any, Any]:
    """Flat names (``a/b/c``, or whatever ``split`` makes of them) to nested dicts.

    Values are leaves and plain values, never dicts. When a name is also the group of
    another (``a`` and ``a/b``), nothing is nested and a note says so: no name is lost.
    """
    root: Dict[Any, Any] = {}
    for name, value in items:
        parts = split(name)
        node = root
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                break
        else:
            if parts[-1] not in node:
                node[parts[-1]] = value
                continue
        notes.append(f"{what}: {name!r} is both an entry and a group of entries; "
                     "all names are kept flat")
        return dict(items)
    return root


# -- plain values ---------------------------------------------------------------------------
def check_plain(value: Any, parts: List[str]) -> None:
    """Refuse what no format can hold: other types, text that is not valid Unicode (an
    unpaired surrogate), ints too long to write as decimal text (over 4,300 digits)."""
    if not isinstance(value, PLAIN):
        raise UnsupportedObjectError(
            f"{where(parts)!r} holds a {type(value).__module__}.{type(value).__qualname__}, "
            "which no checkpoint format here can hold",
            hint="values may be arrays, None, bool, int, float, str, bytes and "
                 "dicts, lists and tuples of them", leaf=join(parts))
    _check_text(value, parts, "holds")


def _check_text(value: Any, parts: List[str], what: str) -> str:
    """``value`` as text, if every format can write it (see :func:`check_plain`)."""
    try:
        if isinstance(value, str):
            value.encode("utf-8")
            return value
        return str(value)
    except (UnicodeError, ValueError) as e:  # a surrogate; an int of over 4,300 digits
        raise UnsupportedObjectError(
            f"{where(parts)!r} {what} a {type(value).__name__} that cannot be written as "
            f"text: {e}", leaf=join(parts)) from None


def key_text(key: Any, parts: List[str]) -> str:
    """A dict key as the (unescaped) text of its path component."""
    return _check_text(key, parts, "has a key of type")


def same_value(a: Any, b: Any) -> bool:
    """Equal values of the same type (NaN equals NaN; 1 and 1.0 and True differ)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b
