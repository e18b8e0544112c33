"""uckpt: framework-agnostic checkpointing with a neutral, documented on-disk format.

``import uckpt`` imports no deep-learning framework; adapters are loaded when a
framework object is handed to :func:`save` or :func:`load`. :func:`convert`
(conversion between checkpoint formats, :mod:`uckpt.conversion`) is imported
on first use.
"""
from . import errors
from ._version import __version__
from .adapter import Adapter, ArraySpec, RNGProvider
from . import policies
from .api import consolidate, load, manifest, save, verify
from .engine import SaveHandle
from .interval import EveryOptimal
from .manager import CheckpointManager
from .policies import (AnyOf, EveryNSeconds, EveryNSteps, KeepAll, KeepBest, KeepEvery, KeepLast,
                       OnSignal)
from .registry import register_adapter
from .rng import RandomState
from .shard import PerRank, Shard
from .tiers import Tier

__all__ = ["Adapter", "AnyOf", "ArraySpec", "CheckpointManager", "EveryNSeconds", "consolidate",
           "EveryNSteps", "EveryOptimal", "KeepAll", "KeepBest", "KeepEvery", "KeepLast",
           "OnSignal", "PerRank", "RNGProvider", "RandomState", "SaveHandle", "Shard", "Tier",
           "__version__", "errors", "load", "manifest", "policies", "register_adapter", "save",
           "verify"]

__all__ += ["convert"]

#: option objects, by the module defining them (imported on first use)
_OPTIONS = {"SaveOptions": "options", "RetentionOptions": "manager_options",
            "AsyncOptions": "manager_options", "IncrementalOptions": "manager_options"}
__all__ += list(_OPTIONS)


def __getattr__(name: str):
    """``uckpt.convert`` (:func:`uckpt.conversion.convert`) and the option objects
    (:class:`uckpt.options.SaveOptions`, :mod:`uckpt.manager_options`) are imported on
    first use, so ``import uckpt`` stays light."""
    if name == "convert":
        from .conversion.api import convert

        globals()["convert"] = convert
        return convert
    if name in _OPTIONS:
        import importlib

        value = getattr(importlib.import_module(f".{_OPTIONS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'uckpt' has no attribute {name!r}")
