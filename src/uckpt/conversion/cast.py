"""``cast=`` of ``uckpt convert``: leaves converted to another dtype as they are copied.

The policy is the one :func:`uckpt.load` applies (:class:`uckpt.loading.cast.CastPolicy`),
as in a load without ``state``: a leaf whose path the first matching pattern gives a
dtype becomes that dtype (within a kind of number, narrowing included, since it is named;
float -> integer and complex -> real are a :class:`~uckpt.errors.DtypeMismatchError`); a
leaf matched by a rule (``"safe"``, ``"same_kind"``) or by nothing keeps its own dtype, so
nothing is ever narrowed unless named. A converted leaf is converted block by block as
its source streams it (memory: a block plus the converted array, or, from a source that
reads arrays whole, that array and its converted copy: one array at a time, as every
conversion reads).
"""
from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Dict, Iterator, List

import numpy as np

from .. import dtypes
from ..loading.cast import Cast, CastPolicy
from .interchange import Leaf, Obj, children

log = logging.getLogger("uckpt.conversion.cast")


def cast_tree(root: Any, cast: Cast) -> Any:
    """``root`` with each leaf ``cast`` names a dtype for replaced by a leaf of that dtype
    (a leaf at two places, tied weights, stays one leaf); raises the
    :class:`~uckpt.errors.DtypeMismatchError` of a cast the policy refuses, before any
    array is read."""
    policy = CastPolicy(cast)
    if not policy.entries:
        return root
    done: Dict[int, Leaf] = {}

    def rebuilt(node: Any, parts: List[str]) -> Any:
        if isinstance(node, Obj):
            return replace(node, state=rebuilt(node.state, parts))
        if isinstance(node, Leaf):
            new = done.get(id(node))
            if new is None:
                path = "/".join(parts)
                want = policy.fresh_dtype(path, node.dtype, named=True)
                if want != node.dtype:
                    policy.check(path, node.dtype, want)
                new = done[id(node)] = node if want == node.dtype else cast_leaf(node, want)
            return new
        items = children(node)
        if items is None:
            return node
        values = [rebuilt(child, parts + [name]) for name, child in items]
        if isinstance(node, dict):
            return dict(zip(node, values))
        return tuple(values) if isinstance(node, tuple) else values

    out = rebuilt(root, [])
    converted = [new for key, new in done.items() if id(new) != key]
    if converted:
        log.info("converting %d array(s) to the dtypes cast= names", len(converted))
    return out


def cast_leaf(leaf: Leaf, dtype: str) -> Leaf:
    """A leaf reading ``leaf``'s values converted to ``dtype``, a block at a time."""
    stored, want = dtypes.to_numpy(leaf.dtype), dtypes.to_numpy(dtype)

    def converted(nbytes: int) -> Iterator[np.ndarray]:
        step = max(1, nbytes // max(want.itemsize, 1)) * stored.itemsize
        carry = np.empty(0, np.uint8)
        for block in leaf.blocks(step):
            if len(carry):
                block = np.concatenate([carry, block])
            cut = len(block) - len(block) % stored.itemsize
            carry = block[cut:].copy()
            yield block[:cut].view(stored).astype(want).view(np.uint8)

    def read() -> np.ndarray:
        out = np.empty(leaf.shape, want)
        flat, at = out.reshape(-1).view(np.uint8), 0
        for block in converted(1 << 20):
            flat[at:at + len(block)] = block
            at += len(block)
        return out

    return Leaf(dtype, tuple(leaf.shape), read, leaf.kind, converted)
