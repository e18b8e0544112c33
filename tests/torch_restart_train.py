"""Child process of test_torch_restart.py: a small CNN trained on shuffled mini-batches
from a DataLoader over a ResumableSampler, checkpointed with uckpt, resumed from the
newest checkpoint in ROOT when there is one.

    python torch_restart_train.py ROOT LOG --steps M --every K [--pause-after S]
                                  [--forget-sampler]

Appends "step float32-bits-of-the-loss" to LOG after every step. With
--pause-after S it prints "paused after step S" after step S and waits to be
killed. --forget-sampler restores everything but the sampler (the control run
that shows the data order matters).
"""
import argparse
import hashlib
import struct
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

import uckpt
from uckpt.torch import ResumableSampler

NUM_IMAGES, SIZE, CLASSES, BATCH = 300, 12, 10, 32     # 9 full batches and one of 12 per epoch


class NoisyPatterns(Dataset):
    """Fixed images whose noise is redrawn, from torch's global RNG, every time one is read."""

    def __init__(self):
        g = torch.Generator().manual_seed(1234)
        patterns = torch.randn(CLASSES, 1, SIZE, SIZE, generator=g)
        self.labels = torch.randint(CLASSES, (NUM_IMAGES,), generator=g)
        self.images = patterns[self.labels] + torch.randn(NUM_IMAGES, 1, SIZE, SIZE, generator=g)

    def __len__(self):
        return NUM_IMAGES

    def __getitem__(self, i):
        return self.images[i] + 0.5 * torch.randn(1, SIZE, SIZE), self.labels[i]


def small_cnn():
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),   # 6x6
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),                      # 3x3
        nn.Flatten(), nn.Dropout(0.3), nn.Linear(16 * 3 * 3, CLASSES))


def digest(model):
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("root")
    p.add_argument("log")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--every", type=int, required=True)
    p.add_argument("--pause-after", type=int)
    p.add_argument("--forget-sampler", action="store_true")
    args = p.parse_args()

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    torch.manual_seed(0)

    dataset = NoisyPatterns()
    sampler = ResumableSampler(dataset, seed=7)
    # num_workers=0. generator=: each iter(loader) draws a seed for workers from it, by
    # default from torch's global RNG, which a resumed run would then draw once more.
    loader = DataLoader(dataset, batch_size=BATCH, sampler=sampler, generator=torch.Generator())
    model = small_cnn()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=8, gamma=0.7)

    def state(step):
        out = {"model": model, "optimizer": optimizer, "scheduler": scheduler,
               "rng": uckpt.RandomState(), "sampler": sampler, "step": step}
        if args.forget_sampler:
            del out["sampler"]
        return out

    with uckpt.CheckpointManager(args.root, keep_last=2) as manager, open(args.log, "a") as log:
        step = manager.restore(state(0), strict=not args.forget_sampler) or 0
        print(f"restored {step} epoch {sampler.epoch} position {sampler.position}", flush=True)
        while step < args.steps:
            for images, labels in loader:
                model.train()
                loss = F.cross_entropy(model(images), labels)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                scheduler.step()
                step += 1
                if step % args.every == 0:
                    manager.save(step, state(step))      # between steps: position is exact
                bits = struct.unpack("<I", struct.pack("<f", loss.item()))[0]
                log.write(f"{step} {bits:08x}\n")
                log.flush()
                if step == args.pause_after:
                    print(f"paused after step {step}", flush=True)
                    time.sleep(120)                      # until SIGKILL
                    return 3
                if step == args.steps:
                    break
    print(f"finished {step} params {digest(model)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
