"""Communicators: the only part of uckpt that knows MPI, torch.distributed or Horovod.

``get_communicator(comm)`` turns what a user passes as ``comm=`` into a
:class:`Communicator`. Backends import their framework lazily, so importing
this package imports neither mpi4py nor torch.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any, Dict, Optional, Tuple

from .base import DEFAULT_TIMEOUT, Communicator, SingleProcess
from ..errors import CollectiveTimeoutError, CommunicationError, DistributedError

_MPI_ENV = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")
_HOROVOD_MODULES = ("horovod.torch", "horovod.tensorflow", "horovod.tensorflow.keras",
                    "horovod.keras")


def __getattr__(name: str):
    if name == "MPICommunicator":
        from .mpi import MPICommunicator
        return MPICommunicator
    if name == "TorchCommunicator":
        from .torch import TorchCommunicator
        return TorchCommunicator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _torch_initialized() -> bool:
    dist = sys.modules.get("torch.distributed")
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


def _mpi_launched() -> bool:
    if "mpi4py" in sys.modules:
        return True
    return any(v in os.environ for v in _MPI_ENV) and importlib.util.find_spec("mpi4py") is not None


def _is_mpi_comm(obj: Any) -> bool:
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi is not None and isinstance(obj, mpi.Comm)


def _is_torch_group(obj: Any) -> bool:
    dist = sys.modules.get("torch.distributed")
    return dist is not None and hasattr(dist, "ProcessGroup") and isinstance(obj, dist.ProcessGroup)


def _is_horovod(obj: Any) -> bool:
    return getattr(obj, "__name__", None) in _HOROVOD_MODULES and type(obj).__name__ == "module"


def _from_horovod(hvd: Any, timeout: Optional[float]) -> Communicator:
    """Horovod: uckpt talks over MPI COMM_WORLD, which is Horovod's world when it runs on MPI."""
    if not hvd.is_initialized():
        raise ValueError(f"{hvd.__name__} is not initialized: call hvd.init() first")
    if not hvd.mpi_enabled():
        raise ValueError(f"{hvd.__name__} runs on Gloo, not MPI; uckpt needs MPI under Horovod "
                         "(launch with horovodrun --mpi or mpirun), or a torch process group: "
                         "comm=uckpt.horovod.world_group() (horovod.torch; an elastic job: "
                         "uckpt.horovod.ElasticState makes it after every reset)")
    if importlib.util.find_spec("mpi4py") is None:
        raise ValueError("uckpt talks to the ranks of a Horovod job over MPI through mpi4py, "
                         "which is not installed: pip install 'uckpt[mpi]'")
    from .mpi import MPICommunicator
    c = MPICommunicator(None, timeout)
    # agree on every rank (a mismatch on some ranks only must not leave the others waiting)
    mismatched = [r for r, (h, hs) in enumerate(c.all_gather([hvd.rank(), hvd.size()]))
                  if h != r or hs != c.size]
    if mismatched:
        raise ValueError(f"MPI COMM_WORLD is not Horovod's world (ranks {mismatched} are "
                         "numbered differently); pass an mpi4py communicator instead")
    return c


_cache: Dict[Any, Tuple[Any, Communicator]] = {}  # key -> (what it was made from, communicator)
_background: Dict[int, Tuple[Communicator, Communicator]] = {}


def _cached(key: Any, source: Any, make) -> Communicator:
    """One communicator per source object (an MPI Dup or a gloo group is made once)."""
    hit = _cache.get(key)
    if hit is not None and (hit[0] is source or (isinstance(source, int) and hit[0] == source)):
        return hit[1]
    made = make()
    _cache[key] = (source, made)
    return made


def background_communicator(comm: Communicator) -> Communicator:
    """Collective on first use: the duplicate of ``comm`` that background saves talk over
    (a single process needs none: its collectives exchange nothing)."""
    if comm.size == 1:
        return comm
    hit = _background.get(id(comm))
    if hit is not None and hit[0] is comm:
        return hit[1]
    dup = comm.duplicate()
    _background[id(comm)] = (comm, dup)
    return dup


def get_communicator(comm: Any = None, *, timeout: Optional[float] = None) -> Communicator:
    """As :func:`make_communicator`, but reusing what an earlier call made from the same
    object (with the same timeout), so that repeated saves do not create communicators."""
    if isinstance(comm, Communicator):
        return comm
    if comm is None:
        if _torch_initialized():
            world = id(sys.modules["torch.distributed"].group.WORLD)  # no reference: teardown
            return _cached(("torch", timeout), world,
                           lambda: make_communicator(None, timeout=timeout))
        if _mpi_launched():
            return _cached(("mpi", timeout), "world",
                           lambda: make_communicator(None, timeout=timeout))
        return SingleProcess()
    if _is_horovod(comm):  # Horovod's world is MPI's: one communicator, whichever module
        return _cached(("mpi", timeout), "world", lambda: make_communicator(comm, timeout=timeout))
    return _cached((id(comm), timeout), comm, lambda: make_communicator(comm, timeout=timeout))


def make_communicator(comm: Any = None, *, timeout: Optional[float] = None) -> Communicator:
    """Return the :class:`Communicator` for a ``comm=`` argument.

    ``comm`` may be a :class:`Communicator` (returned as is), an mpi4py
    communicator, a torch.distributed ``ProcessGroup``, the ``horovod.torch``
    (or ``horovod.tensorflow[.keras]``) module (MPI ``COMM_WORLD``; Horovod must
    run on MPI), or None to detect: an initialized torch.distributed gives its
    default group; else MPI when mpi4py is already imported or an MPI launcher's
    variables (``OMPI_COMM_WORLD_SIZE``, ``PMI_SIZE``, ``PMIX_RANK``) are set and
    mpi4py is installed; else :class:`SingleProcess`.

    Collective whenever it builds an MPI or torch communicator (see those
    classes): call it on every rank.
    """
    if isinstance(comm, Communicator):
        return comm
    if comm is None:
        if _torch_initialized():
            from .torch import TorchCommunicator
            return TorchCommunicator(None, timeout)
        if _mpi_launched():
            from .mpi import MPICommunicator
            return MPICommunicator(None, timeout)
        return SingleProcess()
    if _is_mpi_comm(comm):
        from .mpi import MPICommunicator
        return MPICommunicator(comm, timeout)
    if _is_torch_group(comm):
        from .torch import TorchCommunicator
        return TorchCommunicator(comm, timeout)
    if _is_horovod(comm):
        return _from_horovod(comm, timeout)
    raise TypeError(f"comm must be None, a uckpt Communicator, an mpi4py communicator, a "
                    f"torch.distributed ProcessGroup or a Horovod module "
                    f"({', '.join(_HOROVOD_MODULES)}); got "
                    f"{type(comm).__module__}.{type(comm).__qualname__}")


__all__ = ["background_communicator", "make_communicator", "CollectiveTimeoutError",
           "CommunicationError", "Communicator", "DEFAULT_TIMEOUT", "DistributedError",
           "MPICommunicator", "SingleProcess", "TorchCommunicator", "get_communicator"]
