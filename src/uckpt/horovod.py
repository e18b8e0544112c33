"""Horovod elastic training with uckpt: ``uckpt.horovod.ElasticState``, an ``hvd.elastic``
state whose commits are checkpoints and whose restore after a reset reads the newest one,
resharded onto the new world (docs/distributed.md, "Horovod elastic").

Importing this module imports horovod.torch and torch; ``import uckpt`` alone does not.

::

    state = uckpt.horovod.ElasticState(
        {"model": model, "optimizer": optimizer, "rank": uckpt.PerRank(...)},
        tiers=[uckpt.Tier("shm://run1-{node}", keep=1, redundancy="partner"), "/shared/run1"])

    @hvd.elastic.run
    def train(state):
        for step in range(0 if state.step is None else state.step + 1, steps):
            ...
            state.step = step
            state.commit()          # a checkpoint of step, then Horovod's host check

    train(state)
    state.close()
"""
from __future__ import annotations

import logging
from typing import Any, Dict, MutableMapping, Optional

import horovod.torch as hvd
from horovod.common.elastic import State
from horovod.common.exceptions import HostsUpdatedInterrupt

from .comm import get_communicator
from .comm.horovod import world_group
from .manager.checkpoint_manager import CheckpointManager

log = logging.getLogger("uckpt.horovod")

__all__ = ["ElasticState", "world_group"]


class ElasticState(State):
    """An ``hvd.elastic`` state kept by a :class:`~uckpt.CheckpointManager` instead of a
    copy in memory, as Horovod's ``TorchState`` keeps one.

    ``state`` is the tree saved and restored (models, optimizers, ``uckpt.PerRank``
    values, plain values); ``manager_options`` are the manager's (``tiers=``, ``keep=``,
    ``async_save=``, ...), all but ``comm``; ``timeout`` the seconds a collective of
    uckpt's waits. :attr:`step` is the step :meth:`commit` saves, set by :meth:`sync` to
    the step restored (None while nothing is saved). :attr:`manager` is the manager of
    the current world.

    Call order (``hvd.elastic.run`` makes these calls on every rank):

    * :meth:`reset` after every reset (a worker lost, hosts added or removed): a gloo
      group over Horovod's new world (:func:`~uckpt.comm.horovod.world_group`) and a new
      manager over it (at the start, :meth:`sync` makes the first).
    * :meth:`sync` at the start and after a reset (Horovod skips it where hosts were only
      removed: every rank keeps the state it holds): ``manager.restore(state)``, the
      newest step every rank can restore, resharded onto the new number of ranks (a lost
      node's share rebuilt from the memory level's redundancy). Nothing saved yet: the
      state is left as it is (start every rank from the same state).
    * :meth:`commit` (the training loop's call): ``manager.save(step, state)``, then
      Horovod's check for added or removed hosts; where hosts changed, the manager is
      closed (its saves finished on the old world) before Horovod's reset.
    * :meth:`restore` after a collective failed (``HorovodInternalError``: a worker is
      gone): the manager is closed, its background work waited for and a failure logged,
      not raised (the world it ran on is broken); the state itself is restored by the
      :meth:`sync` after the reset, from the checkpoints.
    * :meth:`close` at the end: the manager's saves finished, errors raised.
    """

    def __init__(self, state: MutableMapping[str, Any], *, timeout: Optional[float] = None,
                 **manager_options: Any) -> None:
        if "comm" in manager_options:
            raise TypeError("ElasticState makes the manager's comm itself (a gloo group over "
                            "Horovod's world, made again after every reset): leave comm out")
        self.state = state
        self.step: Optional[int] = None
        self.manager: Optional[CheckpointManager] = None
        self._timeout = timeout
        self._options: Dict[str, Any] = manager_options
        super().__init__(bcast_object=hvd.broadcast_object, get_rank=hvd.rank)

    def save(self) -> None:
        """A checkpoint of :attr:`step` (``manager.save``); called by :meth:`commit`."""
        if self.manager is None:
            raise RuntimeError("ElasticState.commit() before sync(): run the training "
                               "function through hvd.elastic.run(...)")
        if self.step is None:
            raise ValueError("ElasticState.commit(): set state.step to the step to save first")
        self.manager.save(self.step, self.state)

    def commit(self) -> None:
        self.save()
        try:
            self.check_host_updates()
        except HostsUpdatedInterrupt:
            self._drop_manager(raise_errors=True)  # its world is still whole: finish the save
            raise

    def restore(self) -> None:
        self._drop_manager(raise_errors=False)

    def reset(self) -> None:
        """After Horovod's reset (a worker lost, or hosts changed): a new manager over the
        new world (:meth:`sync` follows unless Horovod skips it: hosts only removed)."""
        self._new_manager()

    def sync(self) -> None:
        if self.manager is None:
            self._new_manager()
        assert self.manager is not None
        step = self.manager.restore(self.state)
        if step is not None:
            self.step = step
        log.info("rank %d of %d: %s", hvd.rank(), hvd.size(),
                 "nothing to restore" if step is None else f"restored step {step}")

    def close(self) -> None:
        """Finish the manager's saves and copies; raise the first background error."""
        self._drop_manager(raise_errors=True)

    def _new_manager(self) -> None:
        self._drop_manager(raise_errors=False)
        comm = get_communicator(world_group(self._timeout), timeout=self._timeout)
        self.manager = CheckpointManager(comm=comm, **self._options)

    def _drop_manager(self, raise_errors: bool) -> None:
        manager, self.manager = self.manager, None
        if manager is None:
            return
        try:
            manager.close()
        except Exception as e:  # noqa: BLE001 - the world it ran on is gone
            if raise_errors:
                raise
            log.warning("rank %d: the checkpoint manager of the world before the reset "
                        "failed: %s: %s", hvd.rank(), type(e).__name__, e)
