"""Acceptance: a TensorFlow/Keras run killed with SIGKILL and resumed in a new process
matches an uninterrupted run bit for bit; a Keras checkpoint loads without TensorFlow.

The ``model.fit`` runs are children forked from a fork server (tests/fork_server.py) that
has imported TensorFlow, Keras and uckpt.keras, not fresh interpreters (the imports were
most of a run's CPU time); the custom loop's runs stay fresh interpreters."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tf_common import keras, small_cnn, tf, train_step, data

import tf_resume  # noqa: E402
import uckpt  # noqa: E402
import uckpt_tf  # noqa: E402


@pytest.fixture(scope="module")
def forks():
    """A fork server that has imported what tests/tf_resume.py's training runs import."""
    from fork_server import ForkServer

    server = ForkServer.start(preload=("numpy", "tensorflow", "keras", "uckpt", "uckpt_tf",
                                       "uckpt.keras", "uckpt_tf.callback", "runpy"))
    yield server
    server.stop()


@pytest.mark.timeout(240)
def test_custom_loop_resumes_bitwise_after_sigkill(tmp_path):
    # 12 batches per epoch; checkpoints every 10 steps; killed after step 27, in epoch 3,
    # 7 steps after checkpoint 20 (taken mid-epoch 2); resumed steps 21-40 cross two epochs.
    r = tf_resume.demo("loop", tmp_path, total=40, every=10, kill_at=27, verbose=False)
    assert r["restart"] == 20
    assert r["before_kill_same"]
    assert r["resumed_steps"] == list(range(21, 41))
    assert (r["same"], r["compared"]) == (20, 20)
    assert r["digests_equal"]


@pytest.mark.timeout(240)
def test_fit_with_callback_resumes_bitwise_after_sigkill(tmp_path, forks):
    # 3 epochs of 12 batches, a checkpoint at the end of each; killed after step 19 (batch 7 of
    # epoch 2); the new process restores checkpoint 12 and fits with initial_epoch=1.
    r = tf_resume.demo("fit", tmp_path, total=3, kill_at=19, verbose=False, forks=forks)
    assert r["restart"] == 12
    assert r["before_kill_same"]
    assert r["resumed_steps"] == list(range(13, 37))
    assert (r["same"], r["compared"]) == (24, 24)
    assert r["digests_equal"]


@pytest.mark.timeout(360)
@pytest.mark.parametrize("mode, kill_at", [("fit-steps-end", 19), ("fit-steps", 14)])
def test_fit_with_step_checkpoints_resumes_bitwise_after_sigkill(tmp_path, forks, mode,
                                                                 kill_at):
    # every_n_steps=4 only, 12 batches per epoch: step 12 is saved after epoch 1's last batch,
    # and is that epoch's end. fit-steps-end: killed after step 19 (checkpoint 16 mid-epoch
    # 2), restore(at_epoch_end=True) takes 12; step 16 stays as it was, not saved again.
    # fit-steps: killed after step 14, the newest, 12, resumes at epoch 2. (Issue 30 §2:
    # step 12 was taken as mid-epoch; at_epoch_end started from scratch, and fit died with
    # CheckpointExistsError on step 12.)
    r = tf_resume.demo(mode, tmp_path, total=3, every=4, kill_at=kill_at, verbose=False,
                       forks=forks)
    assert r["restart"] == 12
    assert r["before_kill_same"]
    assert r["resumed_steps"] == list(range(13, 37))
    assert (r["same"], r["compared"]) == (24, 24)
    assert r["digests_equal"]


def test_load_without_tensorflow_or_keras_gives_numpy(tmp_path):
    keras.utils.set_random_seed(0)
    model = small_cnn()
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    x, y = data()
    train_step(model, model.optimizer, x[:4], y[:4])
    half = keras.Variable(np.linspace(-2, 2, 6).reshape(2, 3), dtype="bfloat16")
    it = iter(tf.data.Dataset.range(10).batch(3))
    next(it)
    state = {"model": model, "optimizer": model.optimizer, "half": half,
             "flags": tf.Variable([True, False]), "data": it, "rng": uckpt.RandomState()}
    uckpt.save(tmp_path / "ck", state)

    expected = {f"model/{k}": v.numpy() for k, v in uckpt_tf.layer_variables(model).items()}
    expected.update({f"optimizer/{k}": v.numpy()
                     for k, v in uckpt_tf.optimizer_variables(model.optimizer).items()})
    expected.update({"half": half.numpy(), "flags": state["flags"].numpy()})
    np.savez(tmp_path / "expected.npz",
             **{k: np.frombuffer(v.tobytes(), np.uint8) for k, v in expected.items()})
    (tmp_path / "dtypes.json").write_text(json.dumps({k: v.dtype.name for k, v in
                                                      expected.items()}))
    code = f"""
import json, sys
sys.modules["tensorflow"] = None  # any import of TensorFlow or Keras now fails
sys.modules["keras"] = None
import numpy as np, uckpt
tree = uckpt.load({str(tmp_path / 'ck')!r})
def flat(t, prefix=""):
    out = {{}}
    for k, v in t.items():
        if isinstance(v, dict):
            out.update(flat(v, prefix + str(k) + "/"))
        else:
            out[prefix + str(k)] = v
    return out
got = flat({{"model": tree["model"], "optimizer": tree["optimizer"]}})
got.update(half=tree["half"], flags=tree["flags"])
exp = np.load({str(tmp_path / 'expected.npz')!r})
dtypes = json.load(open({str(tmp_path / 'dtypes.json')!r}))
arrays = {{k: v for k, v in got.items() if isinstance(v, np.ndarray)}}
same = sorted(arrays) == sorted(exp.files) and all(
    arrays[k].dtype.name == dtypes[k] and arrays[k].tobytes() == exp[k].tobytes()
    for k in exp.files)
print(json.dumps({{"same": same, "n": len(arrays), "class": got["optimizer/class"],
                  "iterator": type(tree["data"]["state"]).__name__,
                  "rng": sorted(tree["rng"]["tensorflow"]),
                  "frameworks": [m for m in ("tensorflow", "keras")
                                 if sys.modules.get(m) is not None]}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"same": True, "n": len(expected),
                      "class": "keras.src.optimizers.adam.Adam", "iterator": "bytes",
                      "rng": ["global_generator", "keras"], "frameworks": []}
