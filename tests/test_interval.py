"""The interval advisor: Young/Daly formulas, a simulated failure trace, EveryOptimal, the
costs a CheckpointManager records and ``uckpt advise``."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

import uckpt
from uckpt.manager.costs import COSTS_NAME, read_costs
from uckpt.errors import DurationError, ManifestError
from uckpt.manager.interval import (EveryOptimal, advise, daly_interval, expected_overhead,
                            parse_duration, young_interval)


# --- durations ------------------------------------------------------------------------------
@pytest.mark.parametrize("text, seconds", [("90s", 90), ("30m", 1800), ("6h", 21600),
                                           ("2d", 172800), ("1.5h", 5400), (" 6 H ", 21600),
                                           ("3600", 3600), (42, 42), (0.5, 0.5)])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "6x", "h", "-1h", "0s", "6hours", "1e3s", "nan", None,
                                 True, float("inf"), [6]])
def test_parse_duration_rejects(bad):
    with pytest.raises(DurationError, match="duration|positive") as info:
        parse_duration(bad, "mtbf")
    assert isinstance(info.value, ValueError)
    assert "mtbf" in str(info.value)


# --- formulas -------------------------------------------------------------------------------
def test_young_and_daly_values():
    assert young_interval(2.0, 3600.0) == pytest.approx(120.0)
    x = 2.0 / 7200.0
    assert daly_interval(2.0, 3600.0) == pytest.approx(120.0 * (1 + math.sqrt(x) / 3 + x / 9) - 2.0)
    assert daly_interval(100.0, 40.0) == 40.0  # C >= 2M: checkpoint once per MTBF
    with pytest.raises(ValueError, match="MTBF"):
        young_interval(1.0, 0.0)
    with pytest.raises(ValueError, match="cost"):
        daly_interval(-1.0, 10.0)


@pytest.mark.parametrize("cost, mtbf", [(1.0, 3600.0), (30.0, 3600.0), (60.0, 21600.0),
                                        (300.0, 3600.0)])
def test_daly_minimises_the_exact_expected_overhead(cost, mtbf):
    """Daly's formula is close to the true minimum of the exponential-failure model, and
    at least as close as Young's."""
    grid = np.geomspace(young_interval(cost, mtbf) / 4, young_interval(cost, mtbf) * 4, 4001)
    overhead = [expected_overhead(t, cost, mtbf) for t in grid]
    best = grid[int(np.argmin(overhead))]
    daly, young = daly_interval(cost, mtbf), young_interval(cost, mtbf)
    assert abs(daly - best) / best < 0.02
    assert abs(daly - best) <= abs(young - best) + best * 1e-3
    # the overhead at the advice is within 0.1% (relative) of the minimum
    assert expected_overhead(daly, cost, mtbf) <= min(overhead) * 1.001


def _simulate(interval, cost, mtbf, work, gaps, restart=0.0):
    """Wall time / work - 1 for a job run against a failure trace (gaps between failures,
    exponential): after a failure, the work since the last completed save is redone."""
    gaps = iter(gaps)
    t, done, next_failure = 0.0, 0.0, next(gaps)
    while done < work:
        segment = min(interval, work - done) + cost
        if t + segment <= next_failure:
            t += segment
            done += segment - cost
        else:
            t = next_failure + restart
            next_failure = t + next(gaps)
    return t / work - 1.0


def test_simulated_failure_trace_is_cheapest_near_the_advice():
    """Against one seeded trace of exponential failures, expected lost work plus saving
    overhead is lowest at the advised interval among halved, doubled and sqrt(2)-scaled
    intervals, and it matches the model's expectation."""
    cost, mtbf, work = 10.0, 3600.0, 3000 * 3600.0
    gaps = np.random.default_rng(20260115).exponential(mtbf, size=20_000)
    advised = advise(cost, mtbf).interval
    scales = [0.5, 2 ** -0.5, 1.0, 2 ** 0.5, 2.0]
    sim = {s: _simulate(advised * s, cost, mtbf, work, gaps) for s in scales}
    assert min(sim, key=sim.get) == 1.0, sim
    for s in scales:  # the simulation agrees with the closed form (a few % of the overhead)
        model = expected_overhead(advised * s, cost, mtbf)
        assert abs(sim[s] - model) < 0.1 * model, (s, sim[s], model)


def test_advice_is_never_shorter_than_time_to_durable():
    a = advise(0.01, 3600.0, durable=30.0)
    assert a.daly < 30.0 and a.interval == 30.0
    assert a.overhead == pytest.approx(expected_overhead(30.0, 0.01, 3600.0))


# --- the policy -----------------------------------------------------------------------------
def test_every_optimal_policy_follows_measured_costs():
    p = EveryOptimal(mtbf="2h", first="30s")
    assert p.interval == 30.0 and p.advice is None
    assert not p.should_save(1, now=100.0)  # the clock starts
    assert not p.should_save(2, now=129.0)
    assert p.should_save(3, now=130.0)
    p.saved(3, now=130.0)
    p.measured(stall=2.0, durable=5.0)
    expected = daly_interval(2.0, 7200.0)
    assert p.interval == pytest.approx(expected)
    assert not p.should_save(4, now=130.0 + expected - 0.01)
    assert p.should_save(5, now=130.0 + expected + 0.01)
    with pytest.raises(DurationError, match="EveryOptimal: mtbf"):
        EveryOptimal(mtbf="six hours")
    # combined policies pass the costs on
    combo = uckpt.EveryNSteps(1000) | EveryOptimal(mtbf=3600)
    combo.measured(1.0, None)
    assert combo.policies[1].interval == pytest.approx(daly_interval(1.0, 3600.0))


# --- the manager's measurements and `uckpt advise` -----------------------------------------------
def _state():
    return {"w": np.arange(200_000, dtype=np.float32), "step": 0}


@pytest.mark.parametrize("async_save", [False, True])
def test_manager_records_costs_and_feeds_the_policy(tmp_path, async_save):
    policy = EveryOptimal(mtbf="6h")
    with uckpt.CheckpointManager(tmp_path, save_policy=policy, async_save=async_save) as m:
        assert m.save_costs() is None
        for step in (1, 2, 3):
            m.save(step, _state())
        m.wait()
        summary = m.save_costs()
    records = read_costs(tmp_path)
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        assert 0 < r["stall_s"] and 0 < r["commit_s"] and r["durable_s"] == r["commit_s"]
        assert r["async"] is async_save
        if not async_save:
            assert r["stall_s"] >= r["commit_s"]  # a synchronous save blocks until committed
    assert summary.saves == 3 and summary.stall > 0
    assert policy.advice is not None and policy.advice.cost > 0
    # a new manager on the same root keeps the records and tells its policy at once
    again = EveryOptimal(mtbf="6h")
    with uckpt.CheckpointManager(tmp_path, save_policy=again, role="reader"):
        assert again.advice is not None
    assert uckpt.manager.checkpoint_manager.CheckpointManager(tmp_path).steps() == [1, 2, 3]  # not a checkpoint


def test_costs_with_a_durable_tier(tmp_path):
    fast, slow = tmp_path / "fast", tmp_path / "slow"
    with uckpt.CheckpointManager(tiers=[fast, slow], async_save=True, durable_every=2) as m:
        for step in (1, 2, 3, 4):
            m.save(step, _state())
        m.wait()
    records = {r["step"]: r for r in read_costs(fast)}
    assert set(records) == {1, 2, 3, 4}
    assert "durable_s" not in records[1] and "durable_s" not in records[3]  # not copied
    for step in (2, 4):
        assert records[step]["durable_s"] >= records[step]["commit_s"]
    assert not (slow / COSTS_NAME).exists()


def _cli(*args):
    env = dict(os.environ)
    return subprocess.run([sys.executable, "-m", "uckpt.cli.main", *map(str, args)],
                          capture_output=True, text=True, env=env, timeout=120)


def test_advise_cli(tmp_path):
    with uckpt.CheckpointManager(tmp_path) as m:
        for step in (1, 2):
            m.save(step, _state())
    r = _cli("advise", tmp_path, "--mtbf", "6h")
    assert r.returncode == 0, r.stderr
    assert "stall" in r.stdout and "time to durable" in r.stdout and "advice: save every" in r.stdout
    r = _cli("advise", tmp_path, "--mtbf", "6h", "--restart", "5m", "--json")
    doc = json.loads(r.stdout)
    assert doc["saves_measured"] == 2 and doc["mtbf_s"] == 21600 and doc["restart_s"] == 300
    assert doc["interval_s"] == pytest.approx(
        max(daly_interval(doc["stall_s"], 21600), doc["durable_s"]))


def test_advise_cli_without_measurements(tmp_path):
    uckpt.save(tmp_path / "step_00000001", _state())  # written without a manager
    r = _cli("advise", tmp_path, "--mtbf", "6h")
    assert r.returncode == 1
    assert "no save costs recorded" in r.stderr and "--cost" in r.stderr
    r = _cli("advise", tmp_path, "--mtbf", "6h", "--cost", "2s")
    assert r.returncode == 0, r.stderr
    assert f"{daly_interval(2.0, 21600):.3f} s" in r.stdout
    r = _cli("advise", tmp_path, "--mtbf", "soon")
    assert r.returncode == 2 and "cannot read 'soon' as a duration" in r.stderr
    r = _cli("advise", tmp_path / "missing", "--mtbf", "6h")
    assert r.returncode == 1 and "no such directory" in r.stderr


def test_costs_file_that_is_a_fifo_or_a_symlink(tmp_path):
    """A hostile root never makes the reader hang or follow a link out of it."""
    os.mkfifo(tmp_path / COSTS_NAME)
    with pytest.raises(ManifestError, match="save-costs file"):
        read_costs(tmp_path)
    os.unlink(tmp_path / COSTS_NAME)
    (tmp_path / "elsewhere.json").write_text('{"kind": "uckpt-save-costs", "version": 1, '
                                            '"saves": [{"step": 1, "stall_s": 1.0}]}')
    os.symlink(tmp_path / "elsewhere.json", tmp_path / COSTS_NAME)
    with pytest.raises(ManifestError, match="save-costs file"):
        read_costs(tmp_path)


def test_damaged_costs_file(tmp_path):
    (tmp_path / COSTS_NAME).write_text('{"kind": "something else"}')
    with pytest.raises(ManifestError, match="save-costs file"):
        read_costs(tmp_path)
    r = _cli("advise", tmp_path, "--mtbf", "6h")
    assert r.returncode == 1 and COSTS_NAME in r.stderr
    # the writer starts afresh rather than failing its saves
    with uckpt.CheckpointManager(tmp_path) as m:
        m.save(1, _state())
    assert [r["step"] for r in read_costs(tmp_path)] == [1]


def test_a_writer_removes_a_dead_replacement_of_the_costs_file(tmp_path):
    """A writer SIGKILLed while replacing the costs file leaves its temporary file (unlocked
    once the writer is dead); the next writer removes it when it takes the root, even if it
    never saves (test_crash's random kills found one left behind)."""
    uckpt.CheckpointManager(tmp_path, role="writer").close()
    dead = tmp_path / f"{COSTS_NAME}.uckpt-tmp-0123abcd"
    dead.write_text("{")
    with uckpt.CheckpointManager(tmp_path, role="writer"):
        pass
    assert not dead.exists()
