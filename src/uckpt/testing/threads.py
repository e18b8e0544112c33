"""Ranks as threads of one process: a real :class:`~uckpt.comm.Communicator` for tests.

:func:`run_ranks` runs ``fn(comm)`` on ``size`` threads, each with its own
:class:`ThreadCommunicator`; the collectives really exchange (JSON-encoded, as over
MPI) between the threads, so planning, checking and the commit protocol of
:mod:`uckpt.saving.collective` run as they do across processes, in milliseconds::

    from uckpt.testing import run_ranks

    def body(comm):
        return uckpt.save(tmp / "ckpt", {"w": np.ones(4)}, comm=comm)

    outcomes = run_ranks(4, body)      # every rank's return value (or its exception)

What threads cannot stand in for (a rank that dies, separate address spaces,
node-local storage) stays with the multi-process tests. A rank that does not reach a
collective makes the others raise :class:`~uckpt.errors.CollectiveTimeoutError`
naming it, after ``timeout`` seconds.
"""
from __future__ import annotations

import itertools
import threading
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ..comm.base import (Buffer, Communicator, check_peers, decode, encode, int64s, minmax,
                         one_each)
from ..errors import CollectiveTimeoutError

__all__ = ["ThreadCommunicator", "ThreadWorld", "run_ranks"]


class _Slot:
    """One collective call: each rank's payload, filled in as the ranks arrive."""

    def __init__(self, size: int, operation: str) -> None:
        self.operation = operation
        self.payloads: List[Optional[bytes]] = [None] * size
        self.arrived = 0
        self.left = size  # ranks that have not taken the result yet


class ThreadWorld:
    """The shared state of ``size`` thread ranks: one exchange per (group, call number)."""

    def __init__(self, size: int, timeout: float = 30.0) -> None:
        if size < 1:
            raise ValueError(f"a world needs at least one rank, got {size}")
        self.size = size
        self.timeout = timeout
        self._cond = threading.Condition()
        self._slots: Dict[Tuple[Any, int], _Slot] = {}
        self.broken = False  # after a timeout: every later collective fails at once
        self._mail: Dict[Tuple[Any, int, int], List[bytes]] = {}  # (group, src, dst) -> queue

    def communicators(self) -> List["ThreadCommunicator"]:
        """One communicator per rank (group ``()``, the world)."""
        return [ThreadCommunicator(self, r, ()) for r in range(self.size)]

    def exchange(self, group: Any, call: int, rank: int, operation: str,
                 payload: bytes) -> List[bytes]:
        """Put ``rank``'s payload of call number ``call`` and wait for every rank's."""
        key = (group, call)
        with self._cond:
            if self.broken:
                raise CollectiveTimeoutError(operation, self.timeout,
                                             detail="an earlier collective timed out")
            slot = self._slots.setdefault(key, _Slot(self.size, operation))
            if slot.operation != operation:
                self.broken = True
                self._cond.notify_all()
                raise CollectiveTimeoutError(
                    operation, self.timeout,
                    detail=f"rank {rank} called {operation} where another rank called "
                           f"{slot.operation}: the ranks' collectives are out of order")
            slot.payloads[rank] = payload
            slot.arrived += 1
            self._cond.notify_all()
            complete = self._cond.wait_for(
                lambda: slot.arrived == self.size or self.broken, self.timeout)
            if not complete or slot.arrived < self.size:
                self.broken = True
                self._cond.notify_all()
                missing = [r for r, p in enumerate(slot.payloads) if p is None]
                raise CollectiveTimeoutError(operation, self.timeout, missing=missing)
            slot.left -= 1
            if slot.left == 0:
                del self._slots[key]
            return list(slot.payloads)  # type: ignore[arg-type]


    def post(self, group: Any, src: int, dst: int, data: bytes) -> None:
        """Queue a point-to-point message from ``src`` to ``dst`` (:meth:`take` gets it)."""
        with self._cond:
            self._mail.setdefault((group, src, dst), []).append(data)
            self._cond.notify_all()

    def take(self, group: Any, sources: Sequence[int], dst: int) -> Dict[int, bytes]:
        """The next message to ``dst`` from each of ``sources``, waiting up to the timeout."""
        with self._cond:
            def ready() -> bool:
                return self.broken or all(self._mail.get((group, s, dst)) for s in sources)
            if not self._cond.wait_for(ready, self.timeout) or self.broken:
                missing = [s for s in sources if not self._mail.get((group, s, dst))]
                raise CollectiveTimeoutError("exchange", self.timeout, missing=missing,
                                             detail=f"rank {dst} waited for their messages")
            return {s: self._mail[(group, s, dst)].pop(0) for s in sources}


class ThreadCommunicator(Communicator):
    """Rank ``rank`` of a :class:`ThreadWorld`. Collectives follow the base class's
    contract (same order on every rank, JSON-able objects, one timeout)."""

    def __init__(self, world: ThreadWorld, rank: int, group: Tuple[int, ...]) -> None:
        self.world = world
        self._rank = rank
        self._size = world.size
        self.group = group
        self._calls = itertools.count()
        self._duplicates = itertools.count()

    def _exchange(self, operation: str, obj: Any) -> List[Any]:
        payload = encode(obj)
        got = self.world.exchange(self.group, next(self._calls), self._rank, operation, payload)
        return [decode(p) for p in got]

    def barrier(self) -> None:
        self._exchange("barrier", None)

    def all_gather(self, obj: Any) -> List[Any]:
        return self._exchange("all_gather", obj)

    def broadcast(self, obj: Any = None, root: int = 0) -> Any:
        if not 0 <= root < self.size:
            raise ValueError(f"root must be a rank below {self.size}, got {root}")
        return self._exchange(f"broadcast(root={root})",
                              obj if self._rank == root else None)[root]

    def gather(self, obj: Any, root: int = 0) -> Optional[List[Any]]:
        if not 0 <= root < self.size:
            raise ValueError(f"root must be a rank below {self.size}, got {root}")
        got = self.world.exchange(self.group, next(self._calls), self._rank,
                                  f"gather(root={root})", encode(obj))
        return [decode(p) for p in got] if self._rank == root else None

    def scatter(self, objs: Optional[Sequence[Any]], root: int = 0) -> Any:
        """The root's payload: the pieces' offsets, a newline, the pieces; each rank
        decodes its own piece only."""
        if not 0 <= root < self.size:
            raise ValueError(f"root must be a rank below {self.size}, got {root}")
        payload = b""
        if self._rank == root:
            pieces = [encode(o) for o in one_each(objs, self.size)]
            ends = list(itertools.accumulate(map(len, pieces)))
            payload = encode(ends) + b"\n" + b"".join(pieces)
        got = self.world.exchange(self.group, next(self._calls), self._rank,
                                  f"scatter(root={root})", payload)[root]
        head = got.index(b"\n")
        ends = [0] + decode(got[:head])
        return decode(got[head + 1 + ends[self._rank]:head + 1 + ends[self._rank + 1]])

    def all_reduce_minmax(self, values: Sequence[int]) -> Tuple[List[int], List[int]]:
        return minmax(self._exchange("all_reduce_minmax", int64s(values)))

    def exchange(self, sends: Mapping[int, Buffer], sources: Iterable[int]) -> Dict[int, Buffer]:
        """Each message is copied into the receiver's mailbox, as a process would receive it."""
        srcs = check_peers(sends, sources, self.size, self._rank)
        for dst, data in sends.items():
            self.world.post(self.group, self._rank, dst, bytes(data))
        return dict(self.world.take(self.group, srcs, self._rank))

    def duplicate(self) -> "ThreadCommunicator":
        """Collective: the n-th duplicate of a group is the same group on every rank."""
        self.barrier()
        return ThreadCommunicator(self.world, self._rank,
                                  self.group + (next(self._duplicates),))


def run_ranks(size: int, fn: Callable[[ThreadCommunicator], Any], *,
              timeout: float = 30.0) -> List[Any]:
    """Run ``fn(comm)`` on ``size`` threads, one rank each; return what each rank returned,
    or the exception it raised (an exception instance in its place), indexed by rank.

    ``timeout`` bounds every collective; a rank still running ``timeout`` seconds after
    the others finished makes this raise :class:`TimeoutError` naming it."""
    world = ThreadWorld(size, timeout)
    outcomes: List[Any] = [None] * size

    def body(comm: ThreadCommunicator) -> None:
        try:
            outcomes[comm.rank] = fn(comm)
        except BaseException as e:  # noqa: BLE001 - handed to the caller in place of a value
            outcomes[comm.rank] = e

    threads = [threading.Thread(target=body, args=(c,), name=f"uckpt-rank-{c.rank}",
                                daemon=True) for c in world.communicators()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout * 2 + 5)
    stuck = [r for r, t in enumerate(threads) if t.is_alive()]
    if stuck:
        raise TimeoutError(f"rank(s) {', '.join(map(str, stuck))} of {size} still running "
                           f"after {timeout * 2 + 5:g} s")
    return outcomes
