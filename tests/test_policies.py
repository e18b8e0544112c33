"""Unit tests of the save and retention policies (uckpt.manager.policies)."""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

import numpy as np
import pytest

from uckpt.manager.policies import (AnyOf, CheckpointInfo, EveryNSeconds, EveryNSteps, KeepAll,
                            KeepBest, KeepEvery, KeepLast, KeepUnion, Never, OnSignal,
                            RetentionPolicy, SavePolicy, as_retention)

needs_posix_signals = pytest.mark.skipif(
    not hasattr(signal, "SIGUSR1") or sys.platform == "win32",
    reason="needs POSIX signals (SIGUSR1, SIGUSR2)")


def _wait_for(pred, timeout=5.0):
    """Signals sent to oneself are delivered at the next bytecode, but be patient anyway."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def _infos(*steps, metrics=None):
    metrics = metrics or {}
    return [CheckpointInfo(step=s, metrics=metrics.get(s, {})) for s in steps]


# === save policies ==========================================================================
class TestEveryNSteps:
    def test_multiples_of_n_excluding_step_zero(self):
        p = EveryNSteps(10)
        assert [s for s in range(0, 41) if p.should_save(s, 0.0)] == [10, 20, 30, 40]

    def test_offset_is_a_phase(self):
        p = EveryNSteps(10, offset=3)
        assert [s for s in range(0, 30) if p.should_save(s, 0.0)] == [3, 13, 23]
        # an offset beyond n is the same phase
        q = EveryNSteps(10, offset=13)
        assert [s for s in range(0, 30) if q.should_save(s, 0.0)] == [3, 13, 23]

    def test_n_one_saves_every_step_but_zero(self):
        p = EveryNSteps(1)
        assert not p.should_save(0, 0.0)
        assert all(p.should_save(s, 0.0) for s in range(1, 20))

    def test_stateless(self):
        p = EveryNSteps(5)
        p.saved(3, 1.0)  # a save for another reason does not shift the grid
        assert p.should_save(5, 2.0) and not p.should_save(6, 2.0)
        assert not p.pending_exit
        p.close()
        p.close()

    @pytest.mark.parametrize("n", [0, -1, 2.0, "5", True, None])
    def test_bad_n(self, n):
        with pytest.raises(ValueError, match="EveryNSteps: n must be a positive int"):
            EveryNSteps(n)

    @pytest.mark.parametrize("offset", [-1, 1.5, "1", False])
    def test_bad_offset(self, offset):
        with pytest.raises(ValueError, match="offset must be a non-negative int"):
            EveryNSteps(10, offset=offset)

    def test_numpy_int_accepted(self):
        p = EveryNSteps(np.int64(4))
        assert p.n == 4 and type(p.n) is int
        assert p.should_save(8, 0.0)

    def test_repr(self):
        assert repr(EveryNSteps(1000)) == "EveryNSteps(1000)"
        assert repr(EveryNSteps(1000, offset=500)) == "EveryNSteps(1000, offset=500)"


class TestEveryNSeconds:
    def test_clock_starts_at_first_call(self):
        p = EveryNSeconds(60)
        assert not p.should_save(1, 1000.0)       # clock starts here
        assert not p.should_save(2, 1059.9)
        assert p.should_save(3, 1060.0)            # exactly 60 s later: due
        assert p.should_save(4, 1070.0)            # stays due until saved()
        p.saved(4, 1070.0)
        assert not p.should_save(5, 1071.0)
        assert not p.should_save(6, 1129.0)
        assert p.should_save(7, 1130.0)

    def test_any_save_restarts_the_clock(self):
        p = EveryNSeconds(100)
        assert not p.should_save(1, 0.0)
        p.saved(1, 90.0)                           # e.g. a manual save or another policy
        assert not p.should_save(2, 100.0)
        assert not p.should_save(3, 189.0)
        assert p.should_save(4, 190.0)

    def test_saved_before_first_question_starts_the_clock(self):
        p = EveryNSeconds(10)
        p.saved(0, 50.0)
        assert not p.should_save(1, 55.0)
        assert p.should_save(2, 60.0)

    def test_clock_going_backwards_is_not_due(self):
        p = EveryNSeconds(10)
        p.should_save(1, 100.0)
        assert not p.should_save(2, 50.0)

    def test_fractional_seconds(self):
        p = EveryNSeconds(0.5)
        assert not p.should_save(1, 0.0)
        assert p.should_save(2, 0.5)

    def test_real_clock(self):
        p = EveryNSeconds(0.01)
        assert not p.should_save(1, time.monotonic())
        time.sleep(0.02)
        assert p.should_save(2, time.monotonic())

    @pytest.mark.parametrize("seconds", [0, -1, float("nan"), float("inf"), "60", None, True])
    def test_bad_seconds(self, seconds):
        with pytest.raises(ValueError, match="seconds must be a positive finite number"):
            EveryNSeconds(seconds)

    def test_repr(self):
        assert repr(EveryNSeconds(600)) == "EveryNSeconds(600)"
        assert repr(EveryNSeconds(1.5)) == "EveryNSeconds(1.5)"
        assert repr(EveryNSeconds(np.float32(2.0))) == "EveryNSeconds(2.0)"


class TestNever:
    def test_never(self):
        p = Never()
        assert not any(p.should_save(s, float(s)) for s in range(100))
        p.saved(5, 5.0)
        assert not p.pending_exit
        assert repr(p) == "Never()"


@needs_posix_signals
class TestOnSignal:
    def test_real_signal_sets_flag_and_close_restores_previous_handler(self):
        seen = []

        def previous(signum, frame):
            seen.append(signum)

        old = signal.signal(signal.SIGUSR1, previous)
        try:
            p = OnSignal(signals=(signal.SIGUSR1,), exit=True)
            assert p.installed
            assert signal.getsignal(signal.SIGUSR1) == p._handle
            assert p.received is None and not p.should_save(1, 0.0) and not p.pending_exit

            os.kill(os.getpid(), signal.SIGUSR1)
            assert _wait_for(lambda: p.received is not None)
            assert p.received == signal.SIGUSR1
            assert seen == []                     # replaced, not chained
            assert p.should_save(2, 0.0)
            assert p.should_save(3, 0.0)          # stays pending until a save
            assert p.pending_exit
            assert not p.final_saved

            p.saved(3, 0.0)
            assert p.final_saved
            assert p.received == signal.SIGUSR1   # saved() clears nothing
            assert p.pending_exit                 # the manager exits after the save
            assert not p.should_save(4, 0.0)      # but does not save again for it

            p.close()
            assert not p.installed
            assert signal.getsignal(signal.SIGUSR1) is previous
            os.kill(os.getpid(), signal.SIGUSR1)
            assert _wait_for(lambda: seen == [signal.SIGUSR1])
            p.close()                             # twice is harmless
            assert signal.getsignal(signal.SIGUSR1) is previous
        finally:
            signal.signal(signal.SIGUSR1, old)

    def test_default_signals_and_restore_of_defaults(self):
        before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
        with OnSignal() as p:
            assert p.signals == (signal.SIGTERM, signal.SIGUSR1)
            assert p.exit is True
            for s in p.signals:
                assert signal.getsignal(s) == p._handle
            os.kill(os.getpid(), signal.SIGTERM)  # would end the test run if not caught
            assert _wait_for(lambda: p.received == signal.SIGTERM)
            assert p.should_save(7, 0.0) and p.pending_exit
        for s, h in before.items():
            assert signal.getsignal(s) == h

    def test_exit_false_requests_one_save_per_signal(self):
        with OnSignal(signals=["SIGUSR2"], exit=False) as p:
            assert p.signals == (signal.SIGUSR2,)
            os.kill(os.getpid(), signal.SIGUSR2)
            assert _wait_for(lambda: p.should_save(1, 0.0))
            assert not p.pending_exit             # exit=False: never asks to end
            p.saved(1, 0.0)
            assert p.final_saved and not p.should_save(2, 0.0)
            os.kill(os.getpid(), signal.SIGUSR2)
            assert _wait_for(lambda: p.should_save(3, 0.0))
            p.saved(3, 0.0)
            assert not p.should_save(4, 0.0)

    def test_save_before_signal_is_not_the_final_one(self):
        with OnSignal(signals=(signal.SIGUSR1,)) as p:
            p.saved(1, 0.0)                       # a periodic save, no signal yet
            assert not p.final_saved
            os.kill(os.getpid(), signal.SIGUSR1)
            assert _wait_for(lambda: p.should_save(2, 0.0))
            assert not p.final_saved
            p.saved(2, 0.0)
            assert p.final_saved

    def test_names_and_dedup(self):
        with OnSignal(signals=("usr1", "SIGUSR1", signal.SIGUSR1, int(signal.SIGUSR2))) as p:
            assert p.signals == (signal.SIGUSR1, signal.SIGUSR2)
        with OnSignal(signals="SIGUSR1") as p:
            assert p.signals == (signal.SIGUSR1,)

    def test_repr(self):
        with OnSignal() as p:
            assert repr(p) == "OnSignal(('SIGTERM', 'SIGUSR1'), exit=True)"
        with OnSignal(signals=[signal.SIGUSR2], exit=False) as p:
            assert repr(p) == "OnSignal(('SIGUSR2',), exit=False)"
            with eval(repr(p), {"OnSignal": OnSignal}) as q:  # the repr evaluates
                assert q.signals == p.signals and q.exit is False

    @pytest.mark.parametrize("bad, exc, msg", [
        ("SIGNOPE", ValueError, "unknown signal name"),
        (10_000, ValueError, "not a valid signal number"),
        (1.5, TypeError, "must be a number or a name"),
        (None, TypeError, "must be a number or a name"),
        ("SIGKILL", ValueError, "cannot be caught"),
        (signal.SIGKILL, ValueError, "cannot be caught"),
    ])
    def test_bad_signals(self, bad, exc, msg):
        before = signal.getsignal(signal.SIGUSR1)
        with pytest.raises(exc, match=msg):
            OnSignal(signals=(signal.SIGUSR1, bad))
        assert signal.getsignal(signal.SIGUSR1) == before  # nothing left installed

    def test_empty_signals(self):
        with pytest.raises(ValueError, match="at least one signal"):
            OnSignal(signals=())

    def test_only_in_main_thread(self):
        before = signal.getsignal(signal.SIGUSR1)
        errors = []

        def body():
            try:
                OnSignal(signals=(signal.SIGUSR1,))
            except BaseException as e:  # noqa: BLE001 - reported to the main thread
                errors.append(e)

        t = threading.Thread(target=body, name="worker-1")
        t.start()
        t.join()
        assert len(errors) == 1 and isinstance(errors[0], RuntimeError)
        assert "main thread" in str(errors[0]) and "worker-1" in str(errors[0])
        assert signal.getsignal(signal.SIGUSR1) == before

    def test_close_in_other_thread_is_refused(self):
        p = OnSignal(signals=(signal.SIGUSR1,))
        try:
            errors = []
            t = threading.Thread(target=lambda: errors.append(_catch(p.close)))
            t.start()
            t.join()
            assert isinstance(errors[0], RuntimeError)
            assert p.installed
        finally:
            p.close()
        assert not p.installed

    def test_handler_from_outside_python_restored_as_default(self, monkeypatch):
        real_signal = signal.signal
        calls = []

        def fake_signal(num, handler):
            calls.append((num, handler))
            prev = real_signal(num, handler)
            return None if len(calls) == 1 else prev  # pretend a C-level handler was there

        monkeypatch.setattr(signal, "signal", fake_signal)
        before = signal.getsignal(signal.SIGUSR2)
        try:
            p = OnSignal(signals=(signal.SIGUSR2,))
            p.close()
            assert calls[-1] == (signal.SIGUSR2, signal.SIG_DFL)
        finally:
            real_signal(signal.SIGUSR2, before)


def _catch(fn):
    try:
        fn()
    except BaseException as e:  # noqa: BLE001
        return e
    return None


class _Recorder(SavePolicy):
    """A save policy that records what it is told."""

    def __init__(self, answer=False, exit_=False, fail_close=False, log=None):
        self.answer, self.exit_, self.fail_close = answer, exit_, fail_close
        self.asked, self.saves, self.closed = [], [], 0
        self.log = log if log is not None else []

    def should_save(self, step, now):
        self.asked.append((step, now))
        return self.answer

    def saved(self, step, now):
        self.saves.append((step, now))

    @property
    def pending_exit(self):
        return self.exit_

    def close(self):
        self.closed += 1
        self.log.append(self)
        if self.fail_close:
            raise OSError(f"close failed {id(self)}")


class TestAnyOf:
    def test_any_and_every_member_is_asked(self):
        a, b, c = _Recorder(False), _Recorder(True), _Recorder(False)
        p = AnyOf(a, b, c)
        assert p.should_save(5, 1.0)
        assert a.asked == b.asked == c.asked == [(5, 1.0)]  # no short cut
        b.answer = False
        assert not p.should_save(6, 2.0)

    def test_saved_and_close_forwarded(self):
        log = []
        a, b = _Recorder(log=log), _Recorder(log=log)
        p = a | b
        p.saved(3, 4.0)
        assert a.saves == b.saves == [(3, 4.0)]
        p.close()
        assert a.closed == b.closed == 1
        assert log == [b, a]  # reverse order

    def test_close_reaches_all_even_if_one_fails(self):
        a, b, c = _Recorder(fail_close=True), _Recorder(), _Recorder(fail_close=True)
        p = AnyOf(a, b, c)
        with pytest.raises(OSError, match=f"close failed {id(c)}"):  # the first failure
            p.close()
        assert a.closed == b.closed == c.closed == 1

    def test_pending_exit_aggregates(self):
        a, b = _Recorder(), _Recorder()
        p = AnyOf(a, b)
        assert not p.pending_exit
        b.exit_ = True
        assert p.pending_exit

    def test_or_builds_flat_anyof(self):
        a, b, c, d = EveryNSteps(10), EveryNSeconds(60), Never(), EveryNSteps(7)
        p = a | b | c
        assert isinstance(p, AnyOf) and p.policies == (a, b, c)
        q = (a | b) | (c | d)
        assert q.policies == (a, b, c, d)
        assert AnyOf(AnyOf(a, b), c).policies == (a, b, c)

    def test_or_with_non_policy(self):
        with pytest.raises(TypeError):
            EveryNSteps(10) | 5
        with pytest.raises(TypeError):
            EveryNSteps(10) | KeepLast(3)

    def test_combined_behaviour(self):
        p = EveryNSteps(100) | EveryNSeconds(30)
        now = 0.0
        saves = []
        for step in range(1, 301):
            now += 0.5                            # 0.5 s per step: 30 s = 60 steps
            if p.should_save(step, now):
                saves.append(step)
                p.saved(step, now)
        # the timer fires 60 steps after the last save; step multiples of 100 also save
        assert saves == [61, 100, 160, 200, 260, 300]

    def test_bad_arguments(self):
        with pytest.raises(ValueError, match="at least one policy"):
            AnyOf()
        with pytest.raises(TypeError, match="expected SavePolicy objects, got int"):
            AnyOf(EveryNSteps(3), 3)

    def test_repr(self):
        p = EveryNSteps(1000) | EveryNSeconds(600) | Never()
        assert repr(p) == "EveryNSteps(1000) | EveryNSeconds(600) | Never()"
        q = eval(repr(p), {"EveryNSteps": EveryNSteps, "EveryNSeconds": EveryNSeconds,
                           "Never": Never})
        assert isinstance(q, AnyOf) and repr(q) == repr(p)

    @needs_posix_signals
    def test_with_real_signal(self):
        with EveryNSteps(1000) | OnSignal(signals=(signal.SIGUSR1,)) as p:
            assert not p.should_save(1, 0.0) and not p.pending_exit
            os.kill(os.getpid(), signal.SIGUSR1)
            assert _wait_for(lambda: p.pending_exit)
            assert p.should_save(2, 0.0)
            p.saved(2, 0.0)
            assert p.policies[1].final_saved
            handler = p.policies[1]._handle
            assert signal.getsignal(signal.SIGUSR1) == handler
        assert signal.getsignal(signal.SIGUSR1) != handler


def test_save_policy_is_abstract():
    with pytest.raises(TypeError):
        SavePolicy()


# === retention policies =====================================================================
class TestCheckpointInfo:
    def test_defaults_and_frozen(self):
        i = CheckpointInfo(5)
        assert i.step == 5 and dict(i.metrics) == {} and i.created == 0.0
        with pytest.raises(AttributeError):
            i.step = 6
        assert CheckpointInfo(5, {"loss": 1.0}, 3.0) == CheckpointInfo(5, {"loss": 1.0}, 3.0)
        hash(CheckpointInfo(5, {"loss": 1.0}))  # hashable although metrics is a dict

    @pytest.mark.parametrize("step", [-1, 1.0, "3", None, True])
    def test_bad_step(self, step):
        with pytest.raises(ValueError, match="step must be a non-negative int"):
            CheckpointInfo(step)

    def test_bad_metrics(self):
        with pytest.raises(TypeError, match="metrics must be a mapping"):
            CheckpointInfo(1, metrics=[("loss", 1.0)])


class TestKeepLast:
    def test_newest_by_step_in_any_order(self):
        assert KeepLast(2).keep(_infos(30, 10, 40, 20)) == {30, 40}
        assert KeepLast(10).keep(_infos(3, 1, 2)) == {1, 2, 3}
        assert KeepLast(1).keep([]) == set()

    @pytest.mark.parametrize("n", [0, -3, 1.0, "2", None, False])
    def test_bad_n(self, n):
        with pytest.raises(ValueError, match="KeepLast: n must be a positive int"):
            KeepLast(n)


class TestKeepEvery:
    def test_multiples(self):
        assert KeepEvery(100).keep(_infos(0, 50, 100, 150, 200, 250)) == {0, 100, 200}
        assert KeepEvery(1).keep(_infos(1, 2, 3)) == {1, 2, 3}

    @pytest.mark.parametrize("n", [0, -1, 2.5])
    def test_bad_n(self, n):
        with pytest.raises(ValueError, match="KeepEvery: n must be a positive int"):
            KeepEvery(n)


class TestKeepAll:
    def test_all(self):
        assert KeepAll().keep(_infos(1, 5, 3)) == {1, 3, 5}
        assert KeepAll().keep([]) == set()


class TestKeepBest:
    METRICS = {1: {"loss": 0.9, "acc": 0.1}, 2: {"loss": 0.5, "acc": 0.6},
               3: {"loss": 0.7, "acc": 0.4}, 4: {"loss": 0.3, "acc": 0.5},
               5: {"loss": 0.6, "acc": 0.9}}

    def test_min(self):
        infos = _infos(1, 2, 3, 4, 5, metrics=self.METRICS)
        assert KeepBest(2, "loss").keep(infos) == {4, 2}
        assert KeepBest(1, "loss", mode="min").keep(infos) == {4}

    def test_max(self):
        infos = _infos(1, 2, 3, 4, 5, metrics=self.METRICS)
        assert KeepBest(2, "acc", mode="max").keep(infos) == {5, 2}

    def test_missing_metric_never_kept(self):
        infos = _infos(1, 2, 3, 4, metrics={1: {"loss": 0.5}, 2: {}, 3: {"acc": 1.0},
                                             4: {"loss": None}})
        assert KeepBest(3, "loss").keep(infos) == {1}
        assert KeepBest(3, "nothing").keep(infos) == set()

    def test_nan_is_worst(self):
        nan = float("nan")
        metrics = {1: {"loss": nan}, 2: {"loss": 5.0}, 3: {"loss": float("inf")},
                   4: {"loss": 1.0}}
        infos = _infos(1, 2, 3, 4, metrics=metrics)
        assert KeepBest(1, "loss").keep(infos) == {4}
        assert KeepBest(3, "loss").keep(infos) == {2, 3, 4}
        assert KeepBest(4, "loss").keep(infos) == {1, 2, 3, 4}  # kept if nothing better
        metrics_max = {1: {"acc": nan}, 2: {"acc": -float("inf")}, 3: {"acc": 0.5}}
        infos_max = _infos(1, 2, 3, metrics=metrics_max)
        assert KeepBest(2, "acc", mode="max").keep(infos_max) == {2, 3}
        assert KeepBest(2, "loss").keep(_infos(1, 2, 3, metrics={
            s: {"loss": nan} for s in (1, 2, 3)})) == {2, 3}     # NaN ties: newer

    def test_ties_go_to_newer_step(self):
        metrics = {s: {"loss": 1.0} for s in (10, 30, 20)}
        assert KeepBest(2, "loss").keep(_infos(10, 30, 20, metrics=metrics)) == {20, 30}
        assert KeepBest(1, "loss", "max").keep(_infos(10, 30, 20, metrics=metrics)) == {30}

    def test_numeric_types(self):
        metrics = {1: {"m": np.float32(0.25)}, 2: {"m": 3}, 3: {"m": np.int64(-1)},
                   4: {"m": np.float64("nan")}}
        infos = _infos(1, 2, 3, 4, metrics=metrics)
        assert KeepBest(2, "m").keep(infos) == {1, 3}
        assert KeepBest(1, "m", mode="max").keep(infos) == {2}

    @pytest.mark.parametrize("value", ["0.5", True, [0.5], {"v": 1}])
    def test_non_number_metric_is_an_error(self, value):
        infos = _infos(1, 7, metrics={1: {"loss": 0.5}, 7: {"loss": value}})
        with pytest.raises(TypeError, match=r"step 7 has metric 'loss'.*needs a real number"):
            KeepBest(1, "loss").keep(infos)

    def test_pure(self):
        infos = _infos(1, 2, 3, 4, 5, metrics=self.METRICS)
        p = KeepBest(2, "loss")
        assert p.keep(infos) == p.keep(list(reversed(infos))) == p.keep(tuple(infos))
        assert [i.step for i in infos] == [1, 2, 3, 4, 5]  # input untouched

    @pytest.mark.parametrize("args, kwargs, msg", [
        ((0, "loss"), {}, "n must be a positive int"),
        ((1.5, "loss"), {}, "n must be a positive int"),
        ((1, ""), {}, "metric must be a non-empty str"),
        ((1, None), {}, "metric must be a non-empty str"),
        ((1, 3), {}, "metric must be a non-empty str"),
        ((1, "loss"), {"mode": "minimum"}, "mode must be 'min'"),
        ((1, "loss"), {"mode": None}, "mode must be 'min'"),
    ])
    def test_bad_arguments(self, args, kwargs, msg):
        with pytest.raises(ValueError, match=msg):
            KeepBest(*args, **kwargs)

    def test_repr(self):
        assert repr(KeepBest(3, "val_loss")) == "KeepBest(3, 'val_loss', mode='min')"
        assert repr(KeepBest(1, "acc", mode="max")) == "KeepBest(1, 'acc', mode='max')"


class TestKeepUnion:
    def test_union(self):
        infos = _infos(0, 100, 150, 200, 250, 300, 350,
                       metrics={150: {"loss": 0.1}, 300: {"loss": 0.5}})
        p = KeepLast(2) | KeepEvery(200) | KeepBest(1, "loss")
        assert isinstance(p, KeepUnion)
        assert p.keep(infos) == {300, 350, 0, 200, 150}

    def test_flattening_and_explicit_constructor(self):
        a, b, c = KeepLast(1), KeepEvery(10), KeepAll()
        assert (a | b | c).policies == (a, b, c)
        assert ((a | b) | (c | a)).policies == (a, b, c, a)
        assert KeepUnion(KeepUnion(a, b), c).policies == (a, b, c)
        assert KeepUnion(a).keep(_infos(1, 2)) == {2}

    def test_bad_arguments(self):
        with pytest.raises(ValueError, match="at least one policy"):
            KeepUnion()
        with pytest.raises(TypeError, match="expected RetentionPolicy objects, got int"):
            KeepUnion(KeepLast(2), 3)
        with pytest.raises(TypeError):
            KeepLast(2) | 3
        with pytest.raises(TypeError):
            KeepLast(2) | EveryNSteps(3)

    def test_repr(self):
        assert repr(KeepLast(5) | KeepEvery(1000)) == "KeepLast(5) | KeepEvery(1000)"
        p = KeepLast(5) | KeepEvery(1000) | KeepBest(2, "loss", mode="max") | KeepAll()
        ns = {"KeepLast": KeepLast, "KeepEvery": KeepEvery, "KeepBest": KeepBest,
              "KeepAll": KeepAll}
        assert eval(repr(p), ns) == p


class TestRetentionEquality:
    def test_equal_by_parameters(self):
        assert KeepLast(3) == KeepLast(3) and KeepLast(3) != KeepLast(4)
        assert KeepLast(3) != KeepEvery(3)
        assert KeepAll() == KeepAll()
        assert KeepBest(1, "a") == KeepBest(1, "a") != KeepBest(1, "a", "max")
        assert (KeepLast(1) | KeepAll()) == (KeepLast(1) | KeepAll())
        assert len({KeepLast(3), KeepLast(3), KeepEvery(3)}) == 2

    def test_custom_policy_defaults_to_identity(self):
        class KeepOdd(RetentionPolicy):
            def keep(self, infos):
                return {i.step for i in infos if i.step % 2}

        a, b = KeepOdd(), KeepOdd()
        assert a == a and a != b
        assert (a | KeepLast(1)).keep(_infos(1, 2, 3, 4)) == {1, 3, 4}

    def test_retention_policy_is_abstract(self):
        with pytest.raises(TypeError):
            RetentionPolicy()


class TestAsRetention:
    def test_conversions(self):
        assert as_retention(None) == KeepAll()
        assert as_retention(5) == KeepLast(5)
        assert as_retention(np.int32(2)) == KeepLast(2)
        p = KeepBest(1, "loss")
        assert as_retention(p) is p
        assert as_retention([KeepLast(3), KeepEvery(1000)]) == KeepLast(3) | KeepEvery(1000)
        assert as_retention((3, KeepEvery(1000))) == KeepLast(3) | KeepEvery(1000)

    @pytest.mark.parametrize("obj, name", [
        ("5", "str"), (5.0, "float"), (True, "bool"), ({"keep": 3}, "dict"),
        ({KeepLast(1)}, "set"), (EveryNSteps(3), "EveryNSteps"),
    ])
    def test_type_errors_name_the_type(self, obj, name):
        with pytest.raises(TypeError, match=rf"got {name}\b"):
            as_retention(obj)

    def test_value_errors(self):
        with pytest.raises(ValueError, match="KeepLast: n must be a positive int"):
            as_retention(0)
        with pytest.raises(ValueError, match="empty list"):
            as_retention([])
        with pytest.raises(TypeError, match="got str"):
            as_retention([KeepLast(1), "x"])


def test_module_imports_no_framework():
    import subprocess
    code = ("import sys, uckpt.manager.policies; "
            "bad = [m for m in ('torch', 'tensorflow', 'chainer', 'jax') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)

