"""CUDA tensors as snapshot leaves: pinned host buffers, a side stream, no stall.

``to_leaf(t)`` is what ``extract`` returns for a tensor: a NumPy view for a CPU
tensor, a :class:`uckpt.adapter.DeviceArray` for a CUDA tensor (for a DTensor, a
:class:`uckpt.Shard` of its local tensor's leaf, see :mod:`.dtensor`). When the core
snapshots it, ``copy_to(out)`` enqueues the device-to-host copy on a side
stream that first waits for the work already queued on the current stream (so
the copy sees the values at ``save()`` time); the current stream then waits for
the copy, so the optimizer step queued next cannot change the tensor before it
is copied. The copy overlaps what the host does next (building the next batch,
queuing the next forward), and the core waits on the returned event in the
background before it writes. Staging memory is pinned (``allocator``), which is
what makes the copy asynchronous; into pageable memory it is synchronous.
"""
from __future__ import annotations

import threading
from typing import Any, Dict

import numpy as np
import torch

from uckpt.adapter import DeviceArray

from .convert import _CARRIER, numpy_dtype, to_numpy
from .dtensor import is_dtensor, to_shard

_streams: Dict[int, "torch.cuda.Stream"] = {}
_lock = threading.Lock()


def _side_stream(device: torch.device) -> "torch.cuda.Stream":
    index = device.index if device.index is not None else torch.cuda.current_device()
    with _lock:
        if index not in _streams:
            _streams[index] = torch.cuda.Stream(device=index)
        return _streams[index]


def pinned(nbytes: int):
    """Page-locked host memory as a uint8 array (and the tensor that owns it)."""
    owner = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    return owner.numpy(), owner


def _host_view(out: np.ndarray, t: torch.Tensor) -> torch.Tensor:
    flat = torch.from_numpy(out.reshape(-1).view(np.uint8))
    dtype = _CARRIER.get(t.dtype, t.dtype)
    return flat.view(dtype).view(t.shape)


def device_array(t: torch.Tensor) -> DeviceArray:
    t = t.detach()

    def copy_to(out: np.ndarray):
        src = t.view(_CARRIER[t.dtype]) if t.dtype in _CARRIER else t
        host = _host_view(out, t)
        current = torch.cuda.current_stream(t.device)
        side = _side_stream(t.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            host.copy_(src, non_blocking=True)
            done = torch.cuda.Event()
            done.record(side)
        t.record_stream(side)  # the allocator must not reuse t's memory before the copy ran
        current.wait_stream(side)
        return done  # the core calls done.synchronize() before reading `out`

    key = ("cuda", t.device.index, t.data_ptr())
    return DeviceArray(tuple(t.shape), numpy_dtype(t.dtype), copy_to, key, allocator=pinned)


def to_leaf(t: torch.Tensor, path: str = ""):
    """What ``extract`` returns for a tensor: a view (CPU) or a DeviceArray (CUDA); for a
    DTensor, a :class:`uckpt.Shard` of its local tensor's leaf (``path`` names it in errors)."""
    if is_dtensor(t):
        return to_shard(t, path, to_leaf)
    if t.device.type == "cuda" and t.layout == torch.strided:
        return device_array(t)
    return to_numpy(t)


def tree_to_numpy(x: Any, path: str = "") -> Any:
    """Every tensor in a nested dict/list/tuple replaced by its leaf (:func:`to_leaf`:
    a NumPy view, a snapshot-time copy for CUDA tensors, a Shard for DTensors); containers
    rebuilt. ``path`` is the path of ``x``, for errors."""
    if isinstance(x, torch.Tensor):
        return to_leaf(x, path)
    sub = (path + "/") if path else ""
    if isinstance(x, dict):
        return {k: tree_to_numpy(v, f"{sub}{k}") for k, v in x.items()}
    if isinstance(x, list):
        return [tree_to_numpy(v, f"{sub}{i}") for i, v in enumerate(x)]
    if isinstance(x, tuple):
        return tuple(tree_to_numpy(v, f"{sub}{i}") for i, v in enumerate(x))
    return x
