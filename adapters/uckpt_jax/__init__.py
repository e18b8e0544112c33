"""The JAX adapters of uckpt: ``jax.Array`` (sharded or not, typed PRNG keys), pytrees
(namedtuples such as Optax states, ``flax.struct`` and registered dataclasses), Flax NNX
objects and variables, Flax Linen variables (plain mappings of arrays).

The core finds them through the entry points ``uckpt.adapters: jax, jaxlib, flax =
uckpt_jax:ADAPTERS`` (see :mod:`uckpt.registry`); :func:`register` registers them for
this process where uckpt is not installed with its entry points. JAX arrays are
immutable: their adapter's ``restore`` returns new arrays, which ``uckpt.load`` puts
into the state and the tree it returns (docs/frameworks/jax.md).
"""
from .adapters import ArrayAdapter, NnxAdapter, NodeAdapter, VariableAdapter

# NNX objects and variables before the generic pytree node (both are pytree nodes too)
ADAPTERS = [NnxAdapter(), VariableAdapter(), ArrayAdapter(), NodeAdapter()]


def register() -> None:
    """Register the JAX adapters for this process (ahead of every other adapter)."""
    from uckpt.registry import register_adapter

    for adapter in reversed(ADAPTERS):
        register_adapter(adapter)


__all__ = ["ADAPTERS", "ArrayAdapter", "NnxAdapter", "NodeAdapter", "VariableAdapter",
           "register"]
