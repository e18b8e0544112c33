"""Horovod for TensorFlow with tf_keras (Keras 2): training that checkpoints on every rank.

usage: mpiexec -n 4 python horovod_tf_train.py {first,second,third} DIR
       mpiexec -n 2 python horovod_tf_train.py load DIR       (also: python ... load-plain DIR)
Run by tests/test_horovod_tf.py; each rank prints one ``RESULT <json>`` line; the
rank that SIGKILLs itself writes its report to ``DIR/<run>-killed.json`` first.

Two trainings, each on 4 ranks with per-rank data and Horovod's gradient averaging:

* fit: ``model.fit`` of a tf_keras model with ``hvd.DistributedOptimizer``,
  ``BroadcastGlobalVariablesCallback``, ``MetricAverageCallback``,
  ``LearningRateWarmupCallback`` and ``uckpt.keras.Checkpoint`` (``comm`` is the
  ``horovod.tensorflow.keras`` module), saving after every STEP_EVERY-th batch and at
  every epoch's end; EPOCHS epochs of PER_EPOCH batches.
* tape: a custom loop, ``tf.GradientTape`` wrapped in ``hvd.DistributedGradientTape``,
  a tf_keras optimizer (``uckpt.keras.OptimizerState``), each rank's own
  ``tf.random.Generator`` (noise added to its batches) saved per rank
  (``uckpt.PerRank``); ``comm`` is the ``horovod.tensorflow`` module; a save every
  STEP_EVERY steps.

``first``: fit and tape uninterrupted (``DIR/fit-full``, ``DIR/tape-full``), then fit
in ``DIR/fit`` until rank FIT_KILLER SIGKILLs itself after step KILL_AT (mid-epoch).
``second``: fit resumed in ``DIR/fit`` from its newest end-of-epoch checkpoint and
trained to the end; then tape in ``DIR/tape`` until rank TAPE_KILLER SIGKILLs itself
after step KILL_AT. ``third``: tape resumed from its newest checkpoint, to the end.
``load``: the final checkpoints of ``DIR/fit`` and ``DIR/tape`` restored into new
objects on the ranks of this job (``load-plain``: in one process, without Horovod).
Losses are reported by step as float32 bits, the model and optimizer as a digest.
"""
import hashlib
import json
import os
import signal
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"  # tf.keras is tf_keras: horovod.tensorflow.keras needs it
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import uckpt_tf  # noqa: E402

uckpt_tf.make_deterministic(0)  # before TensorFlow runs any op

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

import uckpt  # noqa: E402
import uckpt.keras  # noqa: E402

WORLD, N, BATCH, EPOCHS = 4, 32, 8, 3
PER_EPOCH = N // BATCH           # 4 batches per epoch, 12 steps in all
STEPS = EPOCHS * PER_EPOCH
STEP_EVERY = 3                   # checkpoints at steps 3, 4, 6, 8, 9, 12 (fit); 3, 6, 9, 12 (tape)
KILL_AT = 7                      # mid-epoch 1, after the checkpoints of steps 4 and 6
FIT_KILLER, TAPE_KILLER = 2, 1
LR = 0.01


def report(rank, **kw):
    print("\nRESULT " + json.dumps({"rank": rank, **kw}), flush=True)


def bits(value):
    return int(np.float32(value).view(np.uint32))


def digest(model, optimizer):
    h = hashlib.sha256()
    for v in list(model.variables) + list(optimizer.variables):
        h.update(np.ascontiguousarray(v.numpy()).tobytes())
    return h.hexdigest()[:16]


def make_model():
    tf_keras.utils.set_random_seed(0)  # the same initial weights on every rank
    return tf_keras.Sequential([tf_keras.layers.Dense(16, activation="tanh", input_shape=(8,)),
                                tf_keras.layers.Dense(16, activation="tanh"),
                                tf_keras.layers.Dense(1)])


def rank_data(rank):
    rng = np.random.default_rng(1000 + rank)  # each rank its own shard
    x = rng.standard_normal((N, 8)).astype("float32")
    return x, np.sin(x).sum(1, keepdims=True).astype("float32")


def kill_self(path, **kw):
    with open(path, "w") as f:
        json.dump(kw, f)
    os.kill(os.getpid(), signal.SIGKILL)


# -- model.fit -----------------------------------------------------------------------------
def fit(root, hvd, *, resume=False, killer=None):
    model = make_model()
    model.compile(optimizer=hvd.DistributedOptimizer(tf_keras.optimizers.Adam(LR)), loss="mse")
    rank = hvd.rank()
    losses = {}

    class Log(tf_keras.callbacks.Callback):
        """After the Checkpoint callback: Keras's running loss by step (and the kill)."""

        def on_train_batch_end(self, batch, logs=None):
            losses[cb.step] = bits(logs["loss"])
            if cb.step == KILL_AT and rank == killer:
                kill_self(f"{root}-killed.json", losses=losses, steps=manager.steps())

    with uckpt.CheckpointManager(root, comm=hvd) as manager:
        cb = uckpt.keras.Checkpoint(manager, every_n_steps=STEP_EVERY, every_n_epochs=1)
        assert isinstance(cb, tf_keras.callbacks.Callback)
        initial_epoch = cb.restore(model, at_epoch_end=True) if resume else 0
        restored = {"initial_epoch": initial_epoch, "step": cb.step}
        ds = uckpt_tf.epoch_shuffled(rank_data(rank), batch_size=BATCH, seed=3 + rank,
                                     initial_epoch=initial_epoch)
        callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                     hvd.callbacks.MetricAverageCallback(),
                     hvd.callbacks.LearningRateWarmupCallback(LR, warmup_epochs=2, verbose=0),
                     cb, Log()]
        model.fit(ds, epochs=EPOCHS, steps_per_epoch=PER_EPOCH, initial_epoch=initial_epoch,
                  callbacks=callbacks, verbose=0)
        steps = manager.steps()
    return {"losses": losses, "digest": digest(model, model.optimizer), "steps": steps,
            **restored}


# -- a custom loop with hvd.DistributedGradientTape -------------------------------------------
def tape(root, hvd, *, resume=False, killer=None):
    rank = hvd.rank()
    model = make_model()
    opt = tf_keras.optimizers.Adam(LR)
    gen = tf.random.Generator.from_seed(100 + rank)  # each rank's own augmentation noise
    x_all, y_all = rank_data(rank)
    state = {"model": model, "optimizer": uckpt.keras.OptimizerState(opt, model), "step": 0,
             "rank": uckpt.PerRank({"noise": gen})}
    losses = {}
    with uckpt.CheckpointManager(root, comm=hvd) as manager:
        start = manager.restore(state) if resume else 0
        assert start == state["step"]
        hvd.broadcast_variables(model.variables, root_rank=0)
        for step in range(start, STEPS):
            i = (step % PER_EPOCH) * BATCH
            x = x_all[i:i + BATCH] + 0.01 * gen.normal((BATCH, 8))
            with tf.GradientTape() as t:
                loss = tf.reduce_mean(tf.square(model(x, training=True) - y_all[i:i + BATCH]))
            grads = hvd.DistributedGradientTape(t).gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            losses[step + 1] = bits(loss.numpy())
            if (step + 1) % STEP_EVERY == 0:
                state["step"] = step + 1
                manager.save(step + 1, state)
            if step + 1 == KILL_AT and rank == killer:
                kill_self(f"{root}-killed.json", losses=losses, steps=manager.steps())
        steps = manager.steps()
    return {"losses": losses, "digest": digest(model, opt), "steps": steps, "start": start}


# -- loading the final checkpoints elsewhere -----------------------------------------------------
def load(directory, comm):
    model = make_model()
    model.compile(optimizer=tf_keras.optimizers.Adam(LR), loss="mse")  # not Horovod's
    with uckpt.CheckpointManager(f"{directory}/fit", comm=comm) as manager:
        cb = uckpt.keras.Checkpoint(manager)
        fit_epoch = cb.restore(model)
    out = {"fit": {"initial_epoch": fit_epoch, "step": cb.step,
                   "digest": digest(model, model.optimizer)}}
    model, opt = make_model(), tf_keras.optimizers.Adam(LR)
    gen = tf.random.Generator.from_seed(7)
    state = {"model": model, "optimizer": uckpt.keras.OptimizerState(opt, model), "step": 0,
             "rank": uckpt.PerRank({"noise": gen})}
    with uckpt.CheckpointManager(f"{directory}/tape", comm=comm) as manager:
        step = manager.restore(state)
    out["tape"] = {"step": step, "digest": digest(model, opt),
                   "noise": gen.state.numpy().tolist()}
    return out


def main():
    mode, directory = sys.argv[1], sys.argv[2]
    if mode == "load-plain":
        report(0, **load(directory, None))
        return
    import horovod.tensorflow as hvd_tf
    import horovod.tensorflow.keras as hvd

    hvd.init()
    rank = hvd.rank()
    assert hvd.size() == (2 if mode == "load" else WORLD), hvd.size()
    if mode == "first":
        report(rank, fit=fit(f"{directory}/fit-full", hvd),  # before the killed run
               tape=tape(f"{directory}/tape-full", hvd_tf))
        fit(f"{directory}/fit", hvd, killer=FIT_KILLER)
        raise SystemExit("the fit run was not killed")
    if mode == "second":
        report(rank, fit=fit(f"{directory}/fit", hvd, resume=True))
        tape(f"{directory}/tape", hvd_tf, killer=TAPE_KILLER)
        raise SystemExit("the tape run was not killed")
    if mode == "third":
        report(rank, tape=tape(f"{directory}/tape", hvd_tf, resume=True))
    elif mode == "load":
        report(rank, **load(directory, hvd_tf))
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
