"""uckpt.keras.Checkpoint when several ranks train together: two MPI ranks, each running
``model.fit`` with the callback on ``CheckpointManager(root, comm=MPI.COMM_WORLD)`` (or
comm=None, detected), as with Horovod's Keras integration.

``horovod.tensorflow.keras`` is not installed (Horovod is built for PyTorch only here),
so there is no gradient all-reduce: every rank trains the same model on the same data
from the same seeds, single-threaded (``uckpt_tf.make_deterministic``), which keeps the
replicated weights bitwise equal on every rank after every step, as Horovod's averaged
gradients would. A run on different data per rank shows what happens when they are not.

Two launches in all (TensorFlow imports slowly on two ranks; see tests/keras_dist_worker.py):
``first`` runs (a) an uninterrupted job, the mismatch case, and (b) a job whose ranks
SIGKILL themselves mid-epoch; ``resume`` (c) restores b's checkpoints in a new job with
``cb.restore(model)`` and trains to the end. UCKPT_COMM_TIMEOUT makes a collective that
only some ranks enter (a callback call that is not collective-safe) fail within 30 s
instead of hanging; the launches have hard timeouts too.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from multiproc import HAVE_MPI, run_mpi
from tf_common import compiled_cnn, data, numpy_rng_digest  # skips the module without TF
from tf_resume import weights_digest

import uckpt  # noqa: E402
import uckpt.keras  # noqa: E402

# one pytest-xdist worker runs the whole module: its module-scoped launches ran once per
# worker otherwise (see docs/testing.md)
pytestmark = [pytest.mark.xdist_group("keras_distributed"),
              pytest.mark.skipif(not HAVE_MPI, reason="needs mpi4py and mpiexec")]

WORKER = Path(__file__).with_name("keras_dist_worker.py")
ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "UCKPT_COMM_TIMEOUT": "30"}
STEPS = 18  # 3 epochs of 6 batches
RESTART = 6  # b is killed after step 9; its newest checkpoint is the end of epoch 1


def output(run):
    return f"--- stdout\n{run.stdout[-4000:]}\n--- stderr\n{run.stderr[-4000:]}"


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    """Launch 1: per rank {"a": ..., "mismatch": ..., "b": ...} and the directory."""
    d = tmp_path_factory.mktemp("keras_dist")
    run = run_mpi(2, WORKER, "first", d, timeout=300, env=ENV)
    assert run.returncodes != [0], "run b should have been killed\n" + output(run)
    assert set(run.results) == {0, 1}, output(run)
    for rank in (0, 1):
        report = d / f"b-rank{rank}.json"
        assert report.exists(), f"rank {rank} did not reach step 9 of run b\n" + output(run)
        run.results[rank]["b"] = json.loads(report.read_text())
    return d, run.results


@pytest.fixture(scope="module")
def resumed(first):
    """Launch 2: a new job restores run b's checkpoints and trains to the end; it also
    restores DIR/single, one epoch saved here by a single process."""
    d, _ = first
    model = compiled_cnn(seed=1)
    with uckpt.CheckpointManager(d / "single") as manager:
        model.fit(*data(24), batch_size=4, epochs=1, shuffle=False, verbose=0,
                  callbacks=[uckpt.keras.Checkpoint(manager)])
    single = {"digest": weights_digest(model), "rng": numpy_rng_digest()}
    run = run_mpi(2, WORKER, "resume", d, timeout=300, env=ENV).check()
    assert set(run.results) == {0, 1}, output(run)
    return run.results, single


def test_every_rank_saves_its_part(first):
    d, res = first
    a0, a1 = res[0]["a"], res[1]["a"]
    # the replicated training is bitwise the same on both ranks
    assert a0["losses"] == a1["losses"] and len(a0["losses"]) == STEPS
    assert a0["digest"] == a1["digest"]
    assert a0["steps"] == a1["steps"] == [6, 12, 18]
    for step in a0["steps"]:
        path = d / "a" / f"step_{step:08d}"
        m = uckpt.manifest(path)
        assert m.world_size == 2 and m.step == step
        assert sorted(f.rank for f in m.files.values()) == [0, 1]
        for f in m.files.values():
            assert f.size > 0 and os.path.getsize(path / f.name) == f.size
        assert m.metadata["keras"] == {"epoch": step // 6, "batch": 0, "step": step}
        assert set(m.metadata["metrics"]) == {"loss"}
        rng = m.tree["items"]["rng"]  # each process's global random state: PerRank
        assert rng["type"] == "dict" and sorted(rng["items"]) == ["0", "1"]
    tree = uckpt.load(d / "a" / "step_00000018")
    assert (tree["epoch"], tree["step"]) == (3, 18)
    assert int(tree["optimizer"]["variables"]["iteration"]) == 18


def test_replicas_that_differ_are_refused_on_every_rank(first):
    _, res = first
    m0, m1 = res[0]["mismatch"], res[1]["mismatch"]
    assert m0["raised"] == m1["raised"] == "StateMismatchError", (m0, m1)
    assert m0["leaf"] == m1["leaf"] and m0["leaf"].startswith("model/")
    assert f"replicated leaf {m0['leaf']!r}" in m0["msg"] and m0["msg"] == m1["msg"]
    assert m0["steps"] == m1["steps"] == []
    assert m0["listing"] == []  # nothing committed, no temporary directory left


def test_a_signal_to_one_rank_saves_on_every_rank(first):
    # OnSignal(SIGUSR1) on every rank, the signal sent to rank 0 alone after step 4:
    # both ranks saved step 4 (one checkpoint, both files); training went on unchanged
    d, res = first
    b0, b1 = res[0]["b"], res[1]["b"]
    assert b0["steps"] == b1["steps"] == [4, 6]
    m = uckpt.manifest(d / "b" / "step_00000004")
    assert m.world_size == 2 and sorted(f.rank for f in m.files.values()) == [0, 1]
    assert m.metadata["keras"] == {"epoch": 0, "batch": 4, "step": 4}
    a = res[0]["a"]["losses"]
    assert b0["losses"] == b1["losses"] == {s: a[s] for s in map(str, range(1, 10))}


def test_killed_job_resumes_bitwise(first, resumed):
    _, res = first
    a = res[0]["a"]
    for rank in (0, 1):
        c = resumed[0][rank]["c"]
        assert (c["initial_epoch"], c["step"]) == (RESTART // 6, RESTART)
        # every loss after the restart, as float32 bits, and the final weights
        after = [str(s) for s in range(RESTART + 1, STEPS + 1)]
        assert sorted(c["losses"], key=int) == after
        assert [c["losses"][s] for s in after] == [a["losses"][s] for s in after]
        assert c["digest"] == a["digest"]
        assert c["steps"] == [4, 6, 12, 18]
        # each rank got its own global random state back (they differed in run b)
        assert c["rng"] == res[rank]["b"]["rng_at_save"][str(RESTART)]
    assert resumed[0][0]["c"]["rng"] != resumed[0][1]["c"]["rng"]


def test_two_ranks_resume_a_one_process_checkpoint(resumed):
    results, single = resumed
    for rank in (0, 1):
        got = results[rank]["single"]
        assert (got["initial_epoch"], got["step"]) == (1, 6)
        assert got["digest"] == single["digest"]
        assert got["rng"] == single["rng"]  # the one saved random state, on every rank


def test_one_process_resumes_a_two_rank_checkpoint(first):
    d, res = first
    model = compiled_cnn(seed=5)
    with uckpt.CheckpointManager(d / "a") as manager:
        assert manager.comm.size == 1
        cb = uckpt.keras.Checkpoint(manager)
        assert cb.restore(model) == 3 and cb.step == 18
    assert weights_digest(model) == res[0]["a"]["digest"]
    assert int(model.optimizer.iterations) == 18
