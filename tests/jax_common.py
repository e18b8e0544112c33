"""Helpers of the JAX tests: the JAX adapters registered where the installed uckpt
predates their entry points, and bit-for-bit comparison of pytrees."""
from __future__ import annotations

import jax
import numpy as np

import uckpt_jax
from uckpt.plugins import known_adapter_names


def ensure_registered() -> None:
    """Register the JAX adapters unless uckpt's entry points already lead to them (an
    editable install older than ``uckpt[jax]`` has none: rerun scripts/setup.sh)."""
    if "jax" not in known_adapter_names():
        uckpt_jax.register()


def host(x):
    """A leaf as NumPy, typed keys as their key data (to compare bits)."""
    if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        return np.asarray(jax.random.key_data(x))
    return np.asarray(x)


def same_bits(a, b) -> bool:
    """Whether two pytrees have the same structure and every leaf the same dtype, shape
    and bytes."""
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    if ta != tb:
        return False
    for x, y in zip(la, lb):
        x, y = host(x), host(y)
        if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
            return False
    return True
