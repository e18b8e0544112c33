"""DTensors (``torch.distributed.tensor``; FSDP2's parameters and optimizer state) as shards.

A DTensor is this rank's local tensor plus where it sits in a global tensor, so it
maps onto :class:`uckpt.Shard`: the core writes each rank's box once and loads
any box on any number of ranks.

save: ``to_shard(dt, path)`` (called by ``device.to_leaf``) is ``Shard(local array,
dt.shape, start)``, the start given by torch's own
``compute_local_shape_and_global_offset``. ``Shard(dim)`` placements, even or
uneven (a rank may hold an empty box), ``Replicate()`` (every rank holds the whole
box; it is written once) and meshes of any dimension are accepted. ``Partial``
(a pending reduction: no value yet) and ``_StridedShard`` (the local rows are
not one box) are refused with :class:`~uckpt.errors.UnsupportedObjectError`.
load: ``prepare`` calls ``read_target(dt, spec)``: a Shard over the local
tensor's own memory (or over a fresh array when no writable view exists), so the
core reads only the chunks intersecting this rank's box, straight into the
shard. ``restore`` calls ``fill(dt, value)``, which copies the box into the
local tensor unless the core already read it there, or ``like(dt, value)`` for
a new DTensor laid out as ``dt`` (optimizer state that did not exist yet).

Nothing here imports ``torch.distributed``: a DTensor exists only once
``torch.distributed.tensor`` is imported, so ``is_dtensor`` looks it up in
``sys.modules``.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np
import torch

from uckpt.adapter import ArraySpec
from uckpt.dtypes import to_numpy as numpy_dtype_of
from uckpt.errors import StateMismatchError, UnsupportedObjectError
from uckpt.tree.shard import Shard

from .convert import from_numpy, is_dtensor, same_memory, writable_view  # noqa: F401 (is_dtensor re-exported)


def local_tensor(dt) -> torch.Tensor:
    """The rank's local tensor, sharing its memory (no autograd node, no pending collective)."""
    with torch.no_grad():
        local = dt.to_local()
    wait = getattr(local, "wait", None)
    if callable(wait) and type(local).__name__ == "AsyncCollectiveTensor":
        local = wait()
    return local


def layout(dt, path: str, doing: str = "saved") -> Tuple[torch.Tensor, Tuple[int, ...]]:
    """``(local tensor, start of its box in the global tensor)``; refuses what is no box."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    placements = tuple(dt.placements)
    what = f"DTensor {path!r} (placements {_names(placements)})" if path else \
        f"a DTensor with placements {_names(placements)}"
    for p in placements:
        if p.is_partial():
            raise UnsupportedObjectError(
                f"{what} cannot be {doing}: {p!r} is a pending reduction, the tensor has no "
                "value until it is reduced", leaf=path or None,
                hint="redistribute it first, e.g. dt.redistribute(dt.device_mesh, "
                "[Replicate()] * dt.device_mesh.ndim), or save dt.full_tensor()")
        if not (p.is_shard() or p.is_replicate()):
            raise UnsupportedObjectError(
                f"{what} cannot be {doing}: {p!r} does not give each rank one contiguous box",
                leaf=path or None,
                hint="redistribute it to Shard(dim) / Replicate() placements first")
    local = local_tensor(dt)
    ndim = len(dt.shape)
    if not dt.device_mesh._is_current_rank_part_of_mesh():
        return local.new_empty((0,) * ndim), (0,) * ndim  # this rank holds nothing of it
    shape, start = compute_local_shape_and_global_offset(dt.shape, dt.device_mesh, placements)
    if tuple(shape) != tuple(local.shape):  # torch's layout and the tensor disagree: no guess
        raise UnsupportedObjectError(
            f"{what} cannot be {doing}: its local tensor has shape {list(local.shape)}, its "
            f"placements on mesh {list(dt.device_mesh.shape)} say {list(shape)}",
            leaf=path or None, hint="a DTensor made with DTensor.from_local(...) must be given "
            "shape= and stride= when its sharding is uneven")
    return local, tuple(int(o) for o in start)


def _names(placements) -> str:
    return "[" + ", ".join(repr(p) for p in placements) + "]"


def to_shard(dt, path: str, leaf) -> Shard:
    """The leaf of a DTensor on save; ``leaf`` turns the local tensor into an array."""
    local, start = layout(dt, path)
    return Shard(leaf(local), tuple(dt.shape), start)


def read_target(dt, spec: ArraySpec, path: str, in_place: bool = True) -> Shard:
    """The box of ``dt``'s layout this rank loads: over its local tensor's memory when
    ``in_place`` and writable there, else over a fresh array (``dt`` is only the layout)."""
    local, start = layout(dt, path, "loaded into")
    want = numpy_dtype_of(spec.dtype)
    view = writable_view(local) if in_place else None
    if view is None or view.dtype != want:
        view = np.empty(tuple(local.shape), dtype=want)
    return Shard(view, tuple(dt.shape), start)


def local_box(value: np.ndarray, dt) -> np.ndarray:
    """This rank's box of a loaded array: ``value`` itself when it is the box (what a
    ``read_target`` receives), else its box of the whole array."""
    local, start = layout(dt, "", "loaded into")
    if tuple(value.shape) == tuple(local.shape):
        return value
    if tuple(value.shape) != tuple(dt.shape):
        raise StateMismatchError(f"an array of shape {list(value.shape)} is neither the DTensor's "
                                 f"global shape {list(dt.shape)} nor its local shape "
                                 f"{list(local.shape)}")
    return value[tuple(slice(o, o + n) for o, n in zip(start, local.shape))]


def fill(dt, value: np.ndarray) -> None:
    """Put the loaded ``value`` (the box, or the whole array) into ``dt``'s local tensor."""
    local = local_tensor(dt)
    box = local_box(value, dt)
    if box.size and not same_memory(box, local):
        with torch.no_grad():
            local.copy_(from_numpy(box, like=local))


def like(dt, value: np.ndarray):
    """A new DTensor laid out as ``dt`` (mesh, placements, global shape) holding ``value``
    (the box, or the whole array), in ``value``'s dtype."""
    from torch.distributed.tensor import DTensor

    t = from_numpy(local_box(value, dt), like=local_tensor(dt))
    return DTensor.from_local(t, dt.device_mesh, dt.placements, run_check=False,
                              shape=dt.shape, stride=dt.stride())
