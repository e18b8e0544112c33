"""uckpt: framework-agnostic checkpointing with a neutral, documented on-disk format.

``import uckpt`` imports no deep-learning framework; adapters are loaded when a
framework object is handed to :func:`save` or :func:`load`.
"""
from . import errors
from ._version import __version__
from .adapter import Adapter, ArraySpec, RNGProvider
from .api import load, manifest, save, verify
from .manager import CheckpointManager
from .registry import register_adapter
from .rng import RandomState

__all__ = ["Adapter", "ArraySpec", "CheckpointManager", "RNGProvider", "RandomState",
           "__version__", "errors", "load", "manifest", "register_adapter", "save", "verify"]
