"""The training task of the examples: a small CNN on a synthetic image data set.

Everything here is deterministic and made locally, so the examples need no
download: the data set comes from its own seeded ``torch.Generator``, and the
sampler's data order follows from three values a checkpoint can hold.
"""
from __future__ import annotations

import hashlib

import torch
from torch import nn

NUM_CLASSES = 10
IMAGE_SIZE = 16


def make_dataset(num_images: int = 2048, seed: int = 2048):
    """Images (N, 1, 16, 16) float32 and labels (N,) int64, the same on every call.

    Each class has its own random 16x16 pattern; an image is its class's
    pattern, randomly brightened or dimmed, plus strong noise. A CNN learns it
    in a few dozen steps, but not instantly.
    """
    g = torch.Generator().manual_seed(seed)
    patterns = torch.randn(NUM_CLASSES, 1, IMAGE_SIZE, IMAGE_SIZE, generator=g)
    labels = torch.randint(NUM_CLASSES, (num_images,), generator=g)
    contrast = 0.5 + torch.rand(num_images, 1, 1, 1, generator=g)
    noise = torch.randn(num_images, 1, IMAGE_SIZE, IMAGE_SIZE, generator=g)
    images = contrast * patterns[labels] + 1.5 * noise
    return images, labels


class SmallCNN(nn.Module):
    """conv-bn-relu-pool twice, then dropout and a linear classifier."""

    def __init__(self, num_classes: int = NUM_CLASSES):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, kernel_size=3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.MaxPool2d(2),                                    # 16x16 -> 8x8
            nn.Conv2d(16, 32, kernel_size=3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.MaxPool2d(2),                                    # 8x8 -> 4x4
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Dropout(0.3), nn.Linear(32 * 4 * 4, num_classes),
        )

    def forward(self, x):
        return self.classifier(self.features(x))


class ShuffleSampler:
    """Shuffled mini-batches of indices, epoch after epoch (the last partial batch is dropped).

    The whole data order follows from three values, and they are what a
    checkpoint must hold to resume mid-epoch:

    * ``epoch``: how many epochs are finished;
    * ``position``: how many batches of the current epoch were already taken;
    * ``generator``: the ``torch.Generator`` that draws each epoch's
      permutation, kept at its state *at the start of the current epoch*
      (the permutation is drawn from a copy), so a restored sampler draws the
      same permutation again and carries on at ``position``.
    """

    def __init__(self, num_items: int, batch_size: int, seed: int):
        if batch_size > num_items:
            raise ValueError(f"batch_size {batch_size} exceeds the {num_items} items")
        self.num_items = num_items
        self.batch_size = batch_size
        self.batches_per_epoch = num_items // batch_size
        self.generator = torch.Generator().manual_seed(seed)
        self.epoch = 0
        self.position = 0
        self._permutation = None   # this epoch's order, drawn lazily
        self._next_epoch_state = None

    def next_batch(self) -> torch.Tensor:
        if self.position == self.batches_per_epoch:      # epoch done: on to the next one
            self.generator.set_state(self._next_epoch_state)
            self.epoch += 1
            self.position = 0
            self._permutation = None
        if self._permutation is None:
            scratch = torch.Generator()
            scratch.set_state(self.generator.get_state())
            self._permutation = torch.randperm(self.num_items, generator=scratch)
            self._next_epoch_state = scratch.get_state()
        start = self.position * self.batch_size
        self.position += 1
        return self._permutation[start:start + self.batch_size]

    # -- checkpointing --------------------------------------------------------------
    def state(self) -> dict:
        """What to put in a checkpoint (uckpt saves the generator through its torch adapter)."""
        return {"epoch": self.epoch, "position": self.position, "generator": self.generator}

    def load_state(self, state: dict) -> None:
        """Take back ``state()`` after uckpt restored it (the generator is restored in place)."""
        if state["generator"] is not self.generator:
            self.generator.set_state(state["generator"].get_state())
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._permutation = None


def parameters_digest(model: nn.Module) -> str:
    """sha256 of every parameter and buffer, by name: equal digests mean equal bits."""
    h = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        h.update(name.encode())
        h.update(tensor.detach().contiguous().numpy().tobytes())
    return h.hexdigest()
