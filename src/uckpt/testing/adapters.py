"""The adapter conformance suite: what every :class:`~uckpt.adapter.Adapter` must do.

Describe one kind of object with an :class:`AdapterCase` and run the suite, either
under pytest (subclass :class:`AdapterConformance`; each check becomes a test)::

    from uckpt.testing.adapters import AdapterCase, AdapterConformance

    class TestMyAdapter(AdapterConformance):
        cases = [AdapterCase("estimator", make=make_estimator, mutate=fit_a_little,
                             adapter=EstimatorAdapter(), make_mismatched=...)]

or without it (:func:`check_adapter` runs every check, raising
:class:`ConformanceError`, an ``AssertionError``, at the first failure).

The checks, each on real files in a directory you give:

``round_trip``
    save an object, restore into a fresh object made from another seed, and get
    the same state, bit for bit and dtype for dtype (an adapter whose ``restore``
    returns a new object, for immutable arrays, has it put into the state and the
    tree ``uckpt.load`` returns: the suite checks both and compares that one);
``dtypes``
    every array keeps its dtype: in the manifest, in ``uckpt.load`` and in the
    restored object;
``snapshot_isolation``
    an asynchronous save holds the state of the moment ``save`` returned, however
    the object changes afterwards;
``independence``
    a restored object shares no memory with the saved one, nor with the checkpoint
    (changing either leaves the other as it was);
``strict_keys``
    top-level keys missing from the checkpoint are refused, unexpected ones too
    unless ``strict=False``, and nothing changes when refused;
``mismatch``
    an object of another structure (``make_mismatched``) is refused with a
    :class:`~uckpt.errors.StateMismatchError` whose message names the object's path
    in the state, before anything changes;
``restore_before_build``
    an object whose state does not exist yet (``make_unbuilt``: an optimizer before
    its first step, a model before it is built) is restored completely.

The comparison is of :attr:`AdapterCase.state_of`, by default the adapter's own
``extract`` with every array copied: so a check fails when the restored object
differs in anything the adapter saves.
"""
from __future__ import annotations

import contextlib
import copy
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional

import numpy as np

from .. import api
from ..adapter import Adapter, DeviceArray
from ..errors import KeyMismatchError, StateMismatchError, UckptError
from ..registry import find_adapter, register_adapter, unregister_adapter
from ..tree.shard import Shard

__all__ = ["AdapterCase", "AdapterConformance", "ConformanceError", "CHECKS", "check_adapter",
           "registered"]

#: where the object sits in the state the checks save: its path is ``outer/subject``
OUTER, KEY = "outer", "subject"
PATH = f"{OUTER}/{KEY}"


class ConformanceError(AssertionError):
    """An adapter does not do what the contract of :mod:`uckpt.adapter` asks."""


@dataclass
class AdapterCase:
    """One kind of object and how to make, change and compare it.

    ``make(seed)``: a new object ready to be saved, its state determined by ``seed``
    (two seeds must give different states). ``mutate(obj)``: change the state, as a
    training step does: in place (returning None), or returning the changed object
    (immutable objects such as JAX arrays). ``adapter``: the adapter under test (registered for the
    duration of the checks when given; default: the one uckpt finds for the object).
    ``make_mismatched()``: an object of the same kind whose structure differs (another
    shape, a missing entry), which a restore must refuse. ``make_unbuilt()``: an object
    whose state does not exist yet, which a restore must complete. ``state_of(obj)``:
    what must be equal after a round trip (default: the adapter's ``extract`` with arrays
    copied). ``strict_keys``: False skips the top-level key checks (they test the core,
    not the adapter, and cost a save)."""

    name: str
    make: Callable[[int], Any]
    mutate: Callable[[Any], None]
    adapter: Optional[Adapter] = None
    make_mismatched: Optional[Callable[[], Any]] = None
    make_unbuilt: Optional[Callable[[], Any]] = None
    state_of: Optional[Callable[[Any], Any]] = None
    strict_keys: bool = True

    def state(self, obj: Any) -> Any:
        if self.state_of is not None:
            return self.state_of(obj)
        adapter = find_adapter(obj)
        if adapter is None:
            raise ConformanceError(f"{self.name}: no adapter handles a {type(obj).__qualname__}")
        return host_copy(adapter.extract(obj))


@contextlib.contextmanager
def registered(adapter: Optional[Adapter]) -> Iterator[None]:
    """Register ``adapter`` (if given) for the duration of the block."""
    if adapter is None:
        yield
        return
    register_adapter(adapter)
    try:
        yield
    finally:
        unregister_adapter(adapter)


def host_copy(tree: Any) -> Any:
    """``tree`` with every array leaf (ndarray, DeviceArray, Shard) copied to a new ndarray."""
    if isinstance(tree, Shard):
        return host_copy(tree.array)
    if isinstance(tree, DeviceArray):
        out = np.empty(tree.shape, tree.dtype)
        done = tree.copy_to(out)
        if done is not None and hasattr(done, "synchronize"):
            done.synchronize()
        return out
    if isinstance(tree, np.ndarray):
        return np.array(tree, copy=True)
    if isinstance(tree, dict):
        return {k: host_copy(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(host_copy(v) for v in tree)
    return copy.copy(tree)


def difference(a: Any, b: Any, where: str = "") -> Optional[str]:
    """The first difference between two trees (arrays: dtype, shape and bits), or None."""
    here = where or "<root>"
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
            return f"{here}: {type(a).__name__} vs {type(b).__name__}"
        if a.dtype != b.dtype or a.shape != b.shape:
            return f"{here}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
        ab = np.ascontiguousarray(a).view(np.uint8) if a.size else a
        bb = np.ascontiguousarray(b).view(np.uint8) if b.size else b
        return None if np.array_equal(ab, bb) else f"{here}: array values differ"
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return f"{here}: keys {sorted(map(str, set(a) ^ set(b)))} in one only"
        for k in a:
            d = difference(a[k], b[k], f"{where}/{k}" if where else str(k))
            if d:
                return d
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if type(a) is not type(b) or len(a) != len(b):
            return f"{here}: {type(a).__name__} of {len(a)} vs {type(b).__name__} of {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            d = difference(x, y, f"{where}/{i}" if where else str(i))
            if d:
                return d
        return None
    if type(a) is not type(b):
        return f"{here}: {type(a).__name__} {a!r} vs {type(b).__name__} {b!r}"
    if isinstance(a, float) and math.isnan(a) and math.isnan(b):
        return None
    return None if a == b else f"{here}: {a!r} vs {b!r}"


def _expect_same(case: AdapterCase, what: str, want: Any, got: Any) -> None:
    d = difference(want, got)
    if d:
        raise ConformanceError(f"{case.name}: {what}: {d}")


def _nest(obj: Any) -> dict:
    return {OUTER: {KEY: obj}}


def _mutated(case: AdapterCase, obj: Any) -> Any:
    """``obj`` after ``case.mutate``: itself, or the new object it returned."""
    out = case.mutate(obj)
    return obj if out is None else out


def _restored(case: AdapterCase, target: Path, obj: Any, **kwargs: Any) -> Any:
    """Load ``target`` into ``obj``; the object that holds the state afterwards: ``obj``
    (restored in place) or the new object the load put into the state, which must be the
    one the load returned too."""
    state = _nest(obj)
    tree = api.load(target, state, **kwargs)
    got = state[OUTER][KEY]
    if got is not obj and tree.get(OUTER, {}).get(KEY) is not got:
        raise ConformanceError(f"{case.name}: the load put a new object into the state at "
                               f"{PATH!r} but returned {type(tree[OUTER][KEY]).__name__}")
    return got


def _saved(case: AdapterCase, directory: Path, name: str, seed: int = 0):
    """A mutated object of ``seed``, its state, and the checkpoint it was saved to."""
    obj = _mutated(case, case.make(seed))
    want = case.state(obj)
    target = Path(directory) / name
    api.save(target, _nest(obj))
    return obj, want, target


def _fresh(case: AdapterCase, want: Any) -> Any:
    fresh = case.make(1)
    if difference(want, case.state(fresh)) is None:
        raise ConformanceError(f"{case.name}: make(1) gives the state that was saved from "
                               "make(0): the round trip would prove nothing; let the seed "
                               "change the state")
    return fresh


def check_round_trip(case: AdapterCase, directory: Path) -> None:
    _, want, target = _saved(case, directory, "round_trip")
    fresh = _restored(case, target, _fresh(case, want))
    _expect_same(case, "restored into a fresh object", want, case.state(fresh))
    # and again from the same checkpoint: loading is repeatable
    again = _restored(case, target, _fresh(case, want))
    _expect_same(case, "restored a second time", want, case.state(again))


def check_dtypes(case: AdapterCase, directory: Path) -> None:
    obj, want, target = _saved(case, directory, "dtypes")
    adapter = find_adapter(obj)
    extracted = host_copy(adapter.extract(obj))
    manifest = api.manifest(target)
    loaded = api.load(target)[OUTER][KEY]
    arrays: List[tuple] = []
    _arrays(extracted, "", arrays)
    if not arrays:
        return
    got: List[tuple] = []
    _arrays(loaded, "", got)
    have = {p: (str(a.dtype), a.shape) for p, a in got}
    for path, arr in arrays:
        if have.get(path) != (str(arr.dtype), arr.shape):
            raise ConformanceError(f"{case.name}: {PATH}/{path}: extracted as {arr.dtype}"
                                   f"{list(arr.shape)}, loaded back as {have.get(path)}")
        entry = manifest.arrays.get(f"{PATH}/{path}")
        if entry is not None and entry.shape != arr.shape:
            raise ConformanceError(f"{case.name}: {PATH}/{path}: the manifest records shape "
                                   f"{list(entry.shape)} for an array of {list(arr.shape)}")
    fresh = _restored(case, target, _fresh(case, want))
    _expect_same(case, "dtypes after restore", want, case.state(fresh))


def _arrays(tree: Any, where: str, out: List[tuple]) -> None:
    if isinstance(tree, np.ndarray):
        out.append((where, tree))
    elif isinstance(tree, dict):
        for k, v in tree.items():
            _arrays(v, f"{where}/{k}" if where else str(k), out)
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            _arrays(v, f"{where}/{i}" if where else str(i), out)


def check_snapshot_isolation(case: AdapterCase, directory: Path) -> None:
    obj = _mutated(case, case.make(0))
    want = case.state(obj)
    target = Path(directory) / "snapshot"
    handle = api.save(target, _nest(obj), blocking=False)
    try:
        later = _mutated(case, obj)  # after save returned: must not reach the checkpoint
        later = _mutated(case, later)
    finally:
        handle.wait()
    if difference(want, case.state(later)) is None:
        raise ConformanceError(f"{case.name}: mutate() left the state unchanged: the "
                               "isolation check would prove nothing")
    fresh = _restored(case, target, _fresh(case, want))
    _expect_same(case, "changes made after an asynchronous save returned reached the "
                       "checkpoint", want, case.state(fresh))


def check_independence(case: AdapterCase, directory: Path) -> None:
    obj, want, target = _saved(case, directory, "independence")
    fresh = _restored(case, target, _fresh(case, want))
    _mutated(case, fresh)
    _expect_same(case, "changing the restored object changed the saved one", want,
                 case.state(obj))
    other = _restored(case, target, _fresh(case, want))
    _expect_same(case, "changing a restored object changed what the checkpoint gives",
                 want, case.state(other))
    _mutated(case, obj)
    _expect_same(case, "changing the saved object changed a restored one", want,
                 case.state(other))


def check_strict_keys(case: AdapterCase, directory: Path) -> None:
    obj = _mutated(case, case.make(0))
    want = case.state(obj)
    target = Path(directory) / "keys"
    api.save(target, {**_nest(obj), "extra": 1})
    fresh = _fresh(case, want)
    before = case.state(fresh)
    for state, missing in (({**_nest(fresh), "absent": 0}, "absent"), (_nest(fresh), "extra")):
        try:
            api.load(target, state)
        except KeyMismatchError as e:
            if missing not in str(e):
                raise ConformanceError(f"{case.name}: the key error does not name "
                                       f"{missing!r}: {e}") from e
        else:
            raise ConformanceError(f"{case.name}: a load with key {missing!r} not matching "
                                   "the checkpoint was not refused (strict=True)")
        _expect_same(case, "a refused load changed the object", before, case.state(fresh))
    fresh = _restored(case, target, fresh, strict=False)
    _expect_same(case, "restored with strict=False", want, case.state(fresh))


def check_mismatch(case: AdapterCase, directory: Path) -> None:
    if case.make_mismatched is None:
        raise _Skip("no make_mismatched")
    _, want, target = _saved(case, directory, "mismatch")
    other = case.make_mismatched()
    before = case.state(other)
    try:
        api.load(target, _nest(other))
    except StateMismatchError as e:
        if PATH not in str(e) and getattr(e, "leaf", "") != PATH and \
                not str(getattr(e, "leaf", "") or "").startswith(PATH + "/"):
            raise ConformanceError(f"{case.name}: the error does not name the object's path "
                                   f"in the state ({PATH!r}): {e}") from e
    except UckptError as e:
        raise ConformanceError(f"{case.name}: a mismatched object raised "
                               f"{type(e).__name__}, not a StateMismatchError: {e}") from e
    else:
        raise ConformanceError(f"{case.name}: restoring into an object of another structure "
                               "was not refused")
    _expect_same(case, "a refused restore changed the object", before, case.state(other))


def check_restore_before_build(case: AdapterCase, directory: Path) -> None:
    if case.make_unbuilt is None:
        raise _Skip("no make_unbuilt")
    obj, want, target = _saved(case, directory, "unbuilt")
    fresh = _restored(case, target, case.make_unbuilt())
    _expect_same(case, "restored into an object before its state existed", want,
                 case.state(fresh))


class _Skip(Exception):
    """A check that the case gives nothing to run with."""


#: every check by name, in the order they run
CHECKS = {"round_trip": check_round_trip, "dtypes": check_dtypes,
          "snapshot_isolation": check_snapshot_isolation, "independence": check_independence,
          "strict_keys": check_strict_keys, "mismatch": check_mismatch,
          "restore_before_build": check_restore_before_build}


def run_check(name: str, case: AdapterCase, directory: Path) -> bool:
    """Run one check (with ``case.adapter`` registered); False when it does not apply."""
    if name == "strict_keys" and not case.strict_keys:
        return False
    Path(directory).mkdir(parents=True, exist_ok=True)
    with registered(case.adapter):
        try:
            CHECKS[name](case, Path(directory))
        except _Skip:
            return False
    return True


def check_adapter(case: AdapterCase, directory) -> List[str]:
    """Run every check on ``case`` under ``directory``; return the names of those that ran.
    Raises :class:`ConformanceError` at the first failure."""
    return [name for name in CHECKS if run_check(name, case, Path(directory) / name)]


class AdapterConformance:
    """Subclass it in a test module, named ``Test...``, with ``cases``: each check
    becomes a pytest test per case (a check the case gives nothing to run with is
    skipped)."""

    cases: List[AdapterCase] = []

    def pytest_generate_tests(self, metafunc) -> None:
        if "case" in metafunc.fixturenames:
            metafunc.parametrize("case", list(self.cases), ids=[c.name for c in self.cases])

    def _run(self, name: str, case: AdapterCase, tmp_path: Path) -> None:
        if not run_check(name, case, tmp_path):
            import pytest

            pytest.skip(f"{case.name}: nothing to run {name} with")


def _check_test(name: str):
    def test(self, case, tmp_path):
        self._run(name, case, tmp_path)

    test.__name__ = test.__qualname__ = f"test_{name}"
    test.__doc__ = f"The {name} check of the adapter conformance suite."
    return test


for _name in CHECKS:  # one pytest test per check, in CHECKS' order
    setattr(AdapterConformance, f"test_{_name}", _check_test(_name))
