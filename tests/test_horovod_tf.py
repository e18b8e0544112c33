"""Horovod for TensorFlow (tf_keras, Keras 2) under mpiexec -n 4: ``model.fit`` with
``hvd.DistributedOptimizer``, Horovod's callbacks and ``uckpt.keras.Checkpoint``, and a
custom ``hvd.DistributedGradientTape`` loop. Every rank writes its part; one rank is
SIGKILLed mid-epoch; the restarted job resumes bit for bit on every rank; the final
checkpoints load on 2 ranks and in one process. See tests/horovod_tf_train.py.

Launches (4 TensorFlow processes each, slow on a busy machine): ``first`` (both
trainings uninterrupted, then fit killed), ``second`` (fit resumed, tape killed),
``third`` (tape resumed), then ``load`` on 2 ranks and ``load-plain`` in one process.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from multiproc import HAVE_MPI, PYTHON, _env, run_mpi

import uckpt


def _horovod_tf_built() -> bool:
    spec = importlib.util.find_spec("horovod")
    if spec is None or not spec.submodule_search_locations:
        return False
    tf_dir = Path(next(iter(spec.submodule_search_locations))) / "tensorflow"
    return any(tf_dir.glob("mpi_lib*.so")) and importlib.util.find_spec("tf_keras") is not None


pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(3600),  # the module's launches run inside its first test
    # one worker runs the whole module: its module-scoped launches (4 TensorFlow ranks)
    # were otherwise made once per pytest-xdist worker
    pytest.mark.xdist_group("horovod_tf"),
    pytest.mark.skipif(not HAVE_MPI, reason="needs mpi4py and mpiexec"),
    pytest.mark.skipif(not _horovod_tf_built(),
                       reason="horovod.tensorflow is not built (or tf_keras is missing): "
                              "bash scripts/install_horovod.sh"),
]

WORKER = Path(__file__).with_name("horovod_tf_train.py")
ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "UCKPT_COMM_TIMEOUT": "120"}
TIMEOUT = 900  # 4 TensorFlow processes on a couple of busy cores
STEPS, KILL_AT = 12, 7
RESUMED = {"fit": 4, "tape": 6}  # fit: the newest end-of-epoch checkpoint; tape: the newest


def output(run):
    return f"--- stdout\n{run.stdout[-4000:]}\n--- stderr\n{run.stderr[-4000:]}"


def killed(run, d, name):
    assert run.returncodes != [0], f"the {name} run should have been killed\n" + output(run)
    report = d / f"{name}-killed.json"
    assert report.exists(), f"no rank reached step {KILL_AT} of the {name} run\n" + output(run)
    return json.loads(report.read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("horovod_tf")
    first = run_mpi(4, WORKER, "first", d, timeout=TIMEOUT, env=ENV)
    assert sorted(first.results) == [0, 1, 2, 3], output(first)
    fit_killed = killed(first, d, "fit")
    second = run_mpi(4, WORKER, "second", d, timeout=TIMEOUT, env=ENV)
    assert sorted(second.results) == [0, 1, 2, 3], output(second)
    tape_killed = killed(second, d, "tape")
    third = run_mpi(4, WORKER, "third", d, timeout=TIMEOUT, env=ENV).check()
    assert sorted(third.results) == [0, 1, 2, 3], output(third)
    resumed = {r: {"fit": second.results[r]["fit"], "tape": third.results[r]["tape"]}
               for r in range(4)}
    return d, first.results, resumed, {"fit": fit_killed, "tape": tape_killed}


@pytest.mark.parametrize("name", ["fit", "tape"])
def test_every_rank_writes_its_own_file(runs, name):
    d, full, _, _ = runs
    # the replicated training is bitwise the same on every rank (averaged gradients)
    assert len({full[r][name]["digest"] for r in range(4)}) == 1
    steps = full[0][name]["steps"]
    assert steps == ([3, 4, 6, 8, 9, 12] if name == "fit" else [3, 6, 9, 12])
    for step in steps:
        path = d / f"{name}-full" / f"step_{step:08d}"
        m = uckpt.manifest(path)
        assert m.world_size == 4 and m.step == step
        assert sorted(f.rank for f in m.files.values()) == [0, 1, 2, 3]
        for f in m.files.values():  # every rank wrote a part, not rank 0 alone
            assert f.size > 0 and os.path.getsize(path / f.name) == f.size
    tree = uckpt.load(d / f"{name}-full" / f"step_{STEPS:08d}")
    opt = tree["optimizer"]
    # hvd.DistributedOptimizer is recorded as the optimizer it wraps
    assert opt["class"] == "tf_keras.src.optimizers.adam.Adam"
    assert int(opt["variables"]["iteration"]) == STEPS
    assert sorted(opt["slots"]) == [str(i) for i in range(6)]
    assert all(sorted(s) == ["m", "v"] for s in opt["slots"].values())


def test_fit_metadata_and_per_rank_state(runs):
    d, _, _, _ = runs
    m = uckpt.manifest(d / "fit-full" / f"step_{STEPS:08d}")
    assert m.metadata["keras"] == {"epoch": 3, "batch": 0, "step": STEPS}
    assert set(m.metadata["metrics"]) >= {"loss"}
    for name, key in (("fit", "rng"), ("tape", "rank")):  # each rank's own random state
        node = uckpt.manifest(d / f"{name}-full" / f"step_{STEPS:08d}").tree["items"][key]
        assert node["type"] == "dict" and sorted(node["items"]) == ["0", "1", "2", "3"]


@pytest.mark.parametrize("name", ["fit", "tape"])
def test_killed_job_resumes_bitwise_on_every_rank(runs, name):
    d, full, resumed, kill = runs
    start = RESUMED[name]
    # the killed run had committed checkpoints up to step 6 and nothing after
    assert kill[name]["steps"] == ([3, 4, 6] if name == "fit" else [3, 6])
    for rank in range(4):
        a, b = full[rank][name], resumed[rank][name]
        if name == "fit":
            assert (b["initial_epoch"], b["step"]) == (1, start)
        else:
            assert b["start"] == start
        after = [str(s) for s in range(start + 1, STEPS + 1)]
        assert sorted(b["losses"], key=int) == after
        assert [b["losses"][s] for s in after] == [a["losses"][s] for s in after], rank
        assert b["digest"] == a["digest"], rank
    # the ranks' losses differ (their own data): each resumed its own part
    assert len({resumed[r][name]["losses"][str(STEPS)] for r in range(4)}) == 4


def test_final_checkpoint_loads_on_two_ranks_and_in_one_process(runs):
    d, full, resumed, _ = runs
    want = {name: resumed[0][name]["digest"] for name in ("fit", "tape")}
    assert want == {name: full[0][name]["digest"] for name in ("fit", "tape")}
    two = run_mpi(2, WORKER, "load", d, timeout=TIMEOUT, env=ENV).check()
    one = subprocess.run([PYTHON, str(WORKER), "load-plain", str(d)], env=_env(ENV),
                         capture_output=True, text=True, timeout=TIMEOUT)
    assert one.returncode == 0, one.stderr[-4000:]
    loaded = {**two.results, "plain": json.loads(one.stdout.split("RESULT ")[-1])}
    assert set(loaded) == {0, 1, "plain"}, output(two)
    for who, got in loaded.items():
        assert (got["fit"]["initial_epoch"], got["fit"]["step"]) == (3, STEPS), who
        assert got["fit"]["digest"] == want["fit"], who
        assert got["tape"]["step"] == STEPS and got["tape"]["digest"] == want["tape"], who
    # each of the 2 ranks got the noise generator of the rank with its number back
    assert loaded[0]["tape"]["noise"] != loaded[1]["tape"]["noise"]
    assert loaded["plain"]["tape"]["noise"] == loaded[0]["tape"]["noise"]
