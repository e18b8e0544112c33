"""Real ResNet50 and VGG16 models and training runs in PyTorch, Keras and Chainer, for
bench_frameworks.py. Each runner trains on synthetic data (CPU, small batches and
small images: the parameter counts are the real models', the compute is not) with
SGD + momentum, and checkpoints every ``every`` steps with one method:

  none        no checkpoints
  own         the framework's own checkpointing: torch.save of the state dicts;
              Keras ModelCheckpoint(save_weights_only=True) to .weights.h5; Chainer
              extensions.snapshot() (np.savez_compressed of the whole trainer)
  uckpt-sync  a uckpt CheckpointManager, blocking saves (the framework's integration:
              manager.save; uckpt.keras.Checkpoint; uckpt.chainer.snapshot)
  uckpt-async the same with async_save=True (the drain at the end is timed too)

Every file the framework's own checkpointing writes is fsynced right after the save,
inside the timed region (uckpt fsyncs its own), so every method's checkpoints are
durable. Images: ResNet50 at 64x64 (global average pooling, as in every framework's
model); VGG16 at 32x32, its 1x1 pool5 brought to the 7x7 its classifier takes (torch:
AdaptiveAvgPool2d(7), as torchvision does; Keras: UpSampling2D(7); Chainer:
broadcast), so the classifier has its 102.8M parameters.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Dict, List

from common import cleanup, fsync_path, tree_nbytes  # noqa: E402

METHODS = ("none", "own", "uckpt-sync", "uckpt-async")


def _durable(path: Path) -> None:
    fsync_path(path)
    fsync_path(path.parent)


def _manager(uckpt, root: Path, method: str):
    return uckpt.CheckpointManager(root, keep_last=2, async_save=(method == "uckpt-async"))


def _finish(manager, root: Path, t0: float, stalls: List[float]) -> Dict:
    """End a run: close the manager (the drain of an async save is timed), measure the
    newest checkpoint, remove the run's files."""
    if manager is not None:
        manager.close()
    total = time.perf_counter() - t0
    size = _newest_size(root)
    cleanup(root)
    return {"total_s": total, "stalls_s": stalls, "ckpt_bytes": size}


def _newest_size(root: Path) -> int:
    """Bytes of the newest checkpoint under ``root`` (a file or a step directory)."""
    entries = [p for p in root.iterdir() if not p.name.startswith(".")]
    if not entries:
        return 0
    newest = max(entries, key=lambda p: p.stat().st_mtime)
    return tree_nbytes(newest) if newest.is_dir() else newest.stat().st_size


# ---------------------------------------------------------------------------------------------
# PyTorch
# ---------------------------------------------------------------------------------------------
def _torch_resnet50():
    import torch.nn as nn

    class Bottleneck(nn.Module):
        def __init__(self, cin, width, stride, down):
            super().__init__()
            out = width * 4
            self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(width)
            self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(width)
            self.conv3 = nn.Conv2d(width, out, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(out)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = nn.Sequential(nn.Conv2d(cin, out, 1, stride, bias=False),
                                            nn.BatchNorm2d(out)) if down else None

        def forward(self, x):
            y = self.relu(self.bn1(self.conv1(x)))
            y = self.relu(self.bn2(self.conv2(y)))
            y = self.bn3(self.conv3(y))
            return self.relu(y + (x if self.downsample is None else self.downsample(x)))

    layers, cin = [], 64
    for planes, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        blk = [Bottleneck(cin, planes, stride, True)]
        cin = planes * 4
        blk += [Bottleneck(cin, planes, 1, False) for _ in range(blocks - 1)]
        layers.append(nn.Sequential(*blk))
    return nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                         nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1), *layers,
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000))


def _torch_vgg16():
    import torch.nn as nn

    feats, cin = [], 3
    for v in (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
              512, 512, 512, "M"):
        if v == "M":
            feats.append(nn.MaxPool2d(2))
        else:
            feats += [nn.Conv2d(cin, v, 3, padding=1), nn.ReLU(inplace=True)]
            cin = v
    return nn.Sequential(*feats, nn.AdaptiveAvgPool2d(7), nn.Flatten(),
                         nn.Linear(512 * 49, 4096), nn.ReLU(True), nn.Dropout(),
                         nn.Linear(4096, 4096), nn.ReLU(True), nn.Dropout(),
                         nn.Linear(4096, 1000))


class TorchRunner:
    framework = "pytorch"

    def __init__(self, model: str, batch: int, workdir: Path) -> None:
        import torch

        torch.manual_seed(0)
        self.torch = torch
        self.model = {"resnet50": _torch_resnet50, "vgg16": _torch_vgg16}[model]()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-4, momentum=0.9)
        side = 64 if model == "resnet50" else 32
        self.x = torch.randn(batch, 3, side, side)
        self.y = torch.randint(0, 1000, (batch,))
        self.workdir = workdir
        self.params = sum(p.numel() for p in self.model.parameters())

    def _step(self) -> None:
        self.opt.zero_grad(set_to_none=False)
        self.torch.nn.functional.cross_entropy(self.model(self.x), self.y).backward()
        self.opt.step()

    def run(self, method: str, steps: int, every: int) -> Dict:
        import uckpt

        root = self.workdir / f"torch-{method}"
        root.mkdir(parents=True, exist_ok=True)
        manager = _manager(uckpt, root, method) if method.startswith("uckpt") else None
        stalls: List[float] = []
        t0 = time.perf_counter()
        for step in range(1, steps + 1):
            self._step()
            if method == "none" or step % every:
                continue
            s0 = time.perf_counter()
            if manager is not None:
                manager.save(step, {"model": self.model, "optimizer": self.opt})
            else:
                path = root / f"ckpt_{step}.pt"
                self.torch.save({"model": self.model.state_dict(),
                                 "optimizer": self.opt.state_dict()}, path)
                _durable(path)
            stalls.append(time.perf_counter() - s0)
        return _finish(manager, root, t0, stalls)


# ---------------------------------------------------------------------------------------------
# Keras (TensorFlow)
# ---------------------------------------------------------------------------------------------
class KerasRunner:
    framework = "tensorflow"

    def __init__(self, model: str, batch: int, workdir: Path) -> None:
        import keras
        import numpy as np
        import tensorflow as tf

        keras.utils.set_random_seed(0)
        self.keras = keras
        if model == "resnet50":
            self.model = keras.applications.ResNet50(weights=None, input_shape=(64, 64, 3))
            side = 64
        else:
            side = 32
            base = keras.applications.VGG16(weights=None, include_top=False,
                                            input_shape=(side, side, 3))
            h = keras.layers.UpSampling2D(7)(base.output)  # pool5 1x1 -> the 7x7 of VGG16
            h = keras.layers.Flatten()(h)
            h = keras.layers.Dense(4096, activation="relu", name="fc1")(h)
            h = keras.layers.Dense(4096, activation="relu", name="fc2")(h)
            out = keras.layers.Dense(1000, activation="softmax", name="predictions")(h)
            self.model = keras.Model(base.input, out, name="vgg16")
        self.model.compile(optimizer=keras.optimizers.SGD(1e-4, momentum=0.9),
                           loss="sparse_categorical_crossentropy")
        rng = np.random.default_rng(0)
        x = rng.standard_normal((batch, side, side, 3), dtype=np.float32)
        y = rng.integers(0, 1000, (batch,))
        self.data = tf.data.Dataset.from_tensors((x, y)).repeat()
        self.workdir = workdir
        self.params = self.model.count_params()

    def run(self, method: str, steps: int, every: int) -> Dict:
        import uckpt
        import uckpt.keras

        root = self.workdir / f"keras-{method}"
        root.mkdir(parents=True, exist_ok=True)
        manager = None
        callbacks: list = []
        if method == "own":
            callbacks = [_DurableModelCheckpoint(self.keras, root / "ckpt.weights.h5", every)]
        elif method.startswith("uckpt"):
            manager = _manager(uckpt, root, method)
            callbacks = [uckpt.keras.Checkpoint(manager, every_n_steps=every,
                                                every_n_epochs=None)]
        timer = _KerasStallTimer(self.keras)
        t0 = time.perf_counter()
        self.model.fit(self.data, steps_per_epoch=steps, epochs=1, verbose=0,
                       callbacks=[timer.start] + callbacks + [timer.end])
        return _finish(manager, root, t0, timer.stalls(every) if method != "none" else [])


def _DurableModelCheckpoint(keras, path: Path, every: int):
    """Keras' own ModelCheckpoint, with an fsync of the file after each save."""

    class Durable(keras.callbacks.ModelCheckpoint):
        def on_train_batch_end(self, batch, logs=None):
            super().on_train_batch_end(batch, logs)
            if (batch + 1) % every == 0:  # it saved just now (one epoch: batch counts steps)
                _durable(path)

    return Durable(str(path), save_weights_only=True, save_freq=every, verbose=0)


class _KerasStallTimer:
    """Time between a first and a last callback at every batch end: the checkpoint's stall."""

    def __init__(self, keras) -> None:
        outer = self
        self.times: List[float] = []

        class Start(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                outer._start = time.perf_counter()

        class End(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                outer.times.append(time.perf_counter() - outer._start)

        self.start, self.end = Start(), End()

    def stalls(self, every: int) -> List[float]:
        return [t for i, t in enumerate(self.times, 1) if i % every == 0]


# ---------------------------------------------------------------------------------------------
# Chainer
# ---------------------------------------------------------------------------------------------
class ChainerRunner:
    framework = "chainer"

    def __init__(self, model: str, batch: int, workdir: Path) -> None:
        import uckpt.chainer  # noqa: F401  (NumPy 2 shim before chainer)
        import chainer
        import chainer.functions as F
        import chainer.links as L
        import numpy as np

        chainer.config.train = True
        self.chainer = chainer
        side = 64 if model == "resnet50" else 32

        class Net(chainer.Chain):
            """The model's layers (real sizes) and a forward fit for small images."""

            def __init__(self):
                super().__init__()
                with self.init_scope():
                    self.base = L.ResNet50Layers(pretrained_model=None) \
                        if model == "resnet50" else L.VGG16Layers(pretrained_model=None)

            def forward(self, x):
                if model == "resnet50":
                    return self.base(x, layers=["fc6"])["fc6"]
                h = self.base(x, layers=["pool5"])["pool5"]
                h = F.broadcast_to(h, (h.shape[0], 512, 7, 7))  # 1x1 -> VGG16's 7x7
                h = F.relu(self.base.fc6(h))
                h = F.relu(self.base.fc7(h))
                return self.base.fc8(h)

        self.model = L.Classifier(Net())
        rng = np.random.default_rng(0)
        x = rng.standard_normal((batch, 3, side, side), dtype=np.float32)
        y = rng.integers(0, 1000, (batch,)).astype(np.int32)
        self.dataset = chainer.datasets.TupleDataset(x, y)
        self.batch = batch
        self.opt = chainer.optimizers.MomentumSGD(lr=1e-4, momentum=0.9)
        self.opt.setup(self.model)
        self.workdir = workdir
        self.params = sum(p.size for p in self.model.params())

    def run(self, method: str, steps: int, every: int) -> Dict:
        import uckpt
        import uckpt.chainer
        from chainer import training
        from chainer.training import extensions

        chainer = self.chainer
        root = self.workdir / f"chainer-{method}"
        root.mkdir(parents=True, exist_ok=True)
        it = chainer.iterators.SerialIterator(self.dataset, self.batch, shuffle=False)
        updater = training.updaters.StandardUpdater(it, self.opt)
        trainer = training.Trainer(updater, (steps, "iteration"), out=str(root))
        manager = None
        stalls: List[float] = []
        trigger = (every, "iteration")
        if method == "own":
            snap = extensions.snapshot(filename="snapshot_iter_{.updater.iteration}")

            def durable_snapshot(tr):
                s0 = time.perf_counter()
                snap(tr)
                _durable(root / f"snapshot_iter_{tr.updater.iteration}")
                stalls.append(time.perf_counter() - s0)

            trainer.extend(durable_snapshot, trigger=trigger, priority=-100)
        elif method.startswith("uckpt"):
            manager = _manager(uckpt, root, method)
            ext = uckpt.chainer.snapshot(manager, trigger=trigger)

            def timed_ext(tr):  # called every iteration: the extension has its own trigger
                s0 = time.perf_counter()
                ext(tr)
                if tr.updater.iteration % every == 0:
                    stalls.append(time.perf_counter() - s0)

            trainer.extend(timed_ext, trigger=(1, "iteration"), priority=-100)
        t0 = time.perf_counter()
        trainer.run()
        return _finish(manager, root, t0, stalls)


RUNNERS = {"pytorch": TorchRunner, "tensorflow": KerasRunner, "chainer": ChainerRunner}


def set_threads(n: int) -> None:
    """The same number of compute threads in every framework."""
    os.environ.setdefault("OMP_NUM_THREADS", str(n))
    os.environ.setdefault("TF_NUM_INTRAOP_THREADS", str(n))
