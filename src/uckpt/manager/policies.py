"""When to save and what to keep, as small policy objects.

:class:`uckpt.CheckpointManager` takes two kinds of policy:

* a **save policy** (:class:`SavePolicy`) decides *when* to save:
  :class:`EveryNSteps`, :class:`EveryNSeconds`, :class:`OnSignal`, :class:`Never`,
  combined with ``|`` into :class:`AnyOf`;
* a **retention policy** (:class:`RetentionPolicy`) decides *which committed
  checkpoints to keep*: :class:`KeepLast`, :class:`KeepEvery`, :class:`KeepBest`,
  :class:`KeepAll`, combined with ``|`` into :class:`KeepUnion`
  (:func:`as_retention` turns the short forms ``None``, ``5`` and lists into one).

Example::

    save_policy = EveryNSteps(1000) | EveryNSeconds(1800) | OnSignal()
    retention = KeepLast(3) | KeepEvery(10_000) | KeepBest(1, "val_loss")

Save policies hold a little state (a clock, a signal flag) and take the time
as an argument, so tests can inject it. Retention policies are pure functions
of the list of checkpoints they are given. Neither does any I/O nor imports a
framework.

In a job of several processes a save policy's answer is one rank's opinion:
clocks differ between ranks and a signal may reach only some of them. Whoever
calls :meth:`SavePolicy.should_save` on every rank must agree on one answer
(for example "save if any rank says so", by an all-reduce) before saving, or
the ranks that save wait forever for those that do not.
"""
from __future__ import annotations

import abc
import math
import numbers
import signal as _signal
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple, Union

__all__ = [
    "AnyOf", "CheckpointInfo", "EveryNSeconds", "EveryNSteps", "KeepAll", "KeepBest",
    "KeepEvery", "KeepLast", "KeepUnion", "Never", "OnSignal", "RetentionPolicy",
    "SavePolicy", "as_retention",
]


# --- argument checks ------------------------------------------------------------------------
def _positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{what} must be a positive int, got {value!r}")
    return int(value)


def _non_negative_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{what} must be a non-negative int, got {value!r}")
    return int(value)


# ============================================================================================
# Save policies
# ============================================================================================
def _flatten_members(combo: type, member: type, policies: Iterable[Any],
                     hint: str = "") -> List[Any]:
    """The members of a combination (``AnyOf``, ``KeepUnion``), nested ones flattened."""
    flat: List[Any] = []
    for p in policies:
        if isinstance(p, combo):
            flat.extend(p.policies)  # type: ignore[attr-defined]  # combo: AnyOf, KeepUnion
        elif isinstance(p, member):
            flat.append(p)
        else:
            raise TypeError(f"{combo.__name__}: expected {member.__name__} objects, got "
                            f"{type(p).__name__} {p!r}")
    if not flat:
        raise ValueError(f"{combo.__name__} needs at least one policy"
                         + (f" ({hint})" if hint else ""))
    return flat


class SavePolicy(abc.ABC):
    """Decides at which steps the manager saves.

    Call order (all from the training process's thread that drives the manager):

    1. ``should_save(step, now)`` once per training step that the manager is
       asked about, with ``now = time.monotonic()``; True means "save now".
       It may change the policy's state (a clock starts on the first call) but
       never saves anything itself.
    2. ``saved(step, now)`` after every save the manager takes, whatever
       triggered it (this policy, another one, or a manual save), once the
       state is snapshotted. Time-based policies restart their clock here.
    2b. ``measured(stall, durable)`` after a save's costs are known (and when a
       manager opens a root holding recorded costs); cost-driven policies
       (:class:`uckpt.manager.interval.EveryOptimal`) use it, the others ignore it.
    3. ``pending_exit`` may be read at any time; after a save, True asks the
       manager to wait for that save to commit and then end the process
       cleanly. The policy itself never exits.
    4. ``close()`` once, when the manager closes; it undoes what the policy
       installed (signal handlers). Policies are also context managers.

    Combine policies with ``|``: ``EveryNSteps(100) | OnSignal()`` is an
    :class:`AnyOf`.
    """

    #: True when ``should_save`` depends on the step alone (then every rank of a job
    #: decides alike without talking; otherwise the manager makes the ranks agree)
    step_determined = False

    @abc.abstractmethod
    def should_save(self, step: int, now: float) -> bool:
        """Whether the manager should save at ``step``; ``now`` is ``time.monotonic()``."""

    def saved(self, step: int, now: float) -> None:
        """Note that a checkpoint of ``step`` was just taken at time ``now``."""

    def measured(self, stall: float, durable: Optional[float]) -> None:
        """The manager's latest measured save costs, in seconds: the median stall (how
        long ``save`` blocks) and time until a save is durable (None if unknown)."""

    @property
    def pending_exit(self) -> bool:
        """True when the process should end cleanly after the next (or the last) save."""
        return False

    def close(self) -> None:
        """Undo what the policy installed; calling it twice is harmless."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __or__(self, other):
        if not isinstance(other, SavePolicy):
            return NotImplemented
        return AnyOf(self, other)


class Never(SavePolicy):
    """Never asks for a save: only explicit ``save()`` calls write checkpoints."""

    step_determined = True

    def should_save(self, step: int, now: float) -> bool:
        return False

    def __repr__(self) -> str:
        return "Never()"


class EveryNSteps(SavePolicy):
    """Saves at every step ``s > 0`` with ``(s - offset) % n == 0``.

    ``offset`` is a phase, not a starting step: ``EveryNSteps(1000)`` saves at
    1000, 2000, ...; ``EveryNSteps(1000, offset=500)`` at 500, 1500, 2500, ...
    (as would ``offset=1500``). Step 0, the untrained state, is never saved by
    this policy. The answer depends only on ``step``, so every rank agrees.
    """

    step_determined = True

    def __init__(self, n: int, offset: int = 0) -> None:
        self.n = _positive_int(n, "EveryNSteps: n")
        self.offset = _non_negative_int(offset, "EveryNSteps: offset")

    def should_save(self, step: int, now: float) -> bool:
        return step > 0 and (step - self.offset) % self.n == 0

    def __repr__(self) -> str:
        return f"EveryNSteps({self.n}, offset={self.offset})" if self.offset else \
            f"EveryNSteps({self.n})"


class EveryNSeconds(SavePolicy):
    """Saves once at least ``seconds`` have passed since the last save.

    The clock starts at the first ``saved()`` or ``should_save()`` call,
    whichever comes first (using the ``now`` passed in, not the time of
    construction), and restarts at every ``saved()``, whatever triggered that
    save. So the first save comes ``seconds`` after training starts, and a
    save for another reason postpones the next timed one. Once due, the answer
    stays True until ``saved()`` is called.
    """

    def __init__(self, seconds: float) -> None:
        if isinstance(seconds, bool) or not isinstance(seconds, numbers.Real) or \
                not math.isfinite(seconds) or seconds <= 0:
            raise ValueError(f"EveryNSeconds: seconds must be a positive finite number, "
                             f"got {seconds!r}")
        self.seconds: float = (int(seconds) if isinstance(seconds, numbers.Integral)
                               else float(seconds))
        self.last: Optional[float] = None  # when the clock last (re)started

    def should_save(self, step: int, now: float) -> bool:
        if self.last is None:
            self.last = now
        return now - self.last >= self.seconds

    def saved(self, step: int, now: float) -> None:
        self.last = now

    def __repr__(self) -> str:
        return f"EveryNSeconds({self.seconds!r})"


def _default_signals() -> Tuple[int, ...]:
    # SIGUSR1 does not exist on Windows
    return tuple(getattr(_signal, name) for name in ("SIGTERM", "SIGUSR1")
                 if hasattr(_signal, name))


def _signal_number(sig: Union[int, str]) -> int:
    if isinstance(sig, str):
        name = sig.upper()
        if not name.startswith("SIG"):
            name = "SIG" + name
        try:
            num = int(_signal.Signals[name])
        except KeyError:
            raise ValueError(f"OnSignal: unknown signal name {sig!r}") from None
    elif isinstance(sig, numbers.Integral) and not isinstance(sig, bool):
        num = int(sig)
        if num not in set(int(s) for s in _signal.valid_signals()):
            raise ValueError(f"OnSignal: {sig!r} is not a valid signal number here")
    else:
        raise TypeError(f"OnSignal: a signal must be a number or a name such as 'SIGTERM', "
                        f"got {type(sig).__name__} {sig!r}")
    uncatchable = {int(getattr(_signal, n)) for n in ("SIGKILL", "SIGSTOP") if hasattr(_signal, n)}
    if num in uncatchable:
        raise ValueError(f"OnSignal: {_signal_name(num)} cannot be caught by any process")
    return num


def _signal_name(num: int) -> str:
    try:
        return _signal.Signals(num).name
    except ValueError:
        return str(num)


def _require_main_thread(what: str) -> None:
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            f"OnSignal: {what} must happen in the main thread (Python only lets the main "
            f"thread set signal handlers); this is thread "
            f"{threading.current_thread().name!r}. Create the policy (and the manager) "
            f"before starting threads, or in the main thread.")


class OnSignal(SavePolicy):
    """Saves when the process receives one of ``signals`` (by default SIGTERM, SIGUSR1).

    Cluster schedulers send such signals some time before they stop a job;
    with this policy the next ``should_save`` after the signal says True, and
    with ``exit=True`` (the default) :attr:`pending_exit` asks the manager to
    end the process cleanly once that save is committed. With ``exit=False`` a
    signal only requests a save ("checkpoint now") and training goes on; every
    later signal requests another one.

    Constructing the policy installs its handlers, which is only possible in
    the main thread (``RuntimeError`` otherwise). While installed they
    *replace* any earlier handlers of those signals (they do not chain to
    them; the default action of SIGTERM, ending the process, is suppressed
    too); :meth:`close` puts the earlier ones back. Close several ``OnSignal``
    policies in the reverse order of their creation. A handler set outside
    Python (``signal.getsignal`` gives None) is restored as ``SIG_DFL``.

    The handler only sets attributes, so it is safe whatever the main thread
    is doing when the signal arrives. Attributes:

    * ``received``: the number of the latest signal received, or None;
    * ``final_saved``: True once a save was taken after a signal;
    * ``exit``: whether the manager should end the process after that save.

    ``should_save`` is True while a signal has arrived since the last
    ``saved()`` call; ``saved()`` clears nothing (``received`` keeps its value)
    but marks the signals so far as saved.
    """

    def __init__(self, signals: Optional[Iterable[Union[int, str]]] = None,
                 exit: bool = True) -> None:
        sigs = _default_signals() if signals is None else signals
        if isinstance(sigs, (int, str)):
            sigs = (sigs,)
        nums: List[int] = []
        for s in sigs:
            n = _signal_number(s)
            if n not in nums:
                nums.append(n)
        if not nums:
            raise ValueError("OnSignal: signals must name at least one signal")
        self.signals: Tuple[int, ...] = tuple(nums)
        self.exit = bool(exit)
        self.received: Optional[int] = None
        self.final_saved = False
        self._count = 0        # signals received so far (written by the handler only)
        self._saved_count = 0  # value of _count at the last saved()
        self._previous: Dict[int, Any] = {}
        _require_main_thread("installing signal handlers")
        try:
            for n in self.signals:
                self._previous[n] = _signal.signal(n, self._handle)
        except BaseException:
            self._restore()
            raise

    def _handle(self, signum, frame) -> None:
        # runs in the main thread between two bytecodes: set attributes, nothing more
        self.received = signum
        self._count += 1

    @property
    def installed(self) -> bool:
        """Whether this policy's handlers are in place (True until :meth:`close`)."""
        return bool(self._previous)

    def should_save(self, step: int, now: float) -> bool:
        return self._count > self._saved_count

    def saved(self, step: int, now: float) -> None:
        count = self._count  # read once: a signal arriving now stays pending
        if count > self._saved_count:
            self.final_saved = True
        self._saved_count = count

    @property
    def pending_exit(self) -> bool:
        return self.exit and self.received is not None

    def close(self) -> None:
        if self._previous:
            _require_main_thread("restoring signal handlers")
            self._restore()

    def _restore(self) -> None:
        for n, prev in reversed(list(self._previous.items())):
            _signal.signal(n, _signal.SIG_DFL if prev is None else prev)
            del self._previous[n]

    def __repr__(self) -> str:
        names = ", ".join(repr(_signal_name(n)) for n in self.signals)
        if len(self.signals) == 1:
            names += ","
        return f"OnSignal(({names}), exit={self.exit})"


class AnyOf(SavePolicy):
    """Saves when any of ``policies`` says so; ``a | b`` builds one.

    Every policy is asked at every step (no short cut), so each keeps its own
    view of time. ``saved()`` and ``close()`` reach all of them (``close`` in
    reverse order, so stacked signal handlers unwind correctly, and all are
    closed even if one fails). ``pending_exit`` is True if any member's is.
    Nested ``AnyOf`` are flattened.
    """

    def __init__(self, *policies: SavePolicy) -> None:
        flat = _flatten_members(AnyOf, SavePolicy, policies,
                                "use Never() to save only on explicit calls")
        self.policies: Tuple[SavePolicy, ...] = tuple(flat)

    def should_save(self, step: int, now: float) -> bool:
        answers = [p.should_save(step, now) for p in self.policies]
        return any(answers)

    def saved(self, step: int, now: float) -> None:
        for p in self.policies:
            p.saved(step, now)

    def measured(self, stall: float, durable: Optional[float]) -> None:
        for p in self.policies:
            p.measured(stall, durable)

    @property
    def pending_exit(self) -> bool:
        return any(p.pending_exit for p in self.policies)

    @property
    def step_determined(self) -> bool:  # type: ignore[override]
        return all(p.step_determined for p in self.policies)

    def close(self) -> None:
        first: Optional[BaseException] = None
        for p in reversed(self.policies):
            try:
                p.close()
            except BaseException as e:  # close the others before re-raising
                if first is None:
                    first = e
        if first is not None:
            raise first

    def __repr__(self) -> str:
        return " | ".join(repr(p) for p in self.policies)


# ============================================================================================
# Retention policies
# ============================================================================================
@dataclass(frozen=True)
class CheckpointInfo:
    """What a retention policy knows about one committed checkpoint.

    ``metrics``: numbers the user attached to the checkpoint (may be empty);
    ``created``: when it was committed, as Unix time (0 when unknown).
    """

    step: int
    metrics: Mapping[str, Any] = field(default_factory=dict, hash=False)
    created: float = 0.0

    def __post_init__(self) -> None:
        _non_negative_int(self.step, "CheckpointInfo: step")
        if not isinstance(self.metrics, Mapping):
            raise TypeError(f"CheckpointInfo: metrics must be a mapping, got "
                            f"{type(self.metrics).__name__}")


class RetentionPolicy(abc.ABC):
    """Decides which committed checkpoints to keep.

    Call order: after each commit, the manager (on the coordinating rank only)
    calls ``keep(infos)`` with one :class:`CheckpointInfo` per committed
    checkpoint (one per step, in any order) and deletes every checkpoint whose
    step is not in the returned set -- except those it protects itself (such
    as the newest one), which are no concern of the policy.

    Policies are pure: the answer depends only on ``infos`` (never on the
    clock, the disk or earlier calls), and only steps present in ``infos`` are
    returned. Combine them with ``|``: ``KeepLast(5) | KeepEvery(1000)`` keeps
    the union.
    """

    @abc.abstractmethod
    def keep(self, infos: Sequence[CheckpointInfo]) -> Set[int]:
        """The steps to keep, a subset of the steps of ``infos``."""

    def _key(self) -> tuple:
        """The parameters that make two policies of one class equal (identity by default)."""
        return (id(self),)

    def __eq__(self, other) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._key()))

    def __or__(self, other):
        if not isinstance(other, RetentionPolicy):
            return NotImplemented
        return KeepUnion(self, other)


class KeepAll(RetentionPolicy):
    """Keeps every checkpoint."""

    def keep(self, infos: Sequence[CheckpointInfo]) -> Set[int]:
        return {i.step for i in infos}

    def _key(self) -> tuple:
        return ()

    def __repr__(self) -> str:
        return "KeepAll()"


class KeepLast(RetentionPolicy):
    """Keeps the ``n`` checkpoints with the highest steps."""

    def __init__(self, n: int) -> None:
        self.n = _positive_int(n, "KeepLast: n")

    def keep(self, infos: Sequence[CheckpointInfo]) -> Set[int]:
        return set(sorted({i.step for i in infos})[-self.n:])

    def _key(self) -> tuple:
        return (self.n,)

    def __repr__(self) -> str:
        return f"KeepLast({self.n})"


class KeepEvery(RetentionPolicy):
    """Keeps the checkpoints whose step is a multiple of ``n`` (step 0 included)."""

    def __init__(self, n: int) -> None:
        self.n = _positive_int(n, "KeepEvery: n")

    def keep(self, infos: Sequence[CheckpointInfo]) -> Set[int]:
        return {i.step for i in infos if i.step % self.n == 0}

    def _key(self) -> tuple:
        return (self.n,)

    def __repr__(self) -> str:
        return f"KeepEvery({self.n})"


class KeepBest(RetentionPolicy):
    """Keeps the ``n`` checkpoints with the best ``metrics[metric]``.

    ``mode="min"`` (the default) means lower is better (a loss), ``"max"``
    higher is better (an accuracy). Only checkpoints that carry the metric
    compete: those without it, or with None, are never kept by this policy.
    The value must be a real number (int, float, NumPy scalar; a bool or a
    string is a ``TypeError``); NaN ranks below every number, infinities
    included, so a diverged run is kept only if there is nothing better. Ties
    go to the newer step.
    """

    def __init__(self, n: int, metric: str, mode: str = "min") -> None:
        self.n = _positive_int(n, "KeepBest: n")
        if not isinstance(metric, str) or not metric:
            raise ValueError(f"KeepBest: metric must be a non-empty str, got {metric!r}")
        if mode not in ("min", "max"):
            raise ValueError(f"KeepBest: mode must be 'min' (lower is better) or 'max' "
                             f"(higher is better), got {mode!r}")
        self.metric = metric
        self.mode = mode

    def _value(self, info: CheckpointInfo) -> Optional[float]:
        v = info.metrics.get(self.metric)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise TypeError(
                f"KeepBest: checkpoint at step {info.step} has metric {self.metric!r} = {v!r} "
                f"({type(v).__name__}); KeepBest needs a real number. Pass metrics as floats "
                f"when saving.")
        return float(v)

    def keep(self, infos: Sequence[CheckpointInfo]) -> Set[int]:
        ranked = []
        for info in infos:
            v = self._value(info)
            if v is None:
                continue
            if math.isnan(v):
                key = (1, 0.0, -info.step)
            else:
                key = (0, v if self.mode == "min" else -v, -info.step)
            ranked.append((key, info.step))
        ranked.sort()
        return {step for _, step in ranked[:self.n]}

    def _key(self) -> tuple:
        return (self.n, self.metric, self.mode)

    def __repr__(self) -> str:
        return f"KeepBest({self.n}, {self.metric!r}, mode={self.mode!r})"


class KeepUnion(RetentionPolicy):
    """Keeps every checkpoint that any of ``policies`` keeps; ``a | b`` builds one.

    Nested unions are flattened.
    """

    def __init__(self, *policies: RetentionPolicy) -> None:
        flat = _flatten_members(KeepUnion, RetentionPolicy, policies)
        self.policies: Tuple[RetentionPolicy, ...] = tuple(flat)

    def keep(self, infos: Sequence[CheckpointInfo]) -> Set[int]:
        out: Set[int] = set()
        for p in self.policies:
            out |= p.keep(infos)
        return out

    def _key(self) -> tuple:
        return self.policies

    def __repr__(self) -> str:
        return " | ".join(repr(p) for p in self.policies)


def as_retention(obj: Any) -> RetentionPolicy:
    """Turn the short forms a manager accepts into a :class:`RetentionPolicy`.

    ``None`` -> :class:`KeepAll`; an int ``n`` -> ``KeepLast(n)``; a policy ->
    itself; a list or tuple -> the union of its items, each converted the same
    way (``[3, KeepEvery(1000)]`` is ``KeepLast(3) | KeepEvery(1000)``).
    Anything else is a ``TypeError``; a non-positive int or an empty list a
    ``ValueError``.
    """
    if obj is None:
        return KeepAll()
    if isinstance(obj, RetentionPolicy):
        return obj
    if isinstance(obj, numbers.Integral) and not isinstance(obj, bool):
        return KeepLast(obj)  # type: ignore[arg-type]  # any Integral: KeepLast checks it
    if isinstance(obj, (list, tuple)):
        if not obj:
            raise ValueError("retention: an empty list keeps nothing; pass None to keep "
                             "every checkpoint, or an int n to keep the newest n")
        return KeepUnion(*(as_retention(o) for o in obj))
    raise TypeError(f"retention must be None, an int (keep the newest n), a RetentionPolicy "
                    f"or a list of them, got {type(obj).__name__} {obj!r}")
