"""The blob layer: bytes under keys, below the checkpoint layer (see :mod:`.base` for
the interface, its call order and its capability flags).

Backends, each one class in its own module, imported on first use:
:class:`~.memory.MemoryStore`, :class:`~.posix.PosixStore` (local directories),
:class:`~.s3.S3Store` (boto3) and :class:`~.fsspec_store.FsspecStore` (any fsspec file
system). :class:`uckpt.testing.store_tests.StoreTests` is the suite every backend passes.
"""
from __future__ import annotations

from typing import Any

from .base import BlobLock, BlobStore, BlobWriter, Listing

_BACKENDS = {"MemoryStore": "memory", "PosixStore": "posix", "S3Store": "s3",
             "FsspecStore": "fsspec_store"}

__all__ = ["BlobLock", "BlobStore", "BlobWriter", "FsspecStore", "Listing", "MemoryStore",
           "PosixStore", "S3Store"]


def __getattr__(name: str) -> Any:
    module = _BACKENDS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
