"""uckpt: framework-agnostic checkpointing with a neutral, documented on-disk format.

``import uckpt`` imports no deep-learning framework; adapters are loaded when a
framework object is handed to :func:`save` or :func:`load`. :func:`convert`
(conversion between checkpoint formats, :mod:`uckpt.conversion`) and
:func:`open` (a checkpoint read array by array, :mod:`uckpt.loading.lazy`) are imported
on first use.
"""
from . import errors
from ._version import __version__
from .adapter import Adapter, ArraySpec, RNGProvider
from .manager import policies
from .api import consolidate, load, manifest, save, verify
from .loading.report import LoadReport
from .saving.engine import SaveHandle
from .manager.interval import EveryOptimal
from .manager.checkpoint_manager import CheckpointManager
from .manager.policies import (AnyOf, EveryNSeconds, EveryNSteps, KeepAll, KeepBest, KeepEvery,
                               KeepLast, OnSignal)
from .registry import register_adapter
from .rng import RandomState
from .tree.shard import PerRank, Shard
from .manager.tiers import Tier

__all__ = ["Adapter", "AnyOf", "ArraySpec", "CheckpointManager", "EveryNSeconds", "consolidate",
           "EveryNSteps", "EveryOptimal", "KeepAll", "KeepBest", "KeepEvery", "KeepLast",
           "LoadReport", "OnSignal", "PerRank", "RNGProvider", "RandomState", "SaveHandle",
           "Shard", "Tier",
           "__version__", "errors", "load", "manifest", "policies", "register_adapter", "save",
           "verify"]

__all__ += ["convert"]

#: option objects, by the module defining them (imported on first use)
_OPTIONS = {"SaveOptions": "options", "RetentionOptions": "manager.options",
            "AsyncOptions": "manager.options", "IncrementalOptions": "manager.options"}
__all__ += list(_OPTIONS)


def __getattr__(name: str):
    """``uckpt.convert`` (:func:`uckpt.conversion.convert`), ``uckpt.open``
    (:func:`uckpt.loading.lazy.open_checkpoint`) and the option objects
    (:class:`uckpt.options.SaveOptions`, :mod:`uckpt.manager.options`) are imported on
    first use, so ``import uckpt`` stays light."""
    if name == "convert":
        from .conversion.api import convert

        globals()["convert"] = convert
        return convert
    if name == "open":  # (not in __all__: a star import would hide the built-in open)
        from .loading.lazy import open_checkpoint

        globals()["open"] = open_checkpoint
        return open_checkpoint
    if name in _OPTIONS:
        import importlib

        value = getattr(importlib.import_module(f".{_OPTIONS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'uckpt' has no attribute {name!r}")
