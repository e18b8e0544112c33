"""Limits on hostile input: how much work and memory reading an input may cost.

An input of a few hundred bytes can describe a tree of a billion nodes (a pickle
whose lists refer to one another, HDF5 groups hard-linked many times over), a
tensor far larger than its storage (a stride of 0), or data that inflates a
thousandfold. Readers check these *before* doing the work:

``max_nodes``
    nodes of the tree once shared references are expanded (containers, dict keys,
    values, arrays). Default: 100,000 or 4 per byte of the structure that
    describes the tree (the pickle, the HDF5 file), whichever is more. A tree
    that has no shared containers has at most about one node per byte.
``max_ratio``
    bytes a reader may produce per byte stored: a compressed HDF5 dataset, a
    tensor whose strides repeat elements of its storage, a deflated zip member, the
    largest array of a uckpt source per byte of all its data files (Zstandard frames
    expand up to 32,768 times). Default 1032, the most deflate can expand. (A deflated
    zip member is held to 1032 whatever this says: deflate cannot produce more.)
``max_depth``
    nesting depth of the tree: 200, as uckpt checkpoints (not a knob).

Each can be raised for a legitimate input: ``uckpt convert --max-nodes N
--max-ratio R`` (also ``uckpt diff``), ``convert(..., limits=Limits(...))``, or
the environment variables ``UCKPT_CONVERT_MAX_NODES`` / ``UCKPT_CONVERT_MAX_RATIO``.
A reader takes the limits in force when the input is opened.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional

from ..tree.flatten import MAX_DEPTH
from .errors import InvalidLimitError, LimitExceededError

NODES_FLOOR = 100_000
NODES_PER_BYTE = 4
DEFAULT_RATIO = 1032
ENV_NODES = "UCKPT_CONVERT_MAX_NODES"
ENV_RATIO = "UCKPT_CONVERT_MAX_RATIO"
HOW = {"max_nodes": f"--max-nodes N (limits=Limits(max_nodes=N), or {ENV_NODES}=N)",
       "max_ratio": f"--max-ratio R (limits=Limits(max_ratio=R), or {ENV_RATIO}=R)"}


def _env(name: str) -> Optional[int]:
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise InvalidLimitError(f"{name}={text!r} is not a positive integer",
                                hint=f"unset {name}, or set it to a number of at least 1")
    return value


@dataclass(frozen=True)
class Limits:
    """Limits on what reading an input may cost (see the module docstring).

    ``max_nodes`` None: 100,000 or 4 per byte of the input's structure, whichever is more.
    ``max_ratio`` None: 1032 (or the environment variable).
    """

    max_nodes: Optional[int] = None
    max_ratio: Optional[int] = None

    def __post_init__(self) -> None:
        for name in ("max_nodes", "max_ratio"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 1):
                raise InvalidLimitError(f"{name} must be a positive int, not {value!r}")

    def node_budget(self, structure_bytes: int) -> int:
        if self.max_nodes is not None:
            return self.max_nodes
        from_env = _env(ENV_NODES)
        if from_env is not None:
            return from_env
        return max(NODES_FLOOR, NODES_PER_BYTE * structure_bytes)

    @property
    def ratio(self) -> int:
        if self.max_ratio is not None:
            return self.max_ratio
        return _env(ENV_RATIO) or DEFAULT_RATIO


_CURRENT: ContextVar[Optional[Limits]] = ContextVar("uckpt_convert_limits", default=None)


def current() -> Limits:
    """The limits in force (those of :func:`using`, else the defaults and environment)."""
    return _CURRENT.get() or Limits()


@contextmanager
def using(limits: Optional[Limits]) -> Iterator[Limits]:
    """Readers opened inside this block take ``limits`` (None: keep the ones in force)."""
    token = _CURRENT.set(limits or current())
    try:
        yield current()
    finally:
        _CURRENT.reset(token)


def exceeded(where: str, what: str, limit: str) -> LimitExceededError:
    return LimitExceededError(
        f"{where}: {what}; refused before doing the work", path=where, limit=limit,
        hint=f"if the input is legitimate, raise the limit: {HOW[limit]}")


def check_ratio(produced: int, stored: int, what: str, where: str, limits: Limits) -> None:
    """Refuse ``what`` when it makes more than ``max_ratio`` bytes per byte stored."""
    if produced > max(stored, 1) * limits.ratio:
        raise exceeded(where, f"{what} makes {produced} bytes out of {stored} stored, more "
                              f"than {limits.ratio} per byte", "max_ratio")


# -- trees with shared references -----------------------------------------------------------------
def _too_many(where: str, what: str, budget: int, structure_bytes: int,
              limits: Limits) -> LimitExceededError:
    rule = "as set" if limits.max_nodes is not None or _env(ENV_NODES) is not None else \
        f"for {structure_bytes} bytes: {NODES_FLOOR:,} or {NODES_PER_BYTE} per byte, " \
        "whichever is more"
    return exceeded(where, f"{what} has more than {budget:,} nodes once its shared references "
                           f"are expanded (the limit {rule})", "max_nodes")


def _cycle(where: str, what: str) -> LimitExceededError:
    return LimitExceededError(f"{where}: {what} contains itself (a reference cycle), which no "
                              "checkpoint format can hold", path=where, limit="cycle")


def _children(node: Any) -> Optional[List[Any]]:
    kind = type(node)
    if kind is list or kind is tuple:
        return node  # type: ignore[return-value]
    if kind is dict:
        return [*node, *node.values()]
    more = getattr(kind, "graph_children", None)  # stand-ins holding more than their items
    if more is not None:
        return more(node)
    if isinstance(node, dict):
        return [*node, *node.values()]
    if isinstance(node, (list, tuple)):
        return list(node)
    return None


def check_graph(root: Any, structure_bytes: int, where: str, limits: Limits,
                what: str = "the tree") -> int:
    """Count the nodes of ``root`` as if every shared reference were expanded, without
    expanding anything (each container is visited once); refuse cycles, nesting deeper
    than ``MAX_DEPTH`` and more nodes than the budget. Returns the count.

    Containers are dicts (keys and values count), lists, tuples and objects with a
    ``graph_children()`` method; anything else is one node.
    """
    budget = limits.node_budget(structure_bytes)
    size: Dict[int, int] = {}
    open_: set = set()  # containers whose items are being counted (the current path)
    stack: List[tuple] = [(root, 0, False)]
    while stack:
        node, depth, done = stack.pop()
        kids = _children(node)
        key = id(node)
        if done:
            open_.discard(key)
            total = 1
            for kid in kids:
                total += size.get(id(kid), 1) if _children(kid) is not None else 1
            size[key] = total
            if total > budget:
                raise _too_many(where, what, budget, structure_bytes, limits)
            continue
        if kids is None or key in size:
            continue  # an atom (only the root can be one here), or counted already
        if key in open_:
            raise _cycle(where, what)
        if depth > MAX_DEPTH:
            raise LimitExceededError(f"{where}: {what} nests deeper than {MAX_DEPTH} levels",
                                     path=where, limit="max_depth")
        open_.add(key)
        stack.append((node, depth, True))
        for kid in kids:
            if _children(kid) is None:
                continue  # one node, counted with its container
            if id(kid) in open_:
                raise _cycle(where, what)
            stack.append((kid, depth + 1, False))
    return size.get(id(root), 1)


def budget_counter(structure_bytes: int, where: str, limits: Limits,
                   what: str) -> Callable[[int], None]:
    """``add(n)``: count ``n`` more nodes of a tree read piece by piece (HDF5); raises past
    the budget."""
    budget = limits.node_budget(structure_bytes)
    seen = [0]

    def add(n: int) -> None:
        seen[0] += n
        if seen[0] > budget:
            raise _too_many(where, what, budget, structure_bytes, limits)
    return add
