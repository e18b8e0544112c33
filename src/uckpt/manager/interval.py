"""How often to checkpoint: the Young/Daly optimal interval from measured save costs.

A job that fails on average every ``M`` seconds (its MTBF, exponential failures)
and pays ``C`` seconds of lost training per checkpoint (the *stall*: how long
``save`` blocks the loop) spends, with a checkpoint after every ``T`` seconds of
work, an expected fraction of its time on checkpoints and on work redone after
failures. The interval that minimises it is, to first order (Young, 1974)::

    T = sqrt(2 C M)

and with Daly's higher-order correction (Daly, 2006), for ``C < 2 M``::

    T = sqrt(2 C M) * (1 + sqrt(C / 2M) / 3 + (C / 2M) / 9) - C

(``T = M`` when ``C >= 2 M``: checkpointing is then as expensive as failing).
``T`` is compute time between the end of one save and the start of the next.

An asynchronous save costs the loop only its stall; the time until it is
durable (committed, copied to the durable tier) adds to the work lost by a
failure but not to the optimum, except that a save cannot usefully come more
often than one per time to durable (the next one would wait for it), which
:func:`advise` takes as a lower bound.

:class:`EveryOptimal` is a save policy that saves at the advised interval from
the costs the :class:`~uckpt.CheckpointManager` measures; ``uckpt advise ROOT
--mtbf 6h`` prints the advice from the costs recorded in a root
(:mod:`uckpt.manager.costs`). Nothing here does I/O or imports a framework.
"""
from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass
from typing import Optional, Union

from ..errors import DurationError
from .policies import EveryNSeconds

__all__ = ["Advice", "EveryOptimal", "advise", "daly_interval", "expected_overhead",
           "format_duration", "parse_duration", "young_interval"]

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([smhd]?)\s*$", re.IGNORECASE)


def parse_duration(value: Union[str, float, int], what: str = "duration") -> float:
    """Seconds from ``"90s"``, ``"30m"``, ``"6h"``, ``"2d"``, ``"1.5h"`` or a plain number
    of seconds (``3600``, ``"3600"``); must be positive and finite.

    Anything else raises :class:`~uckpt.errors.DurationError` (a ``ValueError``)
    naming ``what`` and the accepted forms.
    """
    hint = 'write a positive number followed by s, m, h or d, e.g. "90s", "30m", "6h", "2d"'
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        match = _DURATION.match(value)
        if match is None:
            raise DurationError(f"{what}: cannot read {value!r} as a duration", hint=hint)
        seconds = float(match.group(1)) * _UNITS[(match.group(2) or "s").lower()]
    else:
        raise DurationError(f"{what}: expected a duration string or a number of seconds, got "
                            f"{type(value).__name__} {value!r}", hint=hint)
    if not math.isfinite(seconds) or seconds <= 0:
        raise DurationError(f"{what}: must be positive and finite, got {value!r}", hint=hint)
    return seconds


def format_duration(seconds: float) -> str:
    """``5400`` -> ``"1.5 h"``; ``0.25`` -> ``"250 ms"`` (for people, not for parsing)."""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.3g} s"


def _check_cost(cost: float, mtbf: float) -> None:
    if not (math.isfinite(cost) and cost >= 0):
        raise ValueError(f"checkpoint cost must be a finite number of seconds >= 0, got {cost!r}")
    if not (math.isfinite(mtbf) and mtbf > 0):
        raise ValueError(f"MTBF must be a positive finite number of seconds, got {mtbf!r}")


def young_interval(cost: float, mtbf: float) -> float:
    """Young's first-order optimum ``sqrt(2 C M)`` (seconds of work between saves)."""
    _check_cost(cost, mtbf)
    return math.sqrt(2.0 * cost * mtbf)


def daly_interval(cost: float, mtbf: float) -> float:
    """Daly's higher-order optimum (seconds of work between saves); ``M`` when ``C >= 2M``."""
    _check_cost(cost, mtbf)
    if cost >= 2.0 * mtbf:
        return mtbf
    x = cost / (2.0 * mtbf)
    return math.sqrt(2.0 * cost * mtbf) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - cost


def expected_overhead(interval: float, cost: float, mtbf: float, restart: float = 0.0) -> float:
    """Expected wall time per unit of work, minus one, with exponential failures.

    Each segment of ``interval`` seconds of work plus ``cost`` seconds of saving is
    retried (after ``restart`` seconds) until it runs without a failure; the
    expected time of a segment is ``M e^(R/M) (e^((T+C)/M) - 1)`` (Daly, 2006).
    """
    _check_cost(cost, mtbf)
    if not interval > 0:
        raise ValueError(f"interval must be positive, got {interval!r}")
    per_segment = mtbf * math.exp(restart / mtbf) * math.expm1((interval + cost) / mtbf)
    return per_segment / interval - 1.0


@dataclass(frozen=True)
class Advice:
    """The advised interval and what it rests on (seconds throughout).

    ``cost``: the stall per save used as ``C``; ``durable``: time from the start of
    a save until it is durable (None when unknown); ``young`` / ``daly``: the two
    optima; ``interval``: the advice (Daly's, raised to ``durable`` when saves
    would otherwise queue); ``overhead``: the expected fraction of time lost to
    saves and redone work at that interval (``restart`` included).
    """

    mtbf: float
    cost: float
    durable: Optional[float]
    young: float
    daly: float
    interval: float
    overhead: float
    restart: float = 0.0


def advise(cost: float, mtbf: float, durable: Optional[float] = None,
           restart: float = 0.0) -> Advice:
    """The advice for a save that stalls ``cost`` seconds, with failures every ``mtbf``."""
    young, daly = young_interval(cost, mtbf), daly_interval(cost, mtbf)
    interval = max(daly, durable or 0.0, 1e-9)
    return Advice(mtbf=mtbf, cost=cost, durable=durable, young=young, daly=daly,
                  interval=interval, overhead=expected_overhead(interval, cost, mtbf, restart),
                  restart=restart)


class EveryOptimal(EveryNSeconds):
    """Saves at the Young/Daly optimal interval for a mean time between failures ``mtbf``.

    ``mtbf``: a duration (``"6h"``, ``"30m"``, ``"2d"``, or seconds). The interval
    comes from the save costs its :class:`~uckpt.CheckpointManager` measures and
    reports through :meth:`measured` (the median stall of recent saves, and their
    time to durable; a manager opened on a root with recorded costs reports them
    at once). Until a cost is known, the first save comes ``first`` seconds after
    the clock starts (default one minute), so there is one to measure.

    It is an :class:`~uckpt.EveryNSeconds` whose ``seconds`` follow the advice: the
    clock starts at the first call and restarts at every ``saved()``, whatever
    triggered the save. ``advice`` holds
    the current :class:`Advice` (None before a measurement).
    """

    def __init__(self, mtbf: Union[str, float], *, first: Union[str, float] = "60s",
                 restart: Union[str, float, None] = None) -> None:
        self.mtbf = parse_duration(mtbf, "EveryOptimal: mtbf")
        self.first = parse_duration(first, "EveryOptimal: first")
        self.restart = 0.0 if restart is None else parse_duration(restart, "EveryOptimal: restart")
        self.advice: Optional[Advice] = None
        self.last: Optional[float] = None  # EveryNSeconds' clock

    @property
    def seconds(self) -> float:  # type: ignore[override]
        """Seconds of training between saves, as advised now."""
        return self.first if self.advice is None else self.advice.interval

    interval = seconds

    def measured(self, stall: float, durable: Optional[float]) -> None:
        self.advice = advise(stall, self.mtbf, durable, self.restart)

    def __repr__(self) -> str:
        return f"EveryOptimal(mtbf={self.mtbf:g})"
