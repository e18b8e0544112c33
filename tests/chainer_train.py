"""Child process for the Chainer resume tests: a small CNN with BatchNorm and dropout,
trained on shuffled mini-batches, checkpointed with uckpt, optionally SIGKILLed.

    python chainer_train.py loop|trainer ROOT LOG --iters M --every K [--kill-at N]

``loop``: a hand-written loop; the state mapping holds the model, the optimizer
(MomentumSGD with a WeightDecay hook and a learning rate changed by the loop),
the SerialIterator, its order sampler's own generator, ``uckpt.RandomState()``
(dropout draws from NumPy's global generator) and the step. A checkpoint every
K iterations.

``trainer``: Chainer's Trainer with a StandardUpdater (Adam), LogReport,
ExponentialShift and ``uckpt.chainer.snapshot`` (trigger: one epoch, K
iterations); the SerialIterator shuffles with NumPy's global generator;
``uckpt.chainer.resume`` before ``trainer.run()``. Asynchronous saves.

Both restore the newest checkpoint under ROOT if there is one, append
"iteration float32-bits-of-loss" to LOG after every iteration, SIGKILL
themselves right after iteration N (``--kill-at``), and print "resumed from S"
and, at the end, "digest HEX" (sha256 of every parameter's bytes).
"""
import argparse
import hashlib
import os
import signal
import sys
from pathlib import Path

import numpy as np

import uckpt
import uckpt.chainer  # before chainer: makes it importable under NumPy 2

import chainer  # noqa: E402
import chainer.functions as F  # noqa: E402
import chainer.links as L  # noqa: E402
from chainer import training  # noqa: E402
from chainer.dataset import concat_examples  # noqa: E402
from chainer.iterators import SerialIterator, ShuffleOrderSampler  # noqa: E402
from chainer.training import extensions  # noqa: E402

BATCH = 16
SAMPLES = 80  # 5 iterations per epoch


class SmallCNN(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.conv = L.Convolution2D(1, 4, ksize=3, pad=1)
            self.bn = L.BatchNormalization(4)
            self.fc1 = L.Linear(None, 16)  # lazily initialized: shape from the first batch
            self.fc2 = L.Linear(16, 3)

    def forward(self, x):
        h = F.max_pooling_2d(F.relu(self.bn(self.conv(x))), 2)
        h = F.dropout(F.relu(self.fc1(F.dropout(h, 0.25))), 0.25)
        return self.fc2(h)


def dataset():
    rs = np.random.RandomState(123)  # the data never depends on the global generator
    x = rs.standard_normal((SAMPLES, 1, 8, 8)).astype(np.float32)
    t = (x.reshape(SAMPLES, -1)[:, :3].sum(axis=1) > 0).astype(np.int32) + \
        (x[:, 0, 0, 0] > 1).astype(np.int32)
    return chainer.datasets.TupleDataset(x, t)


def bits(value) -> str:
    return format(int(np.asarray(value, dtype=np.float32).view(np.uint32)), "08x")


def digest(model) -> str:
    h = hashlib.sha256()
    for name, p in sorted(model.namedparams()):
        h.update(name.encode())
        h.update(np.ascontiguousarray(p.array).tobytes())
    for name, link in sorted(model.namedlinks()):
        if isinstance(link, L.BatchNormalization):
            h.update(link.avg_mean.tobytes() + link.avg_var.tobytes())
    return h.hexdigest()


def record(log, iteration, loss, kill_at):
    log.write(f"{iteration} {bits(loss)}\n")
    log.flush()
    if iteration == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no flush, no goodbye


def run_loop(args, model, log):
    sampler = ShuffleOrderSampler(np.random.RandomState(7))
    it = SerialIterator(dataset(), BATCH, order_sampler=sampler)
    opt = chainer.optimizers.MomentumSGD(lr=0.05)
    opt.setup(model)
    opt.add_hook(chainer.optimizer_hooks.WeightDecay(1e-4))

    def state(step):
        return {"model": model, "optimizer": opt, "iterator": it,
                "shuffle_rng": sampler._random, "rng": uckpt.RandomState(), "step": step}

    with uckpt.CheckpointManager(args.root, keep_last=3) as manager:
        step = manager.restore(state(0)) or 0
        print("resumed from", step, flush=True)
        while step < args.iters:
            x, t = concat_examples(it.next())
            opt.update(model, x, t)
            step += 1
            if step % 7 == 0:
                opt.lr *= 0.8  # a schedule of the loop's own: the optimizer's hyperparameter
            if step % args.every == 0:
                manager.save(step, state(step))
            record(log, step, model.loss.array, args.kill_at)


class RecordLoss(training.Extension):
    trigger = (1, "iteration")

    def __init__(self, log, kill_at):
        self.log, self.kill_at = log, kill_at

    def __call__(self, trainer):
        record(self.log, trainer.updater.iteration, trainer.observation["main/loss"].array,
               self.kill_at)


def run_trainer(args, model, log):
    it = SerialIterator(dataset(), BATCH)  # shuffles with NumPy's global generator
    opt = chainer.optimizers.Adam(alpha=0.01)
    opt.setup(model)
    updater = training.updaters.StandardUpdater(it, opt)
    trainer = training.Trainer(updater, (args.iters, "iteration"), out=str(Path(args.root) / "out"))
    trainer.extend(extensions.LogReport(trigger=(3, "iteration")))
    trainer.extend(extensions.ExponentialShift("alpha", 0.9), trigger=(4, "iteration"))
    trainer.extend(RecordLoss(log, args.kill_at))
    with uckpt.CheckpointManager(args.root, keep_last=3, async_save=True) as manager:
        trainer.extend(uckpt.chainer.snapshot(manager, trigger=(1, "epoch")))
        print("resumed from", uckpt.chainer.resume(manager, trainer) or 0, flush=True)
        trainer.run()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["loop", "trainer"])
    parser.add_argument("root")
    parser.add_argument("log")
    parser.add_argument("--iters", type=int, required=True)
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--kill-at", type=int, default=-1)
    args = parser.parse_args()
    np.random.seed(0)  # initial weights; a resumed run takes everything from its checkpoint
    model = L.Classifier(SmallCNN())
    with open(args.log, "a") as log:
        (run_loop if args.mode == "loop" else run_trainer)(args, model, log)
    print("digest", digest(model), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
