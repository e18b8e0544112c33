"""TensorFlow under Horovod: rank-0 ``ModelCheckpoint`` against uckpt on every rank.

    python benchmarks/bench_horovod_tf.py                      # 1, 2 and 4 ranks
    python benchmarks/bench_horovod_tf.py --ranks 1 2 --size small --epochs 3

For each number of ranks, three runs of ``model.fit`` (tf_keras, ``TF_USE_LEGACY_KERAS=1``,
``hvd.DistributedOptimizer`` with Adam, ``BroadcastGlobalVariablesCallback``, synthetic
data, one checkpoint per epoch): (a) no checkpoints, (b) Keras's ``ModelCheckpoint`` on
rank 0 only, as in Horovod's examples (an HDF5 file with the optimizer), (c)
``uckpt.keras.Checkpoint`` on every rank (each writes its share). Reported: the training
time T of epochs 2.. (the first epoch traces the graph and is left out; the slowest rank's),
Ω = (T_ckpt − T_none) / T_none, and the bytes of the last checkpoint. Each run is its own
``mpiexec`` launch (``--worker``). Numbers taken on a busy machine are provisional.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIZES = {"small": (256, 512), "medium": (1024, 2048)}  # (input width, hidden width)
MODES = ("none", "keras", "uckpt")


def _tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def worker(mode: str, root: Path, size: str, epochs: int, steps: int) -> None:
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import numpy as np
    import tf_keras
    import horovod.tensorflow.keras as hvd

    hvd.init()
    rank = hvd.rank()
    width, hidden = SIZES[size]
    tf_keras.utils.set_random_seed(0)
    model = tf_keras.Sequential([tf_keras.layers.Dense(hidden, activation="relu",
                                                       input_shape=(width,)),
                                 tf_keras.layers.Dense(hidden, activation="relu"),
                                 tf_keras.layers.Dense(width)])
    model.compile(optimizer=hvd.DistributedOptimizer(tf_keras.optimizers.Adam(1e-3)), loss="mse")
    rng = np.random.default_rng(rank)
    x = rng.standard_normal((steps * 32, width)).astype("float32")
    times = {}

    class Clock(tf_keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 1:
                times["start"] = time.perf_counter()

        def on_train_end(self, logs=None):
            times["end"] = time.perf_counter()

    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
    manager = None
    if mode == "keras" and rank == 0:
        callbacks.append(tf_keras.callbacks.ModelCheckpoint(str(root / "ckpt-{epoch}.h5")))
    elif mode == "uckpt":
        import uckpt
        import uckpt.keras

        manager = uckpt.CheckpointManager(root / "uckpt", comm=hvd, keep_last=1)
        callbacks.append(uckpt.keras.Checkpoint(manager))
    callbacks.append(Clock())
    model.fit(x, x, batch_size=32, epochs=epochs, shuffle=False, verbose=0, callbacks=callbacks)
    if manager is not None:
        manager.close()
    import horovod.tensorflow as hvd_tf

    seconds = max(hvd_tf.allgather_object(times["end"] - times["start"]))
    if rank == 0:
        if mode == "keras":
            size_bytes = (root / f"ckpt-{epochs}.h5").stat().st_size
        elif mode == "uckpt":
            size_bytes = _tree_bytes(root / "uckpt")
        else:
            size_bytes = 0
        print("RESULT " + json.dumps({"seconds": seconds, "bytes": size_bytes}), flush=True)


def run(ranks: int, mode: str, size: str, epochs: int, steps: int) -> dict:
    mpiexec = Path(sys.executable).with_name("mpiexec")
    with tempfile.TemporaryDirectory(prefix="bench-hvd-tf-") as root:
        cmd = [str(mpiexec), "-n", str(ranks), sys.executable, __file__, "--worker", mode,
               "--root", root, "--size", size, "--epochs", str(epochs), "--steps", str(steps)]
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"{mode} on {ranks} ranks failed:\n{out.stdout[-3000:]}\n"
                         f"{out.stderr[-3000:]}")
    return json.loads(out.stdout.split("RESULT ")[-1].splitlines()[0])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--size", choices=sorted(SIZES), default="medium")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--steps", type=int, default=20, help="batches per epoch and rank")
    p.add_argument("--out", type=Path, help="also write the rows as JSON here")
    p.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--root", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        worker(a.worker, a.root, a.size, a.epochs, a.steps)
        return
    rows = []
    print(f"{'ranks':>5} {'T none s':>9} {'Ω keras r0':>11} {'Ω uckpt all':>12} "
          f"{'keras MB':>9} {'uckpt MB':>9}")
    for ranks in a.ranks:
        r = {m: run(ranks, m, a.size, a.epochs, a.steps) for m in MODES}
        t0 = r["none"]["seconds"]
        row = {"ranks": ranks, "t_none": t0,
               "omega_keras_rank0": (r["keras"]["seconds"] - t0) / t0,
               "omega_uckpt_all_ranks": (r["uckpt"]["seconds"] - t0) / t0,
               "keras_bytes": r["keras"]["bytes"], "uckpt_bytes": r["uckpt"]["bytes"]}
        rows.append(row)
        print(f"{ranks:>5} {t0:>9.2f} {row['omega_keras_rank0']:>10.1%} "
              f"{row['omega_uckpt_all_ranks']:>11.1%} {row['keras_bytes'] / 1e6:>9.1f} "
              f"{row['uckpt_bytes'] / 1e6:>9.1f}", flush=True)
    if a.out:
        a.out.write_text(json.dumps({"size": a.size, "epochs": a.epochs, "steps": a.steps,
                                     "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
