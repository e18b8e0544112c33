"""A torch.distributed (gloo) group over Horovod's current world, for Horovod on Gloo.

Horovod has collectives but no point-to-point messages, which uckpt's restore and
redundancy need (:meth:`~uckpt.comm.base.Communicator.exchange`); under MPI, uckpt talks
over MPI ``COMM_WORLD`` (``comm=hvd``), but a Horovod job on Gloo (every elastic job)
has no MPI world. :func:`world_group` makes a gloo process group of the same ranks,
numbered as Horovod numbers them, whose :class:`~uckpt.comm.torch.TorchCommunicator`
serves uckpt. Importing this module imports horovod.torch and torch.
"""
from __future__ import annotations

import json
import logging
import os
import socket
from datetime import timedelta
from typing import Any, Optional

import horovod.torch as hvd
import torch
import torch.distributed as dist

from .. import knobs

log = logging.getLogger("uckpt.comm.horovod")

__all__ = ["world_group"]


def world_group(timeout: Optional[float] = None) -> Any:
    """Collective over Horovod's current world (call it on every rank, after ``hvd.init()``
    and again after every elastic reset): torch.distributed's default group, made anew
    over ``hvd.size()`` ranks with ``hvd.rank()`` as its rank (a default group made before
    is destroyed first). Rank 0 serves the group's rendezvous (a ``TCPStore`` on a free
    port) at the address Horovod knows its host by (``HOROVOD_HOSTNAME``, else the host
    name); the address travels over Horovod as JSON. ``timeout``: seconds a collective of
    the group waits (default ``uckpt.knobs.comm_timeout``).

    The job must leave torch.distributed's default group to this function."""
    if not hvd.is_initialized():
        raise ValueError("horovod.torch is not initialized: call hvd.init() first")
    if dist.is_initialized():
        dist.destroy_process_group()
    wait = timedelta(seconds=knobs.comm_timeout if timeout is None else timeout)
    rank, size = hvd.rank(), hvd.size()
    host = os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname()
    store = None
    if rank == 0:
        store = dist.TCPStore(host, 0, size, is_master=True, timeout=wait,
                              wait_for_workers=False)
    addr, port = _from_rank0([host, store.port] if store is not None else None)
    if store is None:
        store = dist.TCPStore(addr, port, size, is_master=False, timeout=wait)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=size, timeout=wait)
    log.info("rank %d of %d: a gloo group over Horovod's world, rendezvous at %s:%d",
             rank, size, addr, port)
    return dist.group.WORLD


def _from_rank0(obj: Any) -> Any:
    """Collective over Horovod: rank 0's ``obj`` (JSON-able) on every rank, as JSON bytes
    (never a pickle)."""
    data = json.dumps(obj).encode("utf-8") if hvd.rank() == 0 else b""
    n = int(hvd.broadcast(torch.tensor([len(data)], dtype=torch.int64), 0,
                          name="uckpt.world_group.size").item())
    buf = torch.zeros(n, dtype=torch.uint8)
    if data:
        buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    got = hvd.broadcast(buf, 0, name="uckpt.world_group.address")
    return json.loads(bytes(got.numpy()).decode("utf-8"))
