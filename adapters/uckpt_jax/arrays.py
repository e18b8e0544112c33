"""``jax.Array`` leaves: device-to-host copies on save, new arrays placed on a sharding on load.

save: :func:`to_leaf` gives a :class:`uckpt.adapter.DeviceArray` of the array's global
shape. Its ``copy_to`` starts ``copy_to_host_async`` on every addressable shard that is
the first replica of its box (``replica_id == 0``: each box is copied once however many
devices hold it), then returns the wait, which copies each shard into its box of the
staging memory. The array is marked ``settle``: an asynchronous save waits for these
copies (after every leaf's have started) before it returns, since a training step may
donate the buffers right after. A typed PRNG key is saved as ``{"impl": name,
"key_data": ...}`` (:func:`jax.random.key_data`).
load: :func:`read_target` is None (a new host array of the whole array) where this
process holds every box of the target's sharding, else a :class:`uckpt.Shard` of the
smallest box holding its boxes (the core reads only the chunks that intersect it);
:func:`from_host` makes the new ``jax.Array`` with the target's sharding, each device
given its box (``jax.make_array_from_callback``).
"""
from __future__ import annotations

import math
from typing import Any, Optional, Tuple

import jax
import numpy as np

from uckpt.adapter import DeviceArray
from uckpt.errors import StateMismatchError, UnsupportedObjectError
from uckpt.tree.shard import Shard

Box = Tuple[Tuple[int, ...], Tuple[int, ...]]  # (start, shape)


def is_key(x: Any) -> bool:
    """Whether ``x`` (an array or a ShapeDtypeStruct) holds typed PRNG keys."""
    return jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key)


def is_array(x: Any) -> bool:
    return isinstance(x, (jax.Array, jax.ShapeDtypeStruct))


def _box(index: Optional[Tuple[slice, ...]], shape: Tuple[int, ...]) -> Box:
    """``(start, shape)`` of a device's index into an array of ``shape`` (None: all of it)."""
    if index is None:
        return (0,) * len(shape), shape
    start = tuple(s.indices(n)[0] for s, n in zip(index, shape))
    stop = tuple(s.indices(n)[1] for s, n in zip(index, shape))
    return start, tuple(b - a for a, b in zip(start, stop))


class _Copies:
    """The device-to-host copies of one array's shards into its staged box; ``synchronize``
    waits for them (the core calls it before it reads the staged array)."""

    def __init__(self, out: np.ndarray, shards: list) -> None:
        self.out, self.shards = out, shards

    def synchronize(self) -> None:
        for index, data in self.shards:
            self.out[index] = np.asarray(data)
        self.shards = []


def to_leaf(x: jax.Array, path: str = "") -> DeviceArray:
    """The leaf of a (non-key) ``jax.Array`` on save."""
    if not x.is_fully_addressable:
        raise UnsupportedObjectError(
            f"the jax.Array {path or ''} of shape {list(x.shape)} spans devices of other "
            "processes (sharding {x.sharding}): saving arrays of several JAX processes is "
            "not supported yet", leaf=path or None,
            hint="gather it first (jax.experimental.multihost_utils.process_allgather), or "
                 "save one process's addressable data inside uckpt.PerRank")
    shards = [(s.index, s.data) for s in x.addressable_shards if s.replica_id == 0]

    def copy_to(out: np.ndarray) -> _Copies:
        for _, data in shards:  # every shard's copy started before any is waited for
            data.copy_to_host_async()
        return _Copies(out, shards)

    return DeviceArray(tuple(x.shape), np.dtype(x.dtype), copy_to, ("jax", id(x)), settle=True)


def sharding_of(like: Any) -> Optional[jax.sharding.Sharding]:
    """Where a restored array goes: the array's or ShapeDtypeStruct's sharding (None: the
    default device)."""
    return getattr(like, "sharding", None)


def target_box(like: Any) -> Optional[Box]:
    """The smallest box holding every box this process places of ``like`` (None: the whole
    array, or placed on the default device)."""
    sharding, shape = sharding_of(like), tuple(like.shape)
    if sharding is None or sharding.is_fully_addressable or not shape:
        return None
    boxes = [_box(idx, shape) for idx in
             sharding.addressable_devices_indices_map(shape).values()]
    if not boxes:
        return (0,) * len(shape), (0,) * len(shape)
    start = tuple(min(b[0][d] for b in boxes) for d in range(len(shape)))
    stop = tuple(max(b[0][d] + b[1][d] for b in boxes) for d in range(len(shape)))
    if start == (0,) * len(shape) and stop == shape:
        return None
    return start, tuple(b - a for a, b in zip(start, stop))


def read_target(like: Any, dtype: np.dtype) -> Optional[Shard]:
    """What the core reads ``like``'s array into: None (a new whole array) or a Shard of
    this process's box."""
    box = target_box(like)
    if box is None:
        return None
    return Shard(np.empty(box[1], dtype), tuple(like.shape), box[0])


def from_host(value: np.ndarray, like: Any, path: str = "") -> jax.Array:
    """A new ``jax.Array`` of ``value`` (the whole array, or this process's box of it)
    placed with ``like``'s sharding."""
    shape = tuple(like.shape)
    value = np.asarray(value)
    sharding = sharding_of(like)
    if sharding is None:
        if value.shape != shape:
            raise StateMismatchError(f"{path!r}: loaded {list(value.shape)}, want {list(shape)}")
        return jax.device_put(value)
    box = target_box(like)
    start = box[0] if box is not None and value.shape != shape else (0,) * len(shape)

    def data(index: Optional[Tuple[slice, ...]]) -> np.ndarray:
        b_start, b_shape = _box(index, shape)
        return value[tuple(slice(s - o, s - o + n) for s, o, n in zip(b_start, start, b_shape))]

    if math.prod(shape) == 0:
        return jax.device_put(np.empty(shape, value.dtype), sharding)
    return jax.make_array_from_callback(shape, sharding, data)


def key_impl(x: Any) -> str:
    """The name of a typed key's PRNG implementation (``"threefry2x32"``, ...)."""
    return str(jax.random.key_impl(x))


def key_from_host(impl: str, data: np.ndarray, like: Any) -> jax.Array:
    """Typed keys of implementation ``impl`` from their raw ``data``, placed as ``like``."""
    keys = jax.random.wrap_key_data(jax.numpy.asarray(data), impl=impl)
    sharding = sharding_of(like)
    return keys if sharding is None else jax.device_put(keys, sharding)
