"""``select=``: which leaves of a checkpoint a partial load reads (``uckpt.load``,
``CheckpointManager.restore``; ``uckpt convert`` matches the same way).

A pattern is a glob (:func:`fnmatch.fnmatchcase`: ``*`` matches any characters, ``/``
included; ``?``, ``[seq]``) matched against the path of every leaf of the checkpoint's
tree: the array paths that :func:`uckpt.open`'s ``keys()`` lists (``"model/fc.weight"``)
and the paths of the plain values beside them (``"optimizer/param_groups/0/lr"``). A
pattern that names a node also selects every leaf below it (``"model"`` is
``"model/*"``). A leaf is selected when any pattern matches it; a pattern that matches
no leaf is an :class:`~uckpt.errors.UnknownKeyError` naming it.
"""
from __future__ import annotations

import fnmatch
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

from ..errors import OptionsError, UnknownKeyError
from ..tree.flatten import escape

#: what ``select=`` takes: one pattern or several
Patterns = Union[str, Sequence[str]]

_KEPT, _LEFT = 1, 2  # bits of a prefix's mark: leaves below it selected / not selected


def patterns_of(select: Any, what: str = "select") -> Tuple[str, ...]:
    """``select`` as a tuple of patterns; anything but a string or a non-empty list of
    strings is an :class:`~uckpt.errors.OptionsError`."""
    found = (select,) if isinstance(select, str) else tuple(select) \
        if isinstance(select, (list, tuple)) else None
    if not found or not all(isinstance(p, str) and p.strip("/") for p in found):
        raise OptionsError(f"{what}={select!r}: give a glob pattern or a list of them, each a "
                           "non-empty string", hint='e.g. select="model/*" or '
                                                    'select=["model/encoder.*", "step"]')
    return tuple(p.strip("/") for p in found)


def leaves(node: Dict[str, Any], prefix: str = "") -> Iterator[Tuple[str, Dict[str, Any]]]:
    """(leaf path, node) of every leaf of a manifest tree (arrays, bytes and plain values),
    in tree order; an object node adds no path component."""
    stack: List[Tuple[str, Dict[str, Any]]] = [(prefix, node)]
    while stack:
        path, node = stack.pop()
        kind = node["type"]
        if kind == "object":
            stack.append((path, node["state"]))
        elif kind == "dict":
            stack.extend((_child(path, escape(k)), v) for k, v in reversed(node["items"].items()))
        elif kind in ("list", "tuple"):
            stack.extend((_child(path, str(i)), v) for i, v in reversed(
                list(enumerate(node["items"]))))
        else:
            yield path, node


def _child(path: str, part: str) -> str:
    return f"{path}/{part}" if path else part


def matches(path: str, pattern: str) -> bool:
    """Does ``pattern`` select the leaf at ``path`` (a glob match, or a node above it)?"""
    return fnmatch.fnmatchcase(path, pattern) or path.startswith(pattern + "/")


def choose(paths: Iterable[str], patterns: Sequence[str], where: str) -> List[str]:
    """The ``paths`` that any of ``patterns`` selects, in order; a pattern that selects
    none raises :class:`~uckpt.errors.UnknownKeyError` naming it and the nearest paths."""
    paths = list(paths)
    hits = [False] * len(patterns)
    out = []
    for path in paths:
        hit = False
        for i, pattern in enumerate(patterns):
            if matches(path, pattern):
                hits[i] = hit = True
        if hit:
            out.append(path)
    for pattern, hit in zip(patterns, hits):
        if not hit:
            raise unknown(pattern, paths, where, "select pattern")
    return out


def unknown(key: str, paths: Sequence[str], where: str, what: str = "key") -> UnknownKeyError:
    """The error for ``key`` that names nothing in ``paths`` (of checkpoint ``where``)."""
    near = nearest(key, paths)
    have = ", ".join(repr(p) for p in (near or paths[:5]))
    return UnknownKeyError(
        f"{what} {key!r} names no leaf of {where}; "
        f"{'nearest' if near else 'it has'}: {have or 'nothing'}"
        f"{'' if near or len(paths) <= 5 else ', ...'}", leaf=key, path=where,
        hint="see the paths with `uckpt inspect CKPT` or uckpt.open(CKPT).keys()" +
             ("; a pattern is a glob (* matches across /)" if "pattern" in what else ""))


def nearest(key: str, paths: Sequence[str], n: int = 5) -> List[str]:
    """The ``n`` paths most like ``key`` (compared whole, and by their start as long as
    ``key``: a misspelt prefix ``"modle/*"`` finds ``"model/..."``), best first."""
    import difflib  # here: only a failed selection needs it

    bare = key.rstrip("*?")
    scored = []
    for path in paths:
        match = difflib.SequenceMatcher(None, bare, path)
        score = max(match.ratio(),
                    difflib.SequenceMatcher(None, bare, path[:len(bare)]).ratio())
        if score >= 0.6:
            scored.append((-score, path))
    return [path for _, path in sorted(scored)[:n]]


class Selection:
    """The leaves of a manifest ``tree`` that ``patterns`` select, and for each node path
    whether leaves below it are selected, left out, or both."""

    def __init__(self, tree: Dict[str, Any], patterns: Sequence[str], where: str) -> None:
        found = list(leaves(tree))
        self.kept = set(choose((p for p, _ in found), patterns, where))
        #: array paths (as the manifest stores them) that selected leaves hold
        self.arrays = {node["path"] for p, node in found
                       if p in self.kept and node["type"] in ("array", "bytes")}
        self._marks: Dict[str, int] = {}
        for path, _ in found:
            bit = _KEPT if path in self.kept else _LEFT
            parts = path.split("/") if path else []
            for n in range(len(parts) + 1):
                key = "/".join(parts[:n])
                self._marks[key] = self._marks.get(key, 0) | bit

    def wants(self, path: str) -> bool:
        """Whether a selected leaf is at or below node ``path``."""
        return bool(self._marks.get(path, 0) & _KEPT)

    def whole(self, path: str) -> bool:
        """Whether every leaf at or below ``path`` is selected."""
        return self._marks.get(path, 0) == _KEPT

    def prune(self, node: Dict[str, Any], path: str = "") -> Dict[str, Any]:
        """``node`` (at ``path``) with only its selected leaves: dicts keep the keys that
        hold some; an element of a list or tuple that holds none becomes None (so the
        others keep their indices)."""
        if self.whole(path):
            return node
        kind = node["type"]
        if kind == "object":
            return dict(node, state=self.prune(node["state"], path))
        if kind == "dict":
            items = {k: self.prune(v, _child(path, escape(k))) for k, v in node["items"].items()
                     if self.wants(_child(path, escape(k)))}
            return dict(node, items=items)
        if kind in ("list", "tuple"):
            return dict(node, items=[
                self.prune(v, _child(path, str(i))) if self.wants(_child(path, str(i)))
                else {"type": "value", "value": None} for i, v in enumerate(node["items"])])
        return node


def selection_of(tree: Dict[str, Any], select: Optional[Patterns], where: str
                 ) -> Optional[Selection]:
    """The :class:`Selection` of ``select`` in ``tree``, None without one."""
    return None if select is None else Selection(tree, patterns_of(select), where)
