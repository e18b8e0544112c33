"""Comparing a live object's tree with a checkpoint's, before anything changes.

``prepare`` records the live tree with :func:`~.serializer.probe` (no copies)
and compares it, path by path, with the checkpoint's tree, in which every
array is an :class:`~uckpt.adapter.ArraySpec`. Two levels of strictness:

* :func:`compare_strict` (links, optimizers): every path must be on both
  sides, and each leaf must fit (an array of the same shape and dtype, a value
  for a value). Missing and unexpected paths raise one
  :class:`~uckpt.errors.KeyMismatchError` that lists them.
* :func:`compare_arrays` (iterators, extensions, triggers: objects whose
  entries Chainer itself treats as optional or dynamic): only leaves present
  on both sides are checked, and only arrays (an array is copied into the live
  one, so its shape and dtype must match).

A :class:`Findings` collects every problem of one object (a trainer: its
models, optimizers, iterators and extensions) and raises them as one error.
"""
from __future__ import annotations

import warnings
from typing import Any, Dict, List, Optional, Tuple, Type

import numpy as np

from uckpt.adapter import ArraySpec, class_name  # noqa: F401  (re-exported)
from uckpt.dtypes import name_of
from uckpt.errors import DtypeMismatchError, KeyMismatchError, ShapeMismatchError, \
    StateMismatchError

from .serializer import is_array

_PLAIN = (type(None), bool, int, float, str, bytes, np.generic)
Problem = Tuple[Type[StateMismatchError], str]


def flatten(tree: Any, prefix: str = "") -> Dict[str, Any]:
    """``{"a/b": leaf}`` for a nested dict; a non-dict is one leaf at ``prefix``."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: Dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            out.update(flatten(value, path))
        else:
            out[path] = value
    return out


def nest(flat: Dict[str, Any]) -> Dict[str, Any]:
    """The inverse of :func:`flatten`."""
    out: Dict[str, Any] = {}
    for path, value in flat.items():
        node = out
        parts = path.split("/")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


def _describe(leaf: Any) -> str:
    if isinstance(leaf, ArraySpec):
        return f"an array of shape {list(leaf.shape)} ({leaf.dtype})"
    if is_array(leaf):
        return f"an array of shape {list(leaf.shape)} ({name_of(leaf.dtype)})"
    if isinstance(leaf, dict):
        return "entries below this path"
    return "None" if leaf is None else f"a {type(leaf).__name__}"


def leaf_problem(path: str, live: Any, saved: Any, *, strict: bool) -> Optional[Problem]:
    """Why the saved leaf cannot be restored into the live one, or None if it can.

    Arrays must match in shape and dtype. With ``strict``, a saved None cannot
    replace a live array (the parameter was uninitialized when saved) and an
    array cannot replace a plain value or the other way round; a live None
    (an uninitialized parameter) takes anything.
    """
    if live is None:
        return None
    if is_array(live):
        if isinstance(saved, ArraySpec):
            have = name_of(live.dtype)
            if tuple(saved.shape) != tuple(live.shape):
                return ShapeMismatchError, (f"{path}: shape {list(saved.shape)} in the checkpoint, "
                                            f"{list(live.shape)} in the object")
            if not saved.fits(have):  # (its own dtype, or a cast the load's cast= allows)
                return DtypeMismatchError, (f"{path}: dtype {saved.dtype} in the checkpoint, "
                                            f"{have} in the object")
            return None
        if saved is None and not strict:
            return None
        return StateMismatchError, (f"{path}: the checkpoint holds {_describe(saved)}, the "
                                    f"object {_describe(live)}")
    if strict and (isinstance(saved, dict) or (isinstance(saved, ArraySpec) and saved.shape)):
        return StateMismatchError, (f"{path}: the checkpoint holds {_describe(saved)}, the "
                                    f"object {_describe(live)}")
    return None


class Findings:
    """Problems found while comparing one object with a checkpoint, raised together."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.missing: List[str] = []
        self.unexpected: List[str] = []
        self.problems: List[Problem] = []
        self.notes: List[str] = []  # warned about when nothing is wrong

    def add(self, problem: Optional[Problem]) -> None:
        if problem is not None:
            self.problems.append(problem)

    def report_keys(self, keys: Any) -> None:
        """Hand the missing and unexpected paths to ``keys`` (a ``strict=False`` load's
        :class:`uckpt.loading.report.KeySink`) instead of raising them."""
        for path in sorted(self.missing):
            keys.missing(path.split("/"))
        for path in sorted(self.unexpected):
            keys.unexpected(path.split("/"))
        self.missing, self.unexpected = [], []

    def raise_if_any(self, hint: Optional[str] = None) -> None:
        if self.missing or self.unexpected:
            raise KeyMismatchError(self.what, missing=self.missing, unexpected=self.unexpected,
                                   mismatched=[msg for _, msg in self.problems], hint=hint)
        if self.problems:
            classes = {cls for cls, _ in self.problems}
            cls = classes.pop() if len(classes) == 1 else StateMismatchError
            raise cls("\n".join([f"{self.what} does not match the checkpoint"]
                                + [f"  {msg}" for _, msg in self.problems]))
        for note in self.notes:
            warnings.warn(note, RuntimeWarning, stacklevel=4)


def _join(prefix: str, path: str) -> str:
    return f"{prefix}/{path}" if prefix and path else (prefix or path)


def compare_strict(live: Any, saved: Any, findings: Findings, prefix: str = "") -> Dict[str, Any]:
    """Every path on both sides, every leaf fitting; returns in-place read targets (flat)."""
    lf, sf = flatten(live), flatten(saved)
    findings.missing += [_join(prefix, p) for p in lf if p not in sf]
    findings.unexpected += [_join(prefix, p) for p in sf if p not in lf]
    targets = {}
    for path in lf.keys() & sf.keys():
        problem = leaf_problem(_join(prefix, path), lf[path], sf[path], strict=True)
        findings.add(problem)
        if problem is None and isinstance(lf[path], np.ndarray):
            targets[path] = lf[path]
    return targets


def compare_arrays(live: Any, saved: Any, findings: Findings, prefix: str = "") -> None:
    """Check the array leaves present on both sides (Chainer's optional entries)."""
    lf, sf = flatten(live), flatten(saved)
    for path in lf.keys() & sf.keys():
        findings.add(leaf_problem(_join(prefix, path), lf[path], sf[path], strict=False))


def require_dict(tree: Any, what: str) -> Dict[str, Any]:
    if not isinstance(tree, dict):
        raise StateMismatchError(f"the checkpoint holds {_describe(tree)} where {what} "
                                 "expects a tree of serialized entries")
    return tree
