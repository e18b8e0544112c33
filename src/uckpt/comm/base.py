"""The communicator interface and the single-process default."""
from __future__ import annotations

import json
import traceback
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from .. import knobs
from ..errors import DistributedError

#: what :meth:`Communicator.exchange` sends and returns: a contiguous bytes-like object
Buffer = Union[bytes, bytearray, memoryview]

#: Seconds a collective waits before raising :class:`CollectiveTimeoutError`
#: (``uckpt.knobs.comm_timeout``; ``UCKPT_COMM_TIMEOUT`` overrides it).
DEFAULT_TIMEOUT = knobs.comm_timeout


def encode(obj: Any) -> bytes:
    """JSON-encode a small object to bytes (never pickle)."""
    try:
        return json.dumps(obj, separators=(",", ":"), allow_nan=True).encode("utf-8")
    except (TypeError, ValueError) as e:
        raise TypeError("communicator objects must be JSON-able "
                        f"(dict/list/str/number/bool/None): {e}") from e


def decode(data: bytes) -> Any:
    return json.loads(bytes(data).decode("utf-8"))


def describe_exception(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()


def exception_kinds(exc: BaseException) -> List[str]:
    """``module.QualName`` of the exception's class and its bases: what the other ranks
    learn of its type (:meth:`~uckpt.errors.DistributedError.failed_with`)."""
    return [f"{c.__module__}.{c.__qualname__}" for c in type(exc).__mro__ if c is not object]


_INT64 = (-(2 ** 63) + 1, 2 ** 63 - 1)  # -2**63 left out: its negation overflows


def int64s(values: Sequence[int]) -> List[int]:
    """``values`` as plain ints, checked to fit a reduction over int64."""
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or not _INT64[0] <= v <= _INT64[1]:
            raise TypeError(f"all_reduce_minmax takes ints in [-2**63 + 1, 2**63 - 1], got {v!r}")
        out.append(int(v))
    return out


def minmax(rows: Sequence[Sequence[int]]) -> Tuple[List[int], List[int]]:
    """The elementwise minima and maxima of equally long rows of ints."""
    if len({len(r) for r in rows}) > 1:
        raise ValueError("all_reduce_minmax: the ranks passed different numbers of values "
                         f"({sorted({len(r) for r in rows})})")
    return [min(c) for c in zip(*rows)], [max(c) for c in zip(*rows)]


#: one failed rank: (rank, message, kinds of its exception, empty for a bare message)
Failure = Tuple[int, str, List[str]]


class Communicator:
    """Rank, size and the few collectives uckpt needs, over one distributed engine.

    Call order: every method except :attr:`rank` and :attr:`size` is
    *collective*: every rank of the group calls it, in the same order, with the
    same ``root``. A rank that skips a call, or calls them in another order,
    makes the others wait until the timeout. Constructing a backend communicator
    may itself be collective (see the backend).

    Objects passed to :meth:`all_gather`, :meth:`gather` and :meth:`broadcast` must be
    small and JSON-able; they travel as JSON-encoded bytes, never pickles. (Tuples come
    back as lists.)

    What a rank receives: :meth:`all_gather` every rank's object (grows with the
    ranks); :meth:`gather` only at its root; :meth:`scatter` its own object;
    :meth:`broadcast` and :meth:`all_reduce_minmax` a constant. Coordination whose cost
    per rank must not grow with the job (a later save) uses the last four:
    :meth:`gather_outcomes_to` and :meth:`agree_outcomes`.

    Point to point: :meth:`exchange` is the one call that is not collective: only the
    ranks that send or receive in it take part (redundancy across nodes, docs/levels.md).

    Failure reporting: a rank whose work failed still calls :meth:`check` (or
    :meth:`failures`) with its exception; every rank then raises the same
    :class:`DistributedError` naming the failed ranks and their messages. A rank
    that died makes the collectives raise :class:`CollectiveTimeoutError` within
    the backend's timeout instead of hanging. After a timeout the communicator is
    broken: do not use it again.
    """

    _rank: int = 0
    _size: int = 1

    @property
    def rank(self) -> int:
        """This process's rank in the communicator (set by the backend)."""
        return self._rank

    @property
    def size(self) -> int:
        """The number of ranks (set by the backend)."""
        return self._size

    def barrier(self) -> None:
        """Collective: return once every rank has entered the barrier."""
        raise NotImplementedError

    def duplicate(self) -> "Communicator":
        """Collective: a communicator over the same ranks whose messages never mix with
        this one's, for collectives run on a background thread (async saves)."""
        raise NotImplementedError

    def all_gather(self, obj: Any) -> List[Any]:
        """Collective: return every rank's ``obj``, indexed by rank."""
        raise NotImplementedError

    def broadcast(self, obj: Any = None, root: int = 0) -> Any:
        """Collective: return ``root``'s ``obj`` on every rank (others' ``obj`` is ignored)."""
        raise NotImplementedError

    def gather(self, obj: Any, root: int = 0) -> Optional[List[Any]]:
        """Collective: on ``root``, every rank's ``obj`` indexed by rank; None on the others.

        The default is :meth:`all_gather` (every rank receives everything); backends
        send to ``root`` only."""
        got = self.all_gather(obj)
        return got if self.rank == root else None

    def scatter(self, objs: Optional[Sequence[Any]], root: int = 0) -> Any:
        """Collective: ``root`` gives ``objs``, one object per rank (indexed by rank; the
        others pass None); every rank returns its own.

        The default broadcasts the whole list (every rank receives everything); backends
        send each rank its own object only."""
        got = self.broadcast(None if objs is None else list(objs), root)
        return got[self.rank]

    def all_reduce_minmax(self, values: Sequence[int]) -> Tuple[List[int], List[int]]:
        """Collective: the elementwise minima and maxima over the ranks of ``values`` (a
        few ints in int64's range, as many on every rank), returned on every rank.

        ``min == max`` says every rank passed the same value: agreement in one
        constant-size exchange. The default gathers to rank 0 and broadcasts the result;
        backends reduce natively."""
        got = self.gather(int64s(values), 0)
        return tuple(self.broadcast(None if got is None else minmax(got), 0))  # type: ignore

    def exchange(self, sends: Mapping[int, Buffer], sources: Iterable[int]) -> Dict[int, Buffer]:
        """Point to point: send ``sends[d]`` (bytes-like) to each rank ``d``, and return the
        one message each rank of ``sources`` sends here, by source rank (bytes-like).

        Not collective: the ranks that take part call it, each naming whom it sends to
        and whom it receives from; a message from rank ``a`` to ``b`` is matched with
        ``b``'s next ``exchange`` that lists ``a`` in ``sources`` (messages between two
        ranks arrive in the order sent). A rank may send to itself. Payloads are raw
        bytes of any size, never pickled or JSON-encoded; the caller bounds them (send
        large data in rounds). A source that sends nothing makes this raise
        :class:`CollectiveTimeoutError` naming it within the backend's timeout."""
        raise NotImplementedError

    # --- failure reporting (built on all_gather) --------------------------------------
    def failures(self, error: Optional[BaseException | str] = None) -> List[Tuple[int, str]]:
        """Collective: share each rank's status; return ``[(rank, message), ...]`` of failed ranks.

        ``error`` is this rank's exception (or message), ``None`` when it succeeded.
        """
        return [(r, text) for r, text, _ in self._failures(error)]

    def _failures(self, error: Optional[BaseException | str]) -> List[Failure]:
        if isinstance(error, BaseException):
            mine: Any = [describe_exception(error), exception_kinds(error)]
        else:
            mine = None if error is None else [str(error), []]
        return [(r, e[0], e[1]) for r, e in enumerate(self.all_gather(mine)) if e is not None]

    def check(self, error: Optional[BaseException | str] = None, what: str = "operation") -> None:
        """Collective: raise :class:`DistributedError` on every rank if any rank passed an error.

        The message names each failed rank and its exception text; on a failed
        rank the local exception is chained as ``__cause__``.
        """
        raise_failed(self._failures(error), self.size, error, what)

    def gather_outcomes(self, fn: Callable[[], Any], what: str = "operation") -> List[Any]:
        """Collective: run ``fn()`` here, then return every rank's result, indexed by rank.

        If ``fn`` raised on any rank, every rank raises the same
        :class:`DistributedError` instead (naming the failed ranks and their
        errors): one round trip for "do this everywhere, then agree on the
        outcome". Results must be JSON-able.
        """
        error, payload = _outcome(fn)
        try:
            out = self.all_gather(payload)
        except DistributedError as e:  # a rank died or hangs: say what was interrupted
            e.args = (f"{what}: {e.args[0]}",) + e.args[1:]
            raise
        raise_failed([(r, p["error"], p["kinds"]) for r, p in enumerate(out) if "error" in p],
                      self.size, error, what)
        return [p["ok"] for p in out]

    # --- the same, at a cost per rank that does not grow with the ranks ----------------
    def gather_outcomes_to(self, fn: Callable[[], Any], root: int = 0,
                           what: str = "operation") -> Optional[List[Any]]:
        """Collective: as :meth:`gather_outcomes`, but only ``root`` receives the results
        (indexed by rank); the others get None.

        The root learns every rank's outcome (:meth:`gather`) and broadcasts its verdict:
        nothing when all succeeded, else the failed ranks and their errors, upon which
        every rank raises the same :class:`DistributedError` as :meth:`gather_outcomes`
        would. A rank other than the root receives the verdict only. If the root times out
        waiting for a rank, the others raise :class:`CollectiveTimeoutError` too (waiting
        for the verdict), naming the root."""
        error, payload = _outcome(fn)
        try:
            got = self.gather(payload, root)
            failed = None if got is None else \
                [[r, p["error"], p["kinds"]] for r, p in enumerate(got) if "error" in p]
            failed = self.broadcast(failed, root)
        except DistributedError as e:  # a rank died or hangs: say what was interrupted
            e.args = (f"{what}: {e.args[0]}",) + e.args[1:]
            raise
        raise_failed([(r, e, k) for r, e, k in failed], self.size, error, what)
        return None if got is None else [p["ok"] for p in got]

    def agree_outcomes(self, fn: Callable[[], Sequence[int]], width: int,
                       what: str = "operation") -> Tuple[List[int], List[int]]:
        """Collective: run ``fn()`` here (``width`` ints), then return the elementwise
        minima and maxima over the ranks (:meth:`all_reduce_minmax`).

        If ``fn`` raised on any rank, every rank raises the same :class:`DistributedError`
        as :meth:`gather_outcomes` would: the reduction carries one more value, whether
        this rank failed, and only when some rank did do the ranks exchange their errors
        (:meth:`check`). A rank receives a constant when all succeed."""
        error: Optional[BaseException] = None
        try:
            mine = int64s(fn())
            if len(mine) != width:
                raise ValueError(f"agree_outcomes: fn gave {len(mine)} values, not {width}")
            values = [0] + mine
        except Exception as e:  # noqa: BLE001 - shared with the other ranks, then re-raised
            error, values = e, [1] + [0] * width
        try:
            mins, maxs = self.all_reduce_minmax(values)
            if maxs[0]:  # some rank failed: learn which (the rare path; every rank raises)
                self.check(error, what)
        except DistributedError as e:
            if not e.args[0].startswith(f"{what} failed on "):
                e.args = (f"{what}: {e.args[0]}",) + e.args[1:]
            raise
        return list(mins[1:]), list(maxs[1:])

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self.rank}, size={self.size})"


def _outcome(fn: Callable[[], Any]) -> Tuple[Optional[BaseException], Dict[str, Any]]:
    """Run ``fn``: (None, {"ok": result}), or (its exception, {"error", "kinds"})."""
    try:
        return None, {"ok": fn()}
    except Exception as e:  # noqa: BLE001 - shared with the other ranks, then re-raised
        return e, {"error": describe_exception(e), "kinds": exception_kinds(e)}


def raise_failed(failed: List[Failure], size: int, error: Any, what: str) -> None:
    """Raise the :class:`DistributedError` naming the ``failed`` ranks of ``size`` (from
    ``error``, this rank's own exception, if any); nothing when none failed."""
    if not failed:
        return
    lines = [f"{what} failed on {len(failed)} of {size} rank(s): "
             + ", ".join(str(r) for r, _, _ in failed)]
    lines += [f"  rank {r}: {e}" for r, e, _ in failed]
    exc = DistributedError("\n".join(lines), failures={r: e for r, e, _ in failed},
                           kinds={r: k for r, _, k in failed if k})
    if isinstance(error, BaseException):
        raise exc from error
    raise exc


class SingleProcess(Communicator):
    """The default: one process, rank 0 of 1. Collectives return at once.

    A world of one runs the same collective code paths as many ranks; in it,
    :meth:`gather_outcomes` raises ``fn``'s own exception (not a DistributedError
    wrapping it), so a single process sees the specific error."""

    def gather_outcomes(self, fn: Callable[[], Any], what: str = "operation") -> List[Any]:
        return [fn()]

    def gather_outcomes_to(self, fn: Callable[[], Any], root: int = 0,
                           what: str = "operation") -> Optional[List[Any]]:
        _root_zero(root)
        return [fn()]

    def agree_outcomes(self, fn: Callable[[], Sequence[int]], width: int,
                       what: str = "operation") -> Tuple[List[int], List[int]]:
        mine = int64s(fn())
        if len(mine) != width:
            raise ValueError(f"agree_outcomes: fn gave {len(mine)} values, not {width}")
        return list(mine), list(mine)

    def duplicate(self) -> "SingleProcess":
        return SingleProcess()

    def barrier(self) -> None:
        return None

    def all_gather(self, obj: Any) -> List[Any]:
        return [decode(encode(obj))]

    def gather(self, obj: Any, root: int = 0) -> Optional[List[Any]]:
        _root_zero(root)
        return [decode(encode(obj))]

    def all_reduce_minmax(self, values: Sequence[int]) -> Tuple[List[int], List[int]]:
        mine = int64s(values)
        return list(mine), list(mine)

    def broadcast(self, obj: Any = None, root: int = 0) -> Any:
        _root_zero(root)
        return decode(encode(obj))

    def scatter(self, objs: Optional[Sequence[Any]], root: int = 0) -> Any:
        _root_zero(root)
        return decode(encode(one_each(objs, 1)[0]))

    def exchange(self, sends: Mapping[int, Buffer], sources: Iterable[int]) -> Dict[int, Buffer]:
        sources = check_peers(sends, sources, 1, 0)
        return {0: bytes(sends[0])} if sources else {}


def _root_zero(root: int) -> None:
    if root != 0:
        raise ValueError(f"root must be 0 in a single process, got {root}")


def one_each(objs: Optional[Sequence[Any]], size: int) -> Sequence[Any]:
    """The root's ``objs`` of :meth:`Communicator.scatter`, checked: one per rank."""
    if objs is None or len(objs) != size:
        raise ValueError(f"scatter: the root must give one object per rank ({size}), got "
                         f"{None if objs is None else len(objs)}")
    return objs


def check_peers(sends: Mapping[int, Any], sources: Iterable[int], size: int,
                rank: int) -> List[int]:
    """The ``sources`` of :meth:`Communicator.exchange` as a sorted list, after checking
    that they and the destinations of ``sends`` are ranks below ``size``, and that a rank
    receiving from itself sends to itself (and the other way round)."""
    srcs = sorted(set(sources))
    bad = [r for r in list(sends) + srcs if isinstance(r, bool) or not isinstance(r, int)
           or not 0 <= r < size]
    if bad:
        raise ValueError(f"exchange: ranks must be ints in [0, {size}), got {bad[0]!r}")
    if (rank in srcs) != (rank in sends):
        raise ValueError(f"exchange: rank {rank} " + ("receives from itself but sends itself "
                         "nothing" if rank in srcs else "sends to itself but does not list "
                         "itself in sources"))
    return srcs
