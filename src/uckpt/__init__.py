"""uckpt: framework-agnostic checkpointing with a neutral, documented on-disk format.

``import uckpt`` imports no deep-learning framework, and only the modules that define
its light names (:mod:`uckpt.errors`, the adapter interface, :class:`Shard` /
:class:`PerRank`). Every other public name — :func:`save`, :func:`load`,
:class:`CheckpointManager`, the policies, :func:`convert`, :func:`open` (a checkpoint
read array by array, :mod:`uckpt.loading.lazy`), the option objects, ... — is imported
from its module on first use (:func:`__getattr__`), so a process pays only for what it
uses. Adapters are loaded when a framework object is handed to :func:`save` or
:func:`load`.
"""
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from . import errors
from ._version import __version__
from .adapter import Adapter, ArraySpec, RNGProvider
from .tree.shard import PerRank, Shard

if TYPE_CHECKING:  # the names imported on first use, for type checkers
    from .api import consolidate, load, manifest, save, verify
    from .conversion.api import convert
    from .loading.lazy import open_checkpoint as open  # noqa: F401 (not in __all__)
    from .loading.report import LoadReport
    from .manager import policies
    from .manager.checkpoint_manager import CheckpointManager
    from .manager.interval import EveryOptimal
    from .manager.options import AsyncOptions, IncrementalOptions, RetentionOptions
    from .manager.policies import (AnyOf, EveryNSeconds, EveryNSteps, KeepAll, KeepBest,
                                   KeepEvery, KeepLast, OnSignal)
    from .manager.tiers import Tier
    from .options import SaveOptions
    from .registry import register_adapter
    from .rng import RandomState
    from .saving.engine import SaveHandle

#: name -> (module relative to this package, attribute in it or None for the module
#: itself), imported on first use
_LAZY: Dict[str, Tuple[str, Optional[str]]] = {
    **{n: ("api", n) for n in ("consolidate", "load", "manifest", "save", "verify")},
    "convert": ("conversion.api", "convert"),
    "open": ("loading.lazy", "open_checkpoint"),
    "LoadReport": ("loading.report", "LoadReport"),
    "policies": ("manager.policies", None),
    "CheckpointManager": ("manager.checkpoint_manager", "CheckpointManager"),
    "EveryOptimal": ("manager.interval", "EveryOptimal"),
    **{n: ("manager.options", n)
       for n in ("AsyncOptions", "IncrementalOptions", "RetentionOptions")},
    **{n: ("manager.policies", n)
       for n in ("AnyOf", "EveryNSeconds", "EveryNSteps", "KeepAll", "KeepBest", "KeepEvery",
                 "KeepLast", "OnSignal")},
    "Tier": ("manager.tiers", "Tier"),
    "SaveOptions": ("options", "SaveOptions"),
    "register_adapter": ("registry", "register_adapter"),
    "RandomState": ("rng", "RandomState"),
    "SaveHandle": ("saving.engine", "SaveHandle"),
}

# (`open` is not in __all__: a star import would hide the built-in open)
__all__ = ["Adapter", "AnyOf", "ArraySpec", "AsyncOptions", "CheckpointManager",
           "EveryNSeconds", "EveryNSteps", "EveryOptimal", "IncrementalOptions", "KeepAll",
           "KeepBest", "KeepEvery", "KeepLast", "LoadReport", "OnSignal", "PerRank",
           "RNGProvider", "RandomState", "RetentionOptions", "SaveHandle", "SaveOptions",
           "Shard", "Tier", "__version__", "consolidate", "convert", "errors", "load",
           "manifest", "policies", "register_adapter", "save", "verify"]

def __getattr__(name: str) -> Any:
    """The names of ``_LAZY``, imported from their module on first use (then cached in
    this module), so ``import uckpt`` stays light."""
    if name not in _LAZY:
        raise AttributeError(f"module 'uckpt' has no attribute {name!r}")
    import importlib

    module, attribute = _LAZY[name]
    value = importlib.import_module(f".{module}", __name__)
    if attribute is not None:
        value = getattr(value, attribute)
    globals()[name] = value
    return value


def __dir__() -> List[str]:
    """The module's names, those not yet imported included."""
    return sorted(set(globals()) | set(_LAZY))
