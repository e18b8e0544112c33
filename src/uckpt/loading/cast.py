"""The dtype policy of a load: which stored dtypes may be converted into which, per leaf.

By default a leaf loads only into a destination of its own dtype; anything else is a
:class:`~uckpt.errors.DtypeMismatchError` naming the leaf and both dtypes, with a hint
naming ``cast=``. ``cast=`` (of :func:`uckpt.load` and ``CheckpointManager.restore``)
permits conversions explicitly:

* a casting rule, ``"safe"`` (or ``"same_kind"``, ``"equiv"``, ``"no"``), for every leaf;
* a mapping of glob patterns (``fnmatch``, matched against the leaf's path in the
  checkpoint, e.g. ``"model/fc.weight"``) to a dtype (``"bfloat16"``, a NumPy dtype) or a
  rule; the first pattern that matches a leaf decides it.

A rule admits what NumPy's ``np.can_cast(stored, destination, rule)`` admits, but never a
narrowing cast (one NumPy's ``"safe"`` refuses: float32 -> bfloat16, float64 -> float32,
int64 -> int32): so ``"same_kind"``, whose only casts beyond ``"safe"`` narrow, admits
what ``"safe"`` does, and ``"unsafe"`` is refused. A narrowing needs the destination's
dtype named for that leaf (``{"model/*": "bfloat16"}``), which admits any cast within a
kind of number (floats, bfloat16 and float8 included; integers) or that NumPy's
``"same_kind"`` admits, never float -> integer or complex -> real.

The destination's dtype decides what a leaf becomes: a leaf already of its destination's
dtype is loaded as it is, whatever the policy, and an adapter's leaf is converted only
where the adapter accepted the cast (:meth:`uckpt.adapter.ArraySpec.fits`; a fresh array
is then made in that dtype). In a load without ``state``, leaves are converted to the
dtype their pattern names, if any. The conversion runs while reading, chunk by chunk into
the destination (:mod:`uckpt.loading.castread`): no whole copy of the array in its stored
dtype is made.
"""
from __future__ import annotations

import os
from fnmatch import fnmatchcase
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import numpy as np

from .. import dtypes
from ..adapter import ArraySpec
from ..errors import DtypeMismatchError, OptionsError, UckptError

#: casting rules ``cast=`` takes; "unsafe" is refused (name the dtype per leaf instead)
RULES = ("no", "equiv", "safe", "same_kind")
_FLOATS = ("bfloat16", "float8_e4m3fn", "float8_e5m2")

Cast = Union[None, str, Mapping[str, Any]]


def _kind(name: str) -> str:
    if name in _FLOATS:
        return "f"
    return "i" if to_np(name).kind in "iu" else to_np(name).kind


def to_np(name: str) -> np.dtype:
    return dtypes.to_numpy(name)


def narrows(stored: str, dest: str) -> bool:
    """Whether converting ``stored`` to ``dest`` can lose values (NumPy's "safe" refuses it)."""
    return not np.can_cast(to_np(stored), to_np(dest), "safe")


class CastPolicy:
    """The parsed ``cast=`` of one load; records the casts its leaves were given.

    ``approved``: leaf path -> the dtype it is delivered in (a cast an adapter or the core
    accepted); ``refused``: (path, stored, destination, why) of every cast it refused."""

    def __init__(self, cast: Cast = None) -> None:
        self.given = cast is not None
        self.entries: List[Tuple[str, str]] = _parse(cast)  # (pattern, rule or dtype name)
        self.approved: Dict[str, str] = {}
        self.refused: List[Tuple[str, str, str, str]] = []

    def _entry(self, path: str) -> Optional[str]:
        for pattern, value in self.entries:
            if fnmatchcase(path, pattern):
                return value
        return None

    def fresh_dtype(self, path: str, stored: str, named: bool = False) -> str:
        """The dtype leaf ``path`` is read into when it has no destination of its own: the
        one a cast was approved to, else (``named``: a load without ``state``) the dtype
        its pattern names, else its stored one."""
        value = self.approved.get(path)
        if value is None and named:
            value = self._entry(path)
        return value if value is not None and value not in RULES else stored

    def allows(self, path: str, stored: str, dest: str) -> bool:
        """Whether leaf ``path`` (stored as ``stored``) may be loaded into a ``dest`` array;
        an allowed cast is recorded in ``approved``, a refused one in ``refused``."""
        if dest == stored:
            return True
        why = self._why_not(self._entry(path), stored, dest)
        if why is None:
            self.approved[path] = dest
            return True
        self.refused.append((path, stored, dest, why))
        return False

    @staticmethod
    def _why_not(value: Optional[str], stored: str, dest: str) -> Optional[str]:
        if value is None:
            return "no cast= entry matches it"
        if value in RULES:
            rule: Any = value  # (one of RULES, NumPy's Literal)
            if not np.can_cast(to_np(stored), to_np(dest), rule):
                return f"NumPy's {value!r} rule does not allow it"
            if narrows(stored, dest):
                return (f"it narrows (NumPy's {value!r} would allow it, but a rule never "
                        "narrows: name the dtype for this leaf)")
            return None
        if value != dest:
            return f"cast= names {value} for it"
        if _kind(stored) == _kind(dest) or np.can_cast(to_np(stored), to_np(dest), "same_kind"):
            return None
        return f"{stored} -> {dest} changes the kind of number"

    def check(self, path: str, stored: str, dest: str) -> None:
        """Raise :class:`DtypeMismatchError` unless ``allows(path, stored, dest)``."""
        if not self.allows(path, stored, dest):
            raise DtypeMismatchError(
                f"{path!r}: the checkpoint holds {stored}, the destination is {dest}",
                leaf=path, hint=self.hint())

    def hint(self) -> str:
        """How to load the leaves refused so far (for a DtypeMismatchError)."""
        if not self.refused:
            return ("to convert while loading, pass cast={'<glob pattern>': '<dtype>'} or "
                    "cast='safe' (widening casts only)")
        path, stored, dest, why = self.refused[0]
        same = [p for p, s, d, _ in self.refused if (s, d) == (stored, dest)]
        if len(same) > 1:  # one pattern for all of them: their common folder
            prefix = os.path.commonprefix(same)
            path = prefix[:prefix.rfind("/") + 1] + "*"
        example = f"cast={{{path!r}: {dest!r}}}"
        if not narrows(stored, dest):
            example = f"cast='safe' or {example}"
        state = f"not converted: {why}" if self.given else "no cast= was given"
        return f"{stored} -> {dest}: {state}; to convert while loading, pass {example}"


def _parse(cast: Cast) -> List[Tuple[str, str]]:
    if cast is None:
        return []
    if isinstance(cast, str):
        return [("*", _value("cast", cast))]
    if not isinstance(cast, Mapping):
        raise OptionsError(f"cast= takes a casting rule or a mapping of glob patterns to "
                           f"dtypes, not a {type(cast).__name__}",
                           hint="e.g. cast='safe' or cast={'model/*': 'bfloat16'}")
    out = []
    for pattern, value in cast.items():
        if not isinstance(pattern, str) or not pattern:
            raise OptionsError(f"cast= pattern {pattern!r} is not a non-empty string",
                               hint="patterns are globs over leaf paths, e.g. 'model/*'")
        out.append((pattern, _value(f"cast[{pattern!r}]", value)))
    return out


def _value(where: str, value: Any) -> str:
    if isinstance(value, str) and value in RULES:
        return value
    if isinstance(value, str) and value == "unsafe":
        raise OptionsError(f"{where}: 'unsafe' casts are not taken by rule",
                           hint="name the dtype each leaf is to become, e.g. "
                                "cast={'model/*': 'bfloat16'}")
    try:
        return value if isinstance(value, str) and value in dtypes.NAMES else \
            dtypes.name_of(np.dtype(value))
    except (TypeError, UckptError):
        raise OptionsError(f"{where}: {value!r} is neither a casting rule ({', '.join(RULES)}) "
                           "nor a dtype the format holds",
                           hint=f"dtypes: {', '.join(dtypes.NAMES)}") from None


class CastSpec(ArraySpec):
    """An :class:`ArraySpec` of a load with a dtype policy: :meth:`fits` asks the policy
    (and an accepted cast makes the core deliver the leaf in the destination's dtype)."""

    path: str
    policy: CastPolicy

    def fits(self, dtype: str) -> bool:
        return self.policy.allows(self.path, self.dtype, dtype)


def with_hint(e: UckptError, hint: str) -> UckptError:
    """``e`` (a DtypeMismatchError from an adapter) with ``hint`` added to its message."""
    if e.hint is None and e.args:
        e.hint = hint
        e.args = (f"{e.args[0]}\n  hint: {hint}",) + tuple(e.args[1:])
    return e
