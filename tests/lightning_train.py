"""A tiny deterministic lightning.Trainer run saving through uckpt.lightning.CheckpointIO, for
tests/test_lightning.py: ``lightning_train.py ROOT MODE [--kill-at STEP] [--resume CKPT]
[--epochs N]``. MODE: ``sync``, ``async`` (the plugin's own asynchronous saves),
``lightning-async`` (Lightning's AsyncCheckpointIO around it) or ``native`` (no plugin:
Lightning's own torch.save checkpoints). At the end writes ROOT/final.npz: the weights,
the optimizer's state and the global step; and ROOT/losses.json: each step's loss (its
exact bits, as float.hex) by global step."""
import argparse
import json
import os
import signal
import time

import numpy as np
import torch
import lightning as L
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.plugins.io import AsyncCheckpointIO

import uckpt.lightning

EPOCHS, STEPS_PER_EPOCH = 4, 4


class Tiny(L.LightningModule):
    def __init__(self, width: int = 8):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(5, width), torch.nn.Tanh(),
                                       torch.nn.Linear(width, 1))

    def training_step(self, batch, _):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=0.05)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)]


class Losses(Callback):
    """Each training step's loss, by the global step it was computed at."""

    def __init__(self):
        self.losses = {}

    def on_train_batch_end(self, trainer, module, outputs, *_):
        self.losses[trainer.global_step - 1] = float(outputs["loss"]).hex()


class Kill(Callback):
    """SIGKILL this process after step ``step``, once some checkpoint is committed (an
    asynchronous save may still be writing the first one; later ones may be cut short)."""

    def __init__(self, step: int, root: str):
        self.step, self.root = step, root

    def on_train_batch_end(self, trainer, *_):
        if trainer.global_step == self.step:
            deadline = time.monotonic() + 120
            while not os.path.exists(os.path.join(self.root, "last.ckpt", "manifest.json")) \
                    and time.monotonic() < deadline:
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGKILL)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("root")
    p.add_argument("mode", choices=["sync", "async", "lightning-async", "native"])
    p.add_argument("--kill-at", type=int)
    p.add_argument("--resume")
    p.add_argument("--epochs", type=int, default=EPOCHS)
    a = p.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    L.seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(16, 5, generator=g),
                                          torch.randn(16, 1, generator=g))
    loader = torch.utils.data.DataLoader(data, batch_size=16 // STEPS_PER_EPOCH)
    io = uckpt.lightning.CheckpointIO(blocking=a.mode != "async")
    if a.mode == "lightning-async":
        io = AsyncCheckpointIO(io)
    losses = Losses()
    callbacks = [ModelCheckpoint(dirpath=a.root, every_n_epochs=1, save_top_k=-1,
                                 save_last=True), losses]
    if a.kill_at:
        callbacks.append(Kill(a.kill_at, a.root))
    trainer = L.Trainer(max_epochs=a.epochs, accelerator="cpu", devices=1, logger=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        plugins=[] if a.mode == "native" else [io], callbacks=callbacks,
                        deterministic=True)
    model = Tiny()
    trainer.fit(model, loader, ckpt_path=a.resume)
    opt = trainer.optimizers[0]
    state = {f"w/{k}": v.numpy() for k, v in model.state_dict().items()}
    for i, s in opt.state_dict()["state"].items():
        state.update({f"opt/{i}/{k}": v.numpy() for k, v in s.items()})
    state["lr"] = np.float64(opt.param_groups[0]["lr"])
    state["global_step"] = np.int64(trainer.global_step)
    np.savez(os.path.join(a.root, "final.npz"), **state)
    with open(os.path.join(a.root, "losses.json"), "w") as f:
        json.dump(losses.losses, f)


if __name__ == "__main__":
    main()
