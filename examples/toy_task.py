"""The training task of the examples: a small CNN on a synthetic image data set.

Everything here is deterministic and made locally, so the examples need no
download: the data set comes from its own seeded ``torch.Generator``. (The data
order comes from ``uckpt.torch.ResumableSampler``, whose place in it a checkpoint holds.)
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


def parameters_digest(model: nn.Module) -> str:
    """sha256 of every parameter and buffer, by name: equal digests mean equal bits."""
    h = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        h.update(name.encode())
        h.update(tensor.detach().contiguous().numpy().tobytes())
    return h.hexdigest()
