"""The cyclic garbage collector is paused while a save or load runs on the caller's thread
(uckpt.runtime.gcpause), and left as it was found afterwards: enabled, or disabled by the user."""
import gc
import threading

import numpy as np
import pytest

import uckpt
from uckpt import errors, knobs
from uckpt.runtime import gcpause
from uckpt.registry import unregister_adapter


class Probe:
    """An object whose adapter notes whether the collector runs during each of its calls."""

    def __init__(self):
        self.v = np.arange(4.0)
        self.enabled = {}


class ProbeAdapter(uckpt.Adapter):
    name = "test.gc_probe"

    def handles(self, obj):
        return isinstance(obj, Probe)

    def extract(self, obj):
        obj.enabled["extract"] = gc.isenabled()
        return {"v": obj.v}

    def prepare(self, obj, spec):
        obj.enabled["prepare"] = gc.isenabled()
        return {"v": obj.v}

    def restore(self, obj, tree):
        obj.enabled["restore"] = gc.isenabled()


@pytest.fixture
def probe_adapter():
    adapter = ProbeAdapter()
    uckpt.register_adapter(adapter)
    try:
        yield adapter
    finally:
        unregister_adapter(adapter)


@pytest.fixture
def collector():
    """The collector enabled with its default thresholds, restored as found afterwards."""
    was, thresholds = gc.isenabled(), gc.get_threshold()
    gc.enable()
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        (gc.enable if was else gc.disable)()


def many_leaves(n=300):
    return {f"a{i:03d}": {"x": np.full(3, i, np.int32), "n": i} for i in range(n)}


def collections_during(fn):
    """The automatic collections that start while ``fn`` runs."""
    seen = []

    def note(phase, info):
        if phase == "start":
            seen.append(info["generation"])

    gc.callbacks.append(note)
    try:
        fn()
    finally:
        gc.callbacks.remove(note)
    return seen


def test_save_and_load_run_with_the_collector_paused(tmp_path, probe_adapter, collector):
    p = Probe()
    uckpt.save(tmp_path / "ck", {"p": p})
    assert p.enabled == {"extract": False} and gc.isenabled()
    q = Probe()
    q.v[:] = 0
    uckpt.load(tmp_path / "ck", {"p": q})
    assert q.enabled == {"prepare": False, "restore": False} and gc.isenabled()
    np.testing.assert_array_equal(q.v, np.arange(4.0))


def test_async_save_pauses_only_the_callers_snapshot(tmp_path, probe_adapter, collector):
    p = Probe()
    with uckpt.CheckpointManager(tmp_path / "root", async_save=True) as manager:
        handle = manager.save(1, {"p": p})
        assert gc.isenabled()  # back on as soon as save returns, the write still running
        handle.wait()
    assert p.enabled == {"extract": False} and gc.isenabled()


def test_the_knob_leaves_the_collector_alone(tmp_path, probe_adapter, collector, monkeypatch):
    monkeypatch.setattr(knobs, "pause_gc", 0)
    p = Probe()
    uckpt.save(tmp_path / "ck", {"p": p})
    uckpt.load(tmp_path / "ck", {"p": p})
    assert p.enabled == {"extract": True, "prepare": True, "restore": True}


def test_a_load_sets_off_no_collection_that_it_would_without_the_pause(tmp_path, collector,
                                                                          monkeypatch):
    """With a low threshold the thousands of containers of a load's manifest and plan set
    off collections; paused, none runs inside the load but the one its survivors may owe
    as the collector comes back on."""
    state = many_leaves()
    uckpt.save(tmp_path / "ck", state)
    gc.set_threshold(50, 2, 2)
    monkeypatch.setattr(knobs, "pause_gc", 0)
    unpaused = collections_during(lambda: uckpt.load(tmp_path / "ck", state))
    monkeypatch.setattr(knobs, "pause_gc", 1)
    paused = collections_during(lambda: uckpt.load(tmp_path / "ck", state))
    assert len(unpaused) > 10
    assert len(paused) <= 1


def test_a_collector_disabled_by_the_user_stays_disabled(tmp_path, probe_adapter, collector):
    gc.disable()
    p = Probe()
    uckpt.save(tmp_path / "ck", {"p": p})
    uckpt.load(tmp_path / "ck", {"p": p})
    assert not gc.isenabled()


def test_a_failed_load_or_save_turns_the_collector_back_on(tmp_path, collector):
    with pytest.raises(errors.CheckpointNotFoundError):
        uckpt.load(tmp_path / "missing", {"a": np.zeros(2)})
    assert gc.isenabled()
    uckpt.save(tmp_path / "ck", {"a": np.zeros(2)})
    with pytest.raises(errors.CheckpointExistsError):
        uckpt.save(tmp_path / "ck", {"a": np.zeros(2)})
    assert gc.isenabled()
    with pytest.raises(errors.ShapeMismatchError):
        uckpt.load(tmp_path / "ck", {"a": np.zeros(3)})
    assert gc.isenabled()


def test_pauses_nest_across_threads(collector):
    """The collector comes back on only when the last of overlapping calls ends, whichever
    thread ran it."""
    entered, release = threading.Event(), threading.Event()

    def other():
        with gcpause.paused():
            entered.set()
            release.wait(10)

    with gcpause.paused():
        with gcpause.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
        t = threading.Thread(target=other)
        t.start()
        assert entered.wait(10)
    assert not gc.isenabled()  # the other thread's call still runs
    release.set()
    t.join(10)
    assert gc.isenabled()
