"""``model.fit`` with ``uckpt.keras.Checkpoint`` on several ranks, run under mpiexec.

usage: mpiexec -n 2 python keras_dist_worker.py {first,resume} DIR
Run by tests/test_keras_distributed.py; each rank prints one ``RESULT <json>``
line (the run that is killed writes its report to ``DIR/b-rank<R>.json``).

The situation of Horovod's Keras integration (``horovod.tensorflow.keras``,
not installed here): one process per rank, each running ``model.fit`` with the
callback on a ``CheckpointManager`` over MPI COMM_WORLD, each rank saving its
part. There is no gradient all-reduce, so the replicated training is made
identical on every rank instead: the same seeds, the same data, one thread
(``uckpt_tf.make_deterministic``), so every rank's weights are bitwise the
same after every step, as averaged gradients would keep them.

``first``:
  a. an uninterrupted run of EPOCHS epochs (checkpoint every epoch, comm=MPI.COMM_WORLD);
  mismatch. ranks trained on different data: the first save must be refused on
     every rank (StateMismatchError), nothing committed;
  b. the run to be killed (comm=None: detected): NumPy's global generator differs by
     rank (as per-rank augmentation would make it); OnSignal(SIGUSR1) as save policy
     and SIGUSR1 sent to rank 0 only after step SIGNAL_AT; every rank SIGKILLs itself
     after step KILL_AT (no cleanup).
``resume``:
  c. a new job on b's checkpoints: ``initial_epoch = cb.restore(model)``, fit to the end;
  single. restores ``DIR/single``, saved by one process (the test), on every rank.
"""
import json
import os
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from mpi4py import MPI  # noqa: E402  (before uckpt: comm=None detects MPI)

import uckpt_tf  # noqa: E402

uckpt_tf.make_deterministic(0)  # before TensorFlow runs any op

import numpy as np  # noqa: E402

import uckpt  # noqa: E402
import uckpt.keras  # noqa: E402
from tf_common import compiled_cnn, data, float_bits, keras, numpy_rng_digest  # noqa: E402
from tf_resume import weights_digest  # noqa: E402

N, BATCH, EPOCHS = 24, 4, 3  # 6 batches per epoch, 18 steps
SIGNAL_AT, KILL_AT = 4, 9    # mid-epoch 1; mid-epoch 2, after the checkpoint of step 6
COMM = MPI.COMM_WORLD
RANK = COMM.rank


def report(**kw):
    print("\nRESULT " + json.dumps({"rank": RANK, **kw}), flush=True)


class Log(keras.callbacks.Callback):
    """Records Keras's running loss after each step (as float32 bits), by ``cb.step``;
    placed after the Checkpoint callback, so it sees what a save saw."""

    def __init__(self, cb):
        super().__init__()
        self.cb = cb
        self.losses = {}
        self.rng_at_save = {}

    def on_train_batch_end(self, batch, logs=None):
        self.losses[self.cb.step] = float_bits([logs["loss"]])[0]

    def on_epoch_end(self, epoch, logs=None):
        self.rng_at_save[self.cb.step] = numpy_rng_digest()


def fit(model, callbacks, epochs, initial_epoch=0, data_seed=0):
    x, y = data(N, seed=data_seed)
    ds = uckpt_tf.epoch_shuffled((x, y), batch_size=BATCH, seed=3, initial_epoch=initial_epoch)
    model.fit(ds, epochs=epochs, steps_per_epoch=N // BATCH, initial_epoch=initial_epoch,
              shuffle=False, callbacks=callbacks, verbose=0)


def fresh():
    uckpt_tf.make_deterministic(0, threads=None)  # threads were set once, at import
    return compiled_cnn(seed=0)


def run_a(root):
    model = fresh()
    with uckpt.CheckpointManager(root, comm=COMM) as manager:
        cb = uckpt.keras.Checkpoint(manager)
        log = Log(cb)
        fit(model, [cb, log], EPOCHS)
        steps = manager.steps()
    return {"losses": log.losses, "digest": weights_digest(model), "steps": steps}


def run_mismatch(root):
    model = fresh()
    out = {"raised": None}
    with uckpt.CheckpointManager(root, comm=COMM) as manager:
        try:
            fit(model, [uckpt.keras.Checkpoint(manager)], 1, data_seed=RANK)  # differs by rank
        except uckpt.errors.UckptError as e:
            out = {"raised": type(e).__name__, "msg": str(e), "leaf": getattr(e, "leaf", None)}
        steps = manager.steps()
    COMM.barrier()
    listing = sorted(n for n in os.listdir(root)
                     if n not in (".uckpt-writer.lock", ".uckpt-costs.json"))
    return {"steps": steps, "listing": listing, **out}


class SignalRank0(keras.callbacks.Callback):
    """Before the Checkpoint callback: SIGUSR1 to rank 0 alone after step SIGNAL_AT."""

    def __init__(self):
        super().__init__()
        self.seen = 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen == SIGNAL_AT and RANK == 0:
            os.kill(os.getpid(), signal.SIGUSR1)


class Kill(keras.callbacks.Callback):
    """Last: after step KILL_AT, report to a file and SIGKILL this process (every rank)."""

    def __init__(self, cb, log, path):
        super().__init__()
        self.cb, self.log, self.path = cb, log, path

    def on_train_batch_end(self, batch, logs=None):
        if self.cb.step != KILL_AT:
            return
        with open(self.path, "w") as f:
            json.dump({"rank": RANK, "losses": self.log.losses, "rng_at_save": self.log.rng_at_save,
                       "steps": self.cb.manager.steps()}, f)
        COMM.barrier()  # both ranks are past step KILL_AT and have written their report
        os.kill(os.getpid(), signal.SIGKILL)


def run_b(root, report_dir):
    model = fresh()
    np.random.random(1 + 5 * RANK)  # the ranks' global NumPy generators now differ
    policy = uckpt.OnSignal("SIGUSR1", exit=False)
    with uckpt.CheckpointManager(root, comm=None, save_policy=policy) as manager:
        assert manager.comm.size == COMM.size  # detected: MPI
        cb = uckpt.keras.Checkpoint(manager)
        log = Log(cb)
        fit(model, [SignalRank0(), cb, log, Kill(cb, log, f"{report_dir}/b-rank{RANK}.json")],
            EPOCHS)
    raise SystemExit("run b was not killed")


def run_c(root):
    model = fresh()
    with uckpt.CheckpointManager(root, comm=COMM) as manager:
        cb = uckpt.keras.Checkpoint(manager)
        initial_epoch = cb.restore(model)
        restored = {"initial_epoch": initial_epoch, "step": cb.step, "rng": numpy_rng_digest()}
        log = Log(cb)
        fit(model, [cb, log], EPOCHS, initial_epoch=initial_epoch)
        steps = manager.steps()
    return {"losses": log.losses, "digest": weights_digest(model), "steps": steps, **restored}


def run_single(root):
    """Restore a checkpoint saved by one process (its single random state) on every rank."""
    model = fresh()
    with uckpt.CheckpointManager(root, comm=COMM) as manager:
        cb = uckpt.keras.Checkpoint(manager)
        initial_epoch = cb.restore(model)
    return {"initial_epoch": initial_epoch, "step": cb.step, "digest": weights_digest(model),
            "rng": numpy_rng_digest()}


def main():
    scenario, directory = sys.argv[1], sys.argv[2]
    if scenario == "first":
        a = run_a(f"{directory}/a")
        report(a=a, mismatch=run_mismatch(f"{directory}/mismatch"))  # one line per rank
        run_b(f"{directory}/b", directory)
    elif scenario == "resume":
        report(c=run_c(f"{directory}/b"), single=run_single(f"{directory}/single"))
    else:
        raise SystemExit(f"unknown scenario {scenario}")


if __name__ == "__main__":
    main()
