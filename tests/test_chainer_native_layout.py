"""Chainer's own trainer snapshots and uckpt's trainer checkpoints are one tree (issue 14):
extensions.snapshot() -> uckpt root -> uckpt.chainer.resume -> two more iterations identical to
Chainer's own resume (load_npz); and a uckpt.chainer checkpoint -> NPZ -> load_npz."""
import logging
import subprocess
import sys

import numpy as np
import pytest

import uckpt
import uckpt.chainer  # noqa: F401  (NumPy 2 shim, before chainer)
from convert_sources import chainer_trainer
from uckpt.conversion import convert, diff
from uckpt.errors import StateMismatchError

pytestmark = pytest.mark.filterwarnings("ignore::uckpt.conversion.ConvertWarning")


def _trainer(out, snapshot=True):
    from chainer.training import extensions

    trainer, model, opt = chainer_trainer(out, epochs=0)
    if snapshot:
        trainer.extend(extensions.snapshot(), trigger=(1, "epoch"))
    return trainer, model, opt


def _run_to(trainer, iteration):
    import chainer

    trainer.stop_trigger = chainer.training.get_trigger((iteration, "iteration"))
    trainer.run()


def _assert_same(a, b):
    (ta, ma, oa), (tb, mb, ob) = a, b
    assert ta.updater.iteration == tb.updater.iteration
    assert oa.t == ob.t and oa.epoch == ob.epoch
    for (name, p), q in zip(ma.namedparams(), mb.params()):
        assert p.array.dtype == q.array.dtype and np.array_equal(p.array, q.array), name
        for k, v in p.update_rule.state.items():
            assert np.array_equal(v, q.update_rule.state[k]), (name, k)
    def log(t):  # wall-clock times differ between runs
        return [{k: v for k, v in e.items() if k != "elapsed_time"}
                for e in t.get_extension("LogReport").log]
    assert log(ta) == log(tb)


@pytest.fixture
def snapshot(tmp_path):
    trainer, _, _ = _trainer(tmp_path / "orig")
    _run_to(trainer, 4)  # two epochs of two iterations: snapshot_iter_2, snapshot_iter_4
    return tmp_path / "orig" / "snapshot_iter_4"


@pytest.mark.parametrize("via", ["api", "cli"])
def test_snapshot_resumes_with_uckpt_chainer(tmp_path, snapshot, via, caplog):
    root = tmp_path / "root"
    if via == "api":
        convert(snapshot, root / "step_00000004")
    else:
        r = subprocess.run([sys.executable, "-m", "uckpt.cli", "convert", str(snapshot),
                            str(root / "step_00000004")], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    assert diff(snapshot, root / "step_00000004").identical
    ours = _trainer(tmp_path / "ours")
    with caplog.at_level(logging.INFO, logger="uckpt.chainer"):
        with uckpt.CheckpointManager(root) as manager:
            assert uckpt.chainer.resume(manager, ours[0]) == 4
    assert "no random state" in caplog.text and "Chainer's own layout" in caplog.text
    theirs = _trainer(tmp_path / "theirs")
    import chainer

    chainer.serializers.load_npz(snapshot, theirs[0])
    _assert_same(ours, theirs)
    for run in (ours, theirs):
        _run_to(run[0], 6)  # two more iterations
    _assert_same(ours, theirs)


def test_snapshot_into_another_model_changes_nothing(tmp_path, snapshot):
    import chainer
    import chainer.links as L

    convert(snapshot, tmp_path / "root" / "step_00000004")
    trainer, model, _ = _trainer(tmp_path / "other")
    model.predictor[0] = L.Linear(3, 5)
    model.predictor[2] = L.Linear(5, 2)
    opt = chainer.optimizers.Adam()
    opt.setup(model)
    trainer.updater._optimizers["main"] = opt
    before = [p.array.copy() for p in model.params() if p.array is not None]
    with uckpt.CheckpointManager(tmp_path / "root") as manager:
        with pytest.raises(StateMismatchError, match="predictor/0/W"):
            uckpt.chainer.resume(manager, trainer)
    assert trainer.updater.iteration == 0
    after = [p.array for p in model.params() if p.array is not None]
    assert all(np.array_equal(a, b) for a, b in zip(before, after))


def test_uckpt_trainer_checkpoint_to_chainer_snapshot(tmp_path):
    """uckpt.chainer.snapshot's checkpoint -> NPZ: Chainer's load_npz resumes from it."""
    import chainer

    trainer, model, opt = _trainer(tmp_path / "a", snapshot=False)
    with uckpt.CheckpointManager(tmp_path / "root") as manager:
        trainer.extend(uckpt.chainer.snapshot(manager, trigger=(1, "epoch")))
        _run_to(trainer, 4)
    with pytest.warns(uckpt.conversion.ConvertWarning, match="left out 'rng'"):
        convert(tmp_path / "root" / "step_00000004", tmp_path / "snapshot.npz")
    again = _trainer(tmp_path / "b", snapshot=False)
    chainer.serializers.load_npz(tmp_path / "snapshot.npz", again[0])
    _assert_same((trainer, model, opt), again)
