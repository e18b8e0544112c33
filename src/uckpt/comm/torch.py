"""Communicator over torch.distributed (imported here only).

Objects travel as JSON bytes in ``uint8`` tensors (never
``all_gather_object``, which pickles). Metadata always goes over a CPU gloo
group: when the given group uses another backend (NCCL), construction creates a
gloo group over the same ranks (``dist.new_group(backend="gloo")``, a collective
call). The NCCL path is untested here (no GPU).

``gather`` agrees on the longest payload (an ``all_reduce`` of one int64, ``MAX``), then
``dist.gather``s the padded payloads to the root only; ``all_reduce_minmax`` is one
``all_reduce`` (``MIN``) of an int64 tensor of the values and their negations.

Timeouts: every call waits at most this communicator's ``timeout``, whatever the
process group's own (``init_process_group(timeout=...)``, which also bounds the
rendezvous at its start: a job on a loaded machine wants it long, a dead rank noticed
soon wants this one short). :meth:`barrier` is gloo's
``monitored_barrier(wait_all_ranks=True)``, so its error names the ranks that did not
arrive; the other collectives run as ``async_op`` and their work is waited for with this
timeout (:class:`CollectiveTimeoutError`, not naming the ranks: gloo does not say). A
peer that died usually makes gloo fail at once ("connection closed"), raised as
:class:`CommunicationError`. After a timeout, gloo's thread still waits in the
collective (until the group's own timeout): the group is broken, as after any timeout.

Shutdown: a call returns only once gloo's threads have let go of its tensors
(:func:`_let_go`), so that a process may exit right after it, even without
``destroy_process_group``.
"""
from __future__ import annotations

import logging
import re
import time
from datetime import timedelta
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from .base import DEFAULT_TIMEOUT, Buffer, Communicator, check_peers, decode, encode, int64s
from ..errors import CollectiveTimeoutError, CommunicationError


_P2P_TAG = 7  # exchange(): one tag, ordered per pair of ranks
_LET_GO_S = 5.0  # the longest a call waits for gloo's threads to let go of its tensors

log = logging.getLogger("uckpt.comm.torch")


def _let_go(tensors: Sequence[Any]) -> None:
    """Return once nothing but this thread holds ``tensors`` (those of a finished call).

    A finished work still holds its tensors for a moment on gloo's thread; where that
    thread drops the last reference, it takes the GIL to free the tensor's Python object,
    and if the interpreter is exiting by then, the process aborts ("terminate called
    without an active exception"). Waiting here leaves the last reference to this thread.
    """
    if not tensors or not hasattr(tensors[0], "_use_count"):
        return
    deadline, pause = time.monotonic() + _LET_GO_S, 1e-5
    while any(t._use_count() > 1 for t in tensors):
        if time.monotonic() > deadline:
            log.debug("gloo still holds %d tensor(s) of a finished call after %.0f s",
                      sum(t._use_count() > 1 for t in tensors), _LET_GO_S)
            return
        time.sleep(pause)
        pause = min(2 * pause, 1e-3)


class TorchCommunicator(Communicator):
    """Communicator over a torch.distributed process group (the default group if None).

    ``torch.distributed`` must already be initialized. Construction is
    collective when a gloo group has to be created (non-gloo ``group``).
    """

    def __init__(self, group: Any = None, timeout: Optional[float] = None):
        import torch
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise ValueError("torch.distributed is not initialized: call "
                             "torch.distributed.init_process_group() first, or pass comm=None")
        self._torch = torch
        self._dist = dist
        self.timeout = float(DEFAULT_TIMEOUT if timeout is None else timeout)
        if str(dist.get_backend(group)).lower() != "gloo":
            ranks = None if group is None else dist.get_process_group_ranks(group)
            group = dist.new_group(ranks=ranks, backend="gloo")
        self._group = group
        self._rank = dist.get_rank(group)
        self._size = dist.get_world_size(group)

    def duplicate(self) -> "TorchCommunicator":
        ranks = None if self._group is None else self._dist.get_process_group_ranks(self._group)
        return TorchCommunicator(self._dist.new_group(ranks=ranks, backend="gloo"), self.timeout)

    @property
    def group(self):
        """The gloo process group used for metadata (None: the default group)."""
        return self._group

    def _fail(self, op: str, e: BaseException):
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "timed out" in text.lower() or "timeout" in text.lower() or "failed to pass" in text:
            m = re.search(r"[Rr]anks?\s+([\d,\s]+?)\s+failed to pass", str(e))
            missing = [int(x) for x in re.findall(r"\d+", m.group(1))] if m else []
            return CollectiveTimeoutError(op, self.timeout, missing=missing, detail=text)
        return CommunicationError(f"torch.distributed failed in collective {op!r} on rank "
                                  f"{self._rank}: {text}")

    def _wait(self, works: List[Any], *tensors: Any) -> None:
        """Wait for each of ``works`` at most this communicator's timeout (a RuntimeError
        saying "timed out" after it: see :meth:`_fail`), dropping it (a work holds its
        tensors), then for gloo to let go of the ``tensors`` they were given
        (:func:`_let_go`). ``works`` is emptied: pass the only references."""
        while works:
            works.pop(0).wait(timedelta(seconds=self.timeout))
        _let_go(tensors)

    def barrier(self) -> None:
        if self._size == 1:
            return
        try:
            self._dist.monitored_barrier(self._group, timeout=timedelta(seconds=self.timeout),
                                         wait_all_ranks=True)
        except RuntimeError as e:
            raise self._fail("barrier", e) from e

    def all_gather(self, obj: Any) -> List[Any]:
        payload = encode(obj)
        if self._size == 1:
            return [decode(payload)]
        torch, dist = self._torch, self._dist
        try:
            n = torch.tensor([len(payload)], dtype=torch.int64)
            sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self._size)]
            self._wait([dist.all_gather(sizes, n, group=self._group, async_op=True)],
                       n, *sizes)
            lengths = [int(s.item()) for s in sizes]
            buf = torch.zeros(max(lengths), dtype=torch.uint8)
            buf[:len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
            outs = [torch.empty(max(lengths), dtype=torch.uint8) for _ in range(self._size)]
            self._wait([dist.all_gather(outs, buf, group=self._group, async_op=True)],
                       buf, *outs)
        except RuntimeError as e:
            raise self._fail("all_gather", e) from e
        return [decode(o[:k].numpy().tobytes()) for o, k in zip(outs, lengths)]

    def gather(self, obj: Any, root: int = 0) -> Optional[List[Any]]:
        if not 0 <= root < self._size:
            raise ValueError(f"root must be a rank in [0, {self._size}), got {root}")
        payload = encode(obj)
        if self._size == 1:
            return [decode(payload)]
        torch, dist = self._torch, self._dist
        dst = root if self._group is None else dist.get_global_rank(self._group, root)
        try:
            longest = -self._min(torch.tensor([-len(payload)], dtype=torch.int64))[0]
            mine = torch.zeros(8 + longest, dtype=torch.uint8)  # its length, then the bytes
            mine[:8] = torch.frombuffer(bytearray(len(payload).to_bytes(8, "little")),
                                        dtype=torch.uint8)
            mine[8:8 + len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
            outs = [torch.empty_like(mine) for _ in range(self._size)] \
                if self._rank == root else None
            self._wait([dist.gather(mine, outs, dst=dst, group=self._group, async_op=True)],
                       mine, *(outs or ()))
        except RuntimeError as e:
            raise self._fail("gather", e) from e
        if outs is None:
            return None
        got = []
        for o in outs:
            raw = o.numpy().tobytes()
            got.append(decode(raw[8:8 + int.from_bytes(raw[:8], "little")]))
        return got

    def all_reduce_minmax(self, values: Sequence[int]) -> Tuple[List[int], List[int]]:
        vals = int64s(values)
        if self._size == 1:
            return vals, vals
        n = len(vals)
        try:
            out = self._min(self._torch.tensor(vals + [-v for v in vals],
                                               dtype=self._torch.int64))
        except RuntimeError as e:
            raise self._fail("all_reduce_minmax", e) from e
        return out[:n], [-v for v in out[n:]]

    def _min(self, t: Any) -> List[int]:
        """The elementwise minimum over the ranks of int64 tensor ``t``."""
        dist = self._dist
        self._wait([dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self._group, async_op=True)],
                   t)
        return [int(v) for v in t.tolist()]

    def exchange(self, sends: Mapping[int, Buffer], sources: Iterable[int]) -> Dict[int, Buffer]:
        """``isend`` of each buffer's length (int64) and bytes (a ``uint8`` tensor) to each
        destination, then ``irecv`` of each source's, over the gloo group, each waited for
        at most this communicator's ``timeout`` (after which gloo has closed the pair: the
        group is broken, as after any timeout)."""
        srcs = check_peers(sends, sources, self._size, self._rank)
        torch, dist = self._torch, self._dist
        got: Dict[int, Buffer] = {}
        if self._rank in sends:
            got[self._rank] = bytes(sends[self._rank])
        peer = (lambda r: r) if self._group is None else \
            (lambda r: dist.get_global_rank(self._group, r))
        try:
            works, sent = [], []  # (the tensors sent: held here until gloo lets go)
            for dst, data in sends.items():
                if dst == self._rank:
                    continue
                buf = data if isinstance(data, bytearray) else bytearray(data)
                sent.append(torch.tensor([len(buf)], dtype=torch.int64))
                if buf:
                    sent.append(torch.frombuffer(buf, dtype=torch.uint8))
                works += [dist.isend(t, peer(dst), group=self._group, tag=_P2P_TAG)
                          for t in sent[-2 if buf else -1:]]
            for src in srcs:
                if src == self._rank:
                    continue
                n = torch.zeros(1, dtype=torch.int64)
                self._recv(n, peer(src), src)
                out = bytearray(int(n.item()))
                if out:
                    self._recv(torch.frombuffer(out, dtype=torch.uint8), peer(src), src)
                got[src] = out
            self._wait(works, *sent)
        except CollectiveTimeoutError:
            raise
        except RuntimeError as e:
            raise self._fail("exchange", e) from e
        return got

    def _recv(self, tensor: Any, peer: int, src: int) -> None:
        """Receive ``tensor`` from global rank ``peer`` (rank ``src`` of the group), waiting
        at most this communicator's timeout."""
        works = [self._dist.irecv(tensor, peer, group=self._group, tag=_P2P_TAG)]
        try:
            if works[0] is not None:  # (None: this rank is not in the group, never here)
                self._wait(works, tensor)
        except RuntimeError as e:
            if "timed out" in str(e).lower() or "timeout" in str(e).lower():
                raise CollectiveTimeoutError("exchange", self.timeout, missing=[src],
                                             detail=f"rank {self._rank} waited for its "
                                                    "message") from e
            raise

    def broadcast(self, obj: Any = None, root: int = 0) -> Any:
        if not 0 <= root < self._size:
            raise ValueError(f"root must be a rank in [0, {self._size}), got {root}")
        if self._size == 1:
            return decode(encode(obj))
        torch, dist = self._torch, self._dist
        src = root if self._group is None else dist.get_global_rank(self._group, root)
        try:
            payload = encode(obj) if self._rank == root else b""
            n = torch.tensor([len(payload)], dtype=torch.int64)
            self._wait([dist.broadcast(n, src=src, group=self._group, async_op=True)], n)
            buf = torch.empty(int(n.item()), dtype=torch.uint8)
            if self._rank == root:
                buf[:] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
            self._wait([dist.broadcast(buf, src=src, group=self._group, async_op=True)], buf)
        except RuntimeError as e:
            raise self._fail("broadcast", e) from e
        return decode(buf.numpy().tobytes())
