"""Communicator over mpi4py (imported here only).

Collectives are built from non-blocking point-to-point messages of raw bytes
(``Isend`` / ``Iprobe`` + ``Recv`` on ``MPI.BYTE``; never mpi4py's pickling
lowercase methods) polled against a deadline, so a dead rank makes the others
raise :class:`CollectiveTimeoutError` instead of hanging. ``all_gather`` (and
``barrier``, which is an ``all_gather`` of nothing) gathers to rank 0, which
sends the result back; when rank 0 times out it knows exactly which ranks did not
answer and tells the ranks that did, so every survivor's error names the dead
rank(s). (A plain ``Ibarrier``/``Iallgather`` with a deadline would also stop the
hang, but could not say who is missing.) Cost: 2(size-1) messages per gather,
all through rank 0: fine for the small metadata uckpt exchanges.

``gather`` is the first half of that (each rank sends to the root; nothing comes
back). ``all_reduce_minmax`` is MPI's own ``Iallreduce`` (``MIN`` over the values and
their negations: one reduction gives both), polled against the deadline; a timeout
there cannot name the missing ranks.
"""
from __future__ import annotations

import time
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from .base import (DEFAULT_TIMEOUT, Buffer, Communicator, check_peers, decode, encode, int64s,
                   one_each)
from ..errors import CollectiveTimeoutError, CommunicationError

_TAG_BASE = 7100
_TAG_SPAN = 20000  # MPI guarantees tags up to 32767
_P2P_TAG = _TAG_BASE + _TAG_SPAN + 1  # exchange(): one tag, ordered per pair of ranks


class MPICommunicator(Communicator):
    """Communicator over an mpi4py communicator (``MPI.COMM_WORLD`` by default).

    Construction is collective: the communicator is duplicated (``Dup``) so
    uckpt's messages never mix with the application's. ``timeout`` (seconds,
    default ``DEFAULT_TIMEOUT``) bounds each collective, counted from when this
    rank enters it; it includes waiting for slower ranks. Non-root ranks wait a
    grace period longer so that rank 0's report of the missing ranks reaches them.
    A job launched by MPICH's ``mpiexec`` kills all ranks when one dies, unless
    started with ``-disable-auto-cleanup``; Open MPI behaves alike.
    """

    def __init__(self, comm: Any = None, timeout: Optional[float] = None, *, dup: bool = True):
        from mpi4py import MPI

        self._MPI = MPI
        comm = MPI.COMM_WORLD if comm is None else comm
        self._comm = comm.Dup() if dup else comm
        self._rank = self._comm.Get_rank()
        self._size = self._comm.Get_size()
        self.timeout = float(DEFAULT_TIMEOUT if timeout is None else timeout)
        self._grace = max(1.0, 0.1 * self.timeout)
        self._seq = 0
        self._sends: List[Tuple[Any, bytes, int]] = []  # (request, buffer kept alive, dest)

    def duplicate(self) -> "MPICommunicator":
        return MPICommunicator(self._comm, self.timeout)

    @property
    def mpi_comm(self):
        """The (duplicated) mpi4py communicator."""
        return self._comm

    # --- point-to-point helpers -----------------------------------------------------------
    def _next_tag(self) -> int:
        self._seq += 1
        return _TAG_BASE + self._seq % _TAG_SPAN

    def _send(self, dest: int, tag: int, data: bytes) -> None:
        req = self._comm.Isend([data, self._MPI.BYTE], dest=dest, tag=tag)
        self._sends.append((req, data, dest))

    def _flush_sends(self, op: str, deadline: float) -> None:
        """Wait (until ``deadline``) for the pending sends; large ones need the receiver."""
        sleep = 1e-5
        while self._sends:
            self._sends = [s for s in self._sends if not s[0].Test()]
            if not self._sends:
                return
            if time.monotonic() > deadline:
                missing = {d for _, _, d in self._sends}
                raise CollectiveTimeoutError(op, self.timeout, missing=missing,
                                             detail="their receive never completed")
            time.sleep(sleep)
            sleep = min(2 * sleep, 2e-3)

    def _recv(self, sources: Iterable[int], tag: int, deadline: float
              ) -> Tuple[Dict[int, bytes], Set[int]]:
        MPI = self._MPI
        status = MPI.Status()
        pending = set(sources)
        got: Dict[int, bytes] = {}
        sleep = 1e-5
        while pending:
            progressed = False
            for src in sorted(pending):
                if self._comm.Iprobe(source=src, tag=tag, status=status):
                    buf = bytearray(status.Get_count(MPI.BYTE))
                    self._comm.Recv([buf, MPI.BYTE], source=src, tag=tag)
                    got[src] = bytes(buf)
                    pending.discard(src)
                    progressed = True
            if not pending or time.monotonic() > deadline:
                break
            if progressed:
                sleep = 1e-5
            else:
                time.sleep(sleep)
                sleep = min(2 * sleep, 2e-3)
        return got, pending

    def _wrap(self, op: str, fn, *args):
        if self._MPI.Is_finalized():  # e.g. hvd.shutdown(), or Horovod's exit handler, ran
            raise CommunicationError(
                f"MPI is finalized: collective {op!r} cannot run on rank {self._rank}",
                hint="when Horovod initializes MPI, hvd.shutdown() (also run at exit) finalizes "
                     "it; finish saves first (manager.close()), or import mpi4py before hvd.init()")
        try:
            return fn(*args)
        except self._MPI.Exception as e:
            raise CommunicationError(
                f"MPI failed in collective {op!r} on rank {self._rank}: {e}") from e

    # --- collectives ------------------------------------------------------------------------
    def barrier(self) -> None:
        self._wrap("barrier", self._gather, None, "barrier")

    def all_gather(self, obj: Any) -> List[Any]:
        return self._wrap("all_gather", self._gather, obj, "all_gather")

    def broadcast(self, obj: Any = None, root: int = 0) -> Any:
        if not 0 <= root < self._size:
            raise ValueError(f"root must be a rank in [0, {self._size}), got {root}")
        return self._wrap("broadcast", self._broadcast, obj, root)

    def gather(self, obj: Any, root: int = 0) -> Optional[List[Any]]:
        if not 0 <= root < self._size:
            raise ValueError(f"root must be a rank in [0, {self._size}), got {root}")
        return self._wrap("gather", self._gather_to, obj, root)

    def scatter(self, objs: Optional[Sequence[Any]], root: int = 0) -> Any:
        if not 0 <= root < self._size:
            raise ValueError(f"root must be a rank in [0, {self._size}), got {root}")
        return self._wrap("scatter", self._scatter, objs, root)

    def all_reduce_minmax(self, values: Sequence[int]) -> Tuple[List[int], List[int]]:
        return self._wrap("all_reduce_minmax", self._minmax, int64s(values))

    def exchange(self, sends: Mapping[int, Buffer], sources: Iterable[int]) -> Dict[int, Buffer]:
        """``Isend`` of each buffer as ``MPI.BYTE`` (no copy, no pickle) on a tag of its own;
        each message received into a ``bytearray`` of its probed size."""
        srcs = check_peers(sends, sources, self._size, self._rank)
        return self._wrap("exchange", self._exchange, sends, srcs)

    def _exchange(self, sends: Mapping[int, Buffer], srcs: List[int]) -> Dict[int, Buffer]:
        MPI = self._MPI
        start = time.monotonic()
        got: Dict[int, Buffer] = {}
        if self._rank in sends:
            got[self._rank] = bytes(sends[self._rank])
        for dst, data in sends.items():
            if dst != self._rank:
                self._send(dst, _P2P_TAG, data)  # type: ignore[arg-type]
        pending, status, sleep = [s for s in srcs if s != self._rank], MPI.Status(), 1e-5
        while pending:
            done = [s for s in pending
                    if self._comm.Iprobe(source=s, tag=_P2P_TAG, status=status) and
                    self._take(s, status, got)]
            pending = [s for s in pending if s not in done]
            if pending and time.monotonic() > start + self.timeout:
                raise CollectiveTimeoutError("exchange", self.timeout, missing=pending,
                                             detail=f"rank {self._rank} waited for their "
                                                    "messages")
            if pending and not done:
                time.sleep(sleep)
                sleep = min(2 * sleep, 2e-3)
            elif done:
                sleep = 1e-5
        self._flush_sends("exchange", start + self.timeout + self._grace)
        return got

    def _take(self, src: int, status: Any, got: Dict[int, Buffer]) -> bool:
        buf = bytearray(status.Get_count(self._MPI.BYTE))
        self._comm.Recv([buf, self._MPI.BYTE], source=src, tag=_P2P_TAG)
        got[src] = buf
        return True

    def _gather_to(self, obj: Any, root: int) -> Optional[List[Any]]:
        payload = encode(obj)
        if self._size == 1:
            return [decode(payload)]
        tag = self._next_tag()
        start = time.monotonic()
        if self._rank != root:
            self._send(root, tag, payload)
            self._flush_sends("gather", start + self.timeout + self._grace)
            return None
        others = [r for r in range(self._size) if r != root]
        got, missing = self._recv(others, tag, start + self.timeout)
        if missing:
            raise CollectiveTimeoutError("gather", self.timeout, missing=missing)
        got[root] = payload
        return decode(b"[" + b",".join(got[r] for r in range(self._size)) + b"]")

    def _minmax(self, values: List[int]) -> Tuple[List[int], List[int]]:
        import numpy as np

        n = len(values)
        mine = np.array(values + [-v for v in values], dtype=np.int64)
        if self._size == 1:
            return values, values
        out = np.empty_like(mine)
        self._wait(self._comm.Iallreduce([mine, self._MPI.INT64_T], [out, self._MPI.INT64_T],
                                         op=self._MPI.MIN), "all_reduce_minmax")
        return [int(v) for v in out[:n]], [int(-v) for v in out[n:]]

    def _wait(self, req: Any, op: str) -> None:
        """Poll a non-blocking collective until it completes or the timeout passes."""
        deadline, sleep = time.monotonic() + self.timeout, 1e-5
        while not req.Test():
            if time.monotonic() > deadline:
                raise CollectiveTimeoutError(op, self.timeout,
                                             detail="a non-blocking MPI collective")
            time.sleep(sleep)
            sleep = min(2 * sleep, 2e-3)

    def _gather(self, obj: Any, op: str) -> List[Any]:
        payload = encode(obj)
        if self._size == 1:
            return [decode(payload)]
        tag = self._next_tag()
        start = time.monotonic()
        if self._rank == 0:
            got, missing = self._recv(range(1, self._size), tag, start + self.timeout)
            if missing:
                notice = b"E" + encode(sorted(missing))
                for r in got:
                    self._send(r, tag, notice)
                try:  # make sure the notice left before this rank raises (and maybe exits)
                    self._flush_sends(op, time.monotonic() + self._grace)
                except CollectiveTimeoutError:
                    pass
                raise CollectiveTimeoutError(op, self.timeout, missing=missing)
            result = b"D[" + b",".join([payload] + [got[r] for r in range(1, self._size)]) + b"]"
            for r in range(1, self._size):
                self._send(r, tag, result)
            self._flush_sends(op, start + self.timeout)
            return decode(result[1:])
        self._send(0, tag, payload)
        got, missing = self._recv([0], tag, start + self.timeout + self._grace)
        if missing:
            raise CollectiveTimeoutError(op, self.timeout, missing=[0],
                                         detail="rank 0 gathers; it died or is stuck")
        msg = got[0]
        if msg[:1] == b"E":
            raise CollectiveTimeoutError(op, self.timeout, missing=decode(msg[1:]),
                                         detail="reported by rank 0")
        self._flush_sends(op, start + self.timeout + self._grace)
        return decode(msg[1:])

    def _scatter(self, objs: Optional[Sequence[Any]], root: int) -> Any:
        """As :meth:`_broadcast`, but the root sends each rank its own object."""
        if self._rank == root:
            objs = one_each(objs, self._size)
        if self._size == 1:
            return decode(encode(objs[0]))  # type: ignore[index]
        tag = self._next_tag()
        start = time.monotonic()
        if self._rank == root:
            assert objs is not None
            for r in range(self._size):
                if r != root:
                    self._send(r, tag, b"D" + encode(objs[r]))
            self._flush_sends("scatter", start + self.timeout)
            return decode(encode(objs[root]))
        got, missing = self._recv([root], tag, start + self.timeout)
        if missing:
            raise CollectiveTimeoutError("scatter", self.timeout, missing=[root],
                                         detail=f"the root, rank {root}, sent nothing")
        return decode(got[root][1:])

    def _broadcast(self, obj: Any, root: int) -> Any:
        if self._size == 1:
            return decode(encode(obj))
        tag = self._next_tag()
        start = time.monotonic()
        if self._rank == root:
            data = encode(obj)
            for r in range(self._size):
                if r != root:
                    self._send(r, tag, b"D" + data)
            self._flush_sends("broadcast", start + self.timeout)
            return decode(data)
        got, missing = self._recv([root], tag, start + self.timeout)
        if missing:
            raise CollectiveTimeoutError("broadcast", self.timeout, missing=[root],
                                         detail=f"the root, rank {root}, sent nothing")
        return decode(got[root][1:])
