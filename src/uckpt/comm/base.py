"""The communicator interface and the single-process default."""
from __future__ import annotations

import json
import traceback
from typing import Any, Callable, Dict, List, Optional, Tuple

from .. import knobs
from ..errors import DistributedError

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


#: one failed rank: (rank, message, kinds of its exception, empty for a bare message)
Failure = Tuple[int, str, List[str]]


class Communicator:
    """Rank, size and the few collectives uckpt needs, over one distributed engine.

    Call order: every method except :attr:`rank` and :attr:`size` is
    *collective*: every rank of the group calls it, in the same order, with the
    same ``root``. A rank that skips a call, or calls them in another order,
    makes the others wait until the timeout. Constructing a backend communicator
    may itself be collective (see the backend).

    Objects passed to :meth:`all_gather` and :meth:`broadcast` must be small and
    JSON-able; they travel as JSON-encoded bytes, never pickles. (Tuples come
    back as lists.)

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
        _raise_failed(self._failures(error), self.size, error, what)

    def gather_outcomes(self, fn: Callable[[], Any], what: str = "operation") -> List[Any]:
        """Collective: run ``fn()`` here, then return every rank's result, indexed by rank.

        If ``fn`` raised on any rank, every rank raises the same
        :class:`DistributedError` instead (naming the failed ranks and their
        errors): one round trip for "do this everywhere, then agree on the
        outcome". Results must be JSON-able.
        """
        error: Optional[BaseException] = None
        try:
            payload: Dict[str, Any] = {"ok": fn()}
        except Exception as e:  # noqa: BLE001 - shared with the other ranks, then re-raised
            error = e
            payload = {"error": describe_exception(e), "kinds": exception_kinds(e)}
        try:
            out = self.all_gather(payload)
        except DistributedError as e:  # a rank died or hangs: say what was interrupted
            e.args = (f"{what}: {e.args[0]}",) + e.args[1:]
            raise
        _raise_failed([(r, p["error"], p["kinds"]) for r, p in enumerate(out) if "error" in p],
                      self.size, error, what)
        return [p["ok"] for p in out]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self.rank}, size={self.size})"


def _raise_failed(failed: List[Failure], size: int, error: Any, what: str) -> None:
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

    def duplicate(self) -> "SingleProcess":
        return SingleProcess()

    def barrier(self) -> None:
        return None

    def all_gather(self, obj: Any) -> List[Any]:
        return [decode(encode(obj))]

    def broadcast(self, obj: Any = None, root: int = 0) -> Any:
        if root != 0:
            raise ValueError(f"root must be 0 in a single process, got {root}")
        return decode(encode(obj))
