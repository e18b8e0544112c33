"""Chainer's own trainer snapshots and uckpt's trainer checkpoints are one tree (issue 14):
extensions.snapshot() -> uckpt root -> uckpt.chainer.resume -> two more iterations identical to
Chainer's own resume (load_npz); and a uckpt.chainer checkpoint -> NPZ -> load_npz."""
import logging
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import uckpt
import uckpt.chainer  # noqa: F401  (NumPy 2 shim, before chainer)
from convert_sources import assert_chainer_equal, chainer_trainer
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


def _recipe_blocks():
    """The shell and Python blocks of docs/frameworks/chainer.md's ``--add-prefix`` recipe."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs/frameworks/chainer.md").read_text()
    found = re.search(r"```sh\n\s*(uckpt convert [^\n]*--add-prefix[^\n]*)\n\s*```\s*"
                      r"```python\n(.*?)\n\s*```", text, re.S)
    assert found, "chainer.md has no --add-prefix recipe"
    return found.group(1), textwrap.dedent(found.group(2))


def test_doc_add_prefix_recipe_restores_a_link(tmp_path):
    """docs/frameworks/chainer.md's recipe, as written: a link's save_npz file converted with
    --add-prefix restores through uckpt.load(dir, {"model": model}) (issue 30 §2: the prefix
    was glued to the keys, `modelpredictor/...`, and the restore failed with
    KeyMismatchError)."""
    import shlex

    import chainer

    _, model, _ = chainer_trainer(tmp_path / "t", epochs=1)
    chainer.serializers.save_npz(str(tmp_path / "model.npz"), model)
    command, code = _recipe_blocks()
    args = shlex.split(command)
    r = subprocess.run([sys.executable, "-m", "uckpt.cli", *args[1:]], cwd=tmp_path,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    _, fresh, _ = chainer_trainer(tmp_path / "f", epochs=0)
    for p in fresh.params():
        p.array[...] = 0
    namespace = {"uckpt": uckpt, "model": fresh}
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        exec(compile(code, "chainer.md", "exec"), namespace)
    finally:
        os.chdir(cwd)
    assert_chainer_equal(model, fresh)


def test_add_prefix_without_slash_warns_when_it_glues(tmp_path):
    """`--add-prefix model` on a tree of groups glues the prefix to each key, as asked, and
    the warning names the `model/` that nests instead."""
    import chainer

    _, model, _ = chainer_trainer(tmp_path / "t", epochs=0)
    chainer.serializers.save_npz(str(tmp_path / "model.npz"), model)
    with pytest.warns(uckpt.conversion.ConvertWarning,
                      match=r"'predictor' -> 'modelpredictor'.*--add-prefix 'model/'"):
        convert(tmp_path / "model.npz", tmp_path / "glued.npz", add_prefix="model")
