#!/usr/bin/env python
"""Kill a TensorFlow/Keras training run with SIGKILL, resume it, compare bit for bit.

    python tests/tf_resume.py demo --mode loop     # custom loop (tf.GradientTape, tf.function)
    python tests/tf_resume.py demo --mode fit      # model.fit + uckpt.keras.Checkpoint
    python tests/tf_resume.py demo --mode fit-steps-end --every 4   # step checkpoints only

Like examples/resume_demo.py, the demo runs the training three times, each in
its own process: A uninterrupted; B killed with SIGKILL right after step
``--kill-at`` (not a checkpoint step); C started again on B's checkpoints, which
restores the newest one and trains to the end. Every process logs each
step's loss as the bit pattern of the float32. The resumed losses must equal
A's bit for bit, and so must the final weights.

The task: a small CNN (conv-BN-relu-pool, conv-relu-pool, dropout, dense) on
a synthetic image set made here from a seeded NumPy generator, shuffled
mini-batches, Adam.

* ``loop``: the data order comes from a ``tf.random.Generator`` that draws each
  epoch's permutation; the checkpoint holds the model (with the Dropout
  layer's seed generator), the optimizer (``uckpt_tf.OptimizerState``, so a
  fresh process builds it before restoring), ``uckpt.RandomState()``, the
  generator, the permutation, the epoch and position, and the step. A
  checkpoint every ``--every`` steps; resume mid-epoch.
* ``fit``: ``model.fit`` on ``uckpt_tf.epoch_shuffled`` (epoch e's order is a
  function of the seed and e) with ``uckpt.keras.Checkpoint`` at the end of
  every epoch; the log is Keras's running epoch loss after every batch. The
  resumed process passes ``initial_epoch=cb.restore(model)``.
* ``fit-steps`` / ``fit-steps-end``: the same with step checkpoints only
  (``every_n_steps=--every``, no epoch saves); the resumed process restores the newest
  checkpoint / passes ``at_epoch_end=True``. A step save after an epoch's last batch is
  that epoch's end, so with ``--every`` dividing the epoch either resumes bitwise.

``train --mode M --dir DIR --log FILE`` runs the training alone, checkpointing
into DIR (and resuming from it). Importable: ``demo(mode, ...)`` returns the
comparison as a dict.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fork_server import reap

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

NUM_IMAGES, IMAGE_SIZE, NUM_CLASSES, BATCH = 384, 12, 6, 32  # 12 batches per epoch
SEED = 0
MODES = ["loop", "fit", "fit-steps", "fit-steps-end"]


# ---------------------------------------------------------------------------------------
# The task
# ---------------------------------------------------------------------------------------
def make_dataset():
    """Images (N, 12, 12, 1) float32 and labels (N,) int32, the same on every call."""
    import numpy as np

    g = np.random.default_rng(2048)
    patterns = g.standard_normal((NUM_CLASSES, IMAGE_SIZE, IMAGE_SIZE, 1)).astype("float32")
    labels = g.integers(0, NUM_CLASSES, NUM_IMAGES).astype("int32")
    contrast = (0.5 + g.random((NUM_IMAGES, 1, 1, 1))).astype("float32")
    noise = g.standard_normal((NUM_IMAGES, IMAGE_SIZE, IMAGE_SIZE, 1)).astype("float32")
    return contrast * patterns[labels] + 1.5 * noise, labels


def make_model():
    import keras
    from keras import layers

    return keras.Sequential([
        keras.Input((IMAGE_SIZE, IMAGE_SIZE, 1)),
        layers.Conv2D(8, 3, padding="same"), layers.BatchNormalization(), layers.ReLU(),
        layers.MaxPooling2D(2),
        layers.Conv2D(16, 3, padding="same", activation="relu"), layers.MaxPooling2D(2),
        layers.Flatten(), layers.Dropout(0.3), layers.Dense(NUM_CLASSES),
    ])


def weights_digest(model) -> str:
    h = hashlib.sha256()
    for v in model.variables:
        h.update(v.numpy().tobytes())
    return h.hexdigest()


def bits(value) -> str:
    """The float32's bit pattern, as 8 hex digits."""
    import numpy as np

    return f"{int(np.float32(value).view(np.uint32)):08x}"


class Log:
    """Appends "step bits" lines; in lockstep, waits for a line on stdin after each step."""

    def __init__(self, path, lockstep):
        self.file = open(path or os.devnull, "a")
        self.lockstep = lockstep

    def step(self, step, loss, saved=False):
        self.file.write(f"{step} {bits(loss)}\n")
        self.file.flush()
        print(f"step {step} loss {float(loss):.6f}{'  [checkpoint]' if saved else ''}", flush=True)
        if self.lockstep and not sys.stdin.readline():
            raise SystemExit(1)


# ---------------------------------------------------------------------------------------
# (a) a custom training loop
# ---------------------------------------------------------------------------------------
def train_loop(root, *, steps, every, log=None, lockstep=False):
    import uckpt_tf

    uckpt_tf.make_deterministic(SEED)
    import keras
    import numpy as np
    import tensorflow as tf

    import uckpt

    images, labels = make_dataset()
    model = make_model()
    optimizer = keras.optimizers.Adam(3e-3)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    per_epoch = NUM_IMAGES // BATCH
    data = {"epoch": 0, "position": 0, "order": np.arange(NUM_IMAGES, dtype=np.int64),
            "generator": tf.random.Generator.from_seed(1)}

    def new_epoch_order():
        seed = data["generator"].make_seeds(1)[:, 0]
        data["order"][:] = tf.random.experimental.stateless_shuffle(
            tf.range(NUM_IMAGES, dtype=tf.int64), seed=seed).numpy()

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    def state(step):
        return {"model": model, "optimizer": uckpt_tf.OptimizerState(optimizer, model),
                "rng": uckpt.RandomState(), "data": data, "step": step}

    out = Log(log, lockstep)
    with uckpt.CheckpointManager(root, keep_last=2) as manager:
        step = manager.restore(state(0))
        if step is None:
            step = 0
            new_epoch_order()
            print("starting from scratch", flush=True)
        else:
            print(f"restored checkpoint at step {step} (epoch {data['epoch']}, "
                  f"batch {data['position']})", flush=True)
        while step < steps:
            if data["position"] == per_epoch:
                data["epoch"] += 1
                data["position"] = 0
                new_epoch_order()
            idx = data["order"][data["position"] * BATCH:(data["position"] + 1) * BATCH]
            loss = train_step(tf.gather(images, idx), tf.gather(labels, idx))
            data["position"] += 1
            step += 1
            saved = step % every == 0
            if saved:
                manager.save(step, state(step))
            out.step(step, loss.numpy(), saved)
    print(f"finished: step {step}, weights sha256 {weights_digest(model)}", flush=True)
    return 0


# ---------------------------------------------------------------------------------------
# (b) model.fit with the uckpt.keras.Checkpoint callback
# ---------------------------------------------------------------------------------------
def train_fit(root, *, epochs, log=None, lockstep=False, every_n_steps=None,
              at_epoch_end=False):
    import uckpt_tf

    uckpt_tf.make_deterministic(SEED)
    import keras

    import uckpt
    import uckpt.keras

    images, labels = make_dataset()
    model = make_model()
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=False)
    per_epoch = NUM_IMAGES // BATCH
    out = Log(log, lockstep)

    class LogLoss(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            out.step(cb.step, logs["loss"])

    with uckpt.CheckpointManager(root, keep_last=2) as manager:
        if every_n_steps:
            cb = uckpt.keras.Checkpoint(manager, every_n_steps=every_n_steps)
        else:
            cb = uckpt.keras.Checkpoint(manager, every_n_epochs=1)
        initial_epoch = cb.restore(model, at_epoch_end=at_epoch_end)
        print(f"restored checkpoint at step {cb.step} (epoch {initial_epoch})" if cb.step
              else "starting from scratch", flush=True)
        data = uckpt_tf.epoch_shuffled((images, labels), batch_size=BATCH, seed=1,
                                       initial_epoch=initial_epoch)
        model.fit(data, epochs=epochs, steps_per_epoch=per_epoch, initial_epoch=initial_epoch,
                  shuffle=False, callbacks=[cb, LogLoss()], verbose=0)
    print(f"finished: step {cb.step}, weights sha256 {weights_digest(model)}", flush=True)
    return 0


# ---------------------------------------------------------------------------------------
# The demo: three processes, then the comparison
# ---------------------------------------------------------------------------------------
def child_command(mode, root, log, total, every, lockstep=False):
    cmd = [sys.executable, os.path.abspath(__file__), "train", "--mode", mode, "--dir", str(root),
           "--log", str(log), "--total", str(total), "--every", str(every)]
    return cmd + (["--lockstep"] if lockstep else [])


def _popen(cmd, forks=None, stdin=None):
    """``cmd`` started with its stdout and stderr together in a pipe: a fresh interpreter,
    or (``forks``, a tests/fork_server.py server) a child forked from one."""
    if forks is not None:
        return forks.popen(cmd[1:], stdin=stdin, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT)
    return subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def run_to_end(cmd, timeout=300, forks=None):
    proc = _popen(cmd, forks)
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        reap(proc)
    if proc.returncode != 0:
        raise RuntimeError(f"training process failed ({proc.returncode}): {' '.join(cmd)}\n"
                           + out[-4000:])
    return out.splitlines()


def start_and_kill(cmd, kill_at, forks=None):
    """Start a lockstep run; return a function that answers it step by step and kills it."""
    proc = _popen(cmd, forks, stdin=subprocess.PIPE)

    def finish(timeout=300):
        lines = []
        deadline = time.monotonic() + timeout
        try:
            for line in iter(proc.stdout.readline, ""):
                lines.append(line)
                m = re.match(r"step (\d+) ", line)
                if m and int(m.group(1)) == kill_at:
                    proc.send_signal(signal.SIGKILL)  # no cleanup, no flush
                    break
                if m:
                    proc.stdin.write("go\n")
                    proc.stdin.flush()
                if time.monotonic() > deadline:
                    break
            proc.wait(timeout=30)
        finally:
            reap(proc)
            proc.stdin.close()
            proc.stdout.close()
        if proc.returncode != -signal.SIGKILL:
            raise RuntimeError(f"the run to be killed ended by itself ({proc.returncode}) "
                               f"before step {kill_at}:\n" + "".join(lines)[-4000:])
        return lines

    return finish


def read_log(path):
    """{step: bits}; a later line for a step wins."""
    out = {}
    for line in Path(path).read_text().splitlines():
        step, value = line.split()
        out[int(step)] = value
    return out


def _digest(lines):
    for line in lines:
        m = re.search(r"weights sha256 ([0-9a-f]+)", line)
        if m:
            return m.group(1)
    raise RuntimeError("a training process did not report its final weights")


def _restart(lines):
    for line in lines:
        m = re.match(r"restored checkpoint at step (\d+)", line)
        if m:
            return int(m.group(1))
        if line.startswith("starting from scratch"):
            return 0
    raise RuntimeError("the resumed process did not say where it started")


def demo(mode, workdir, *, total=None, every=10, kill_at=None, verbose=True, forks=None):
    """Run A, B (killed) and C; return {"restart", "compared", "same", "digests_equal", ...}.

    ``total`` is steps (loop) or epochs (fit); ``kill_at`` a step; ``forks``: a
    tests/fork_server.py server to fork the three runs from (fresh interpreters: None).
    """
    per_epoch = NUM_IMAGES // BATCH
    if mode == "loop":
        total = total or 40
        kill_at = kill_at or 27
        steps = total
    else:
        total = total or 3
        kill_at = kill_at or per_epoch + per_epoch // 2 + 1
        steps = total * per_epoch
    workdir = Path(workdir)
    a, bc = workdir / "uninterrupted", workdir / "interrupted"
    for d in (a, bc):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    t0 = time.perf_counter()
    # A and B run side by side (each uses one thread)
    finish_b = start_and_kill(child_command(mode, bc / "ckpt", bc / "before.log", total, every,
                                            lockstep=True), kill_at, forks)
    out_a = run_to_end(child_command(mode, a / "ckpt", a / "loss.log", total, every),
                       forks=forks)
    finish_b()
    t1 = time.perf_counter()
    out_c = run_to_end(child_command(mode, bc / "ckpt", bc / "after.log", total, every),
                       forks=forks)
    t2 = time.perf_counter()
    restart = _restart(out_c)
    la, lb, lc = read_log(a / "loss.log"), read_log(bc / "before.log"), read_log(bc / "after.log")
    after = list(range(restart + 1, steps + 1))
    same = [s for s in after if s in la and lc.get(s) == la[s]]
    result = {"mode": mode, "steps": steps, "killed_after": kill_at, "restart": restart,
              "compared": len(after), "same": len(same),
              "before_kill_same": all(lb[s] == la.get(s) for s in lb),
              "resumed_steps": sorted(lc), "digests_equal": _digest(out_a) == _digest(out_c),
              "seconds": {"uninterrupted+killed": round(t1 - t0, 1), "resumed": round(t2 - t1, 1)}}
    if verbose:
        print(f"[{mode}] uninterrupted run: steps 1-{steps}; interrupted run SIGKILLed after "
              f"step {kill_at}; resumed from checkpoint {restart}")
        print(f"{'step':>6}  {'uninterrupted':>13}  {'resumed':>9}")
        for s in range(max(1, restart - 1), steps + 1):
            ours = lc.get(s, lb.get(s))
            mark = "==" if ours == la.get(s) else "!="
            note = "   <- resumed here" if s == restart + 1 else ""
            print(f"{s:>6}  {la.get(s, '-'):>13}  {ours or '-':>9}  {mark}{note}")
        print(f"bitwise identical: {len(same)}/{len(after)} steps after restart; final weights "
              f"{'identical' if result['digests_equal'] else 'DIFFERENT'}")
    return result


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train")
    t.add_argument("--mode", choices=MODES, required=True)
    t.add_argument("--dir", required=True)
    t.add_argument("--log")
    t.add_argument("--total", type=int, required=True, help="steps (loop) or epochs (fit)")
    t.add_argument("--every", type=int, default=10,
                   help="loop, fit-steps*: checkpoint every N steps")
    t.add_argument("--lockstep", action="store_true")
    d = sub.add_parser("demo")
    d.add_argument("--mode", choices=MODES, default="loop")
    d.add_argument("--total", type=int)
    d.add_argument("--every", type=int, default=10)
    d.add_argument("--kill-at", type=int)
    d.add_argument("--workdir")
    args = p.parse_args(argv)
    if args.command == "train":
        if args.mode == "loop":
            return train_loop(args.dir, steps=args.total, every=args.every, log=args.log,
                              lockstep=args.lockstep)
        return train_fit(args.dir, epochs=args.total, log=args.log, lockstep=args.lockstep,
                         every_n_steps=args.every if args.mode != "fit" else None,
                         at_epoch_end=args.mode == "fit-steps-end")
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="uckpt-tf-resume-"))
    r = demo(args.mode, workdir, total=args.total, every=args.every, kill_at=args.kill_at)
    ok = r["same"] == r["compared"] and r["digests_equal"] and r["before_kill_same"]
    if ok and not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
