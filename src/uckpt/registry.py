"""Finding the adapter for an object, without importing frameworks eagerly.

Adapters come from three places, consulted in this order:

1. adapters registered at run time with :func:`register_adapter`;
2. the ``uckpt.adapters`` entry-point group. Each entry point is named after
   the top-level module of the framework it serves (``torch``,
   ``tensorflow``, ...) and points at an :class:`~uckpt.adapter.Adapter`, a
   list of them, or a callable returning either. It is loaded only when an
   object whose class hierarchy comes from that module is handed to uckpt, so
   ``import uckpt`` never imports a framework;
3. the built-in adapters (NumPy and Python random generators,
   :class:`uckpt.RandomState`, and any object with ``state_dict()`` /
   ``load_state_dict()``).
"""
from __future__ import annotations

import threading
from importlib import metadata
from typing import Any, Dict, List, Optional

from .adapter import Adapter, RNGProvider

ADAPTER_GROUP = "uckpt.adapters"
RNG_GROUP = "uckpt.rng"

# Which extra installs an adapter, for the hint in error messages.
INSTALL_HINTS = {
    "torch": "pip install 'uckpt[torch]'",
    "tensorflow": "pip install 'uckpt[tensorflow]'",
    "keras": "pip install 'uckpt[tensorflow]'",
    "chainer": "pip install 'uckpt[chainer]'",
}

_lock = threading.Lock()
_runtime: List[Adapter] = []
_loaded: Dict[str, List[Any]] = {}  # "group:name" -> loaded objects
_eps: Dict[str, Dict[str, metadata.EntryPoint]] = {}


def register_adapter(adapter: Adapter) -> None:
    """Register an adapter for this process; it takes precedence over all others."""
    if not isinstance(adapter, Adapter):
        raise TypeError(f"expected a uckpt.adapter.Adapter, got {type(adapter).__name__}")
    with _lock:
        _runtime.insert(0, adapter)


def _entry_points(group: str) -> Dict[str, metadata.EntryPoint]:
    with _lock:
        if group not in _eps:
            _eps[group] = {ep.name: ep for ep in metadata.entry_points(group=group)}
        return _eps[group]


def _load(group: str, name: str) -> List[Any]:
    key = f"{group}:{name}"
    with _lock:
        if key in _loaded:
            return _loaded[key]
    ep = _entry_points(group).get(name)
    items: List[Any] = []
    if ep is not None:
        obj = ep.load()
        if callable(obj) and not isinstance(obj, (Adapter, RNGProvider)):
            obj = obj()
        items = list(obj) if isinstance(obj, (list, tuple)) else [obj]
    with _lock:
        _loaded[key] = items
    return items


def module_roots(obj: Any) -> List[str]:
    """Top-level modules of every class in ``type(obj).__mro__``."""
    roots: List[str] = []
    for cls in type(obj).__mro__:
        root = (getattr(cls, "__module__", None) or "").split(".")[0]
        if root and root not in roots and root != "builtins":
            roots.append(root)
    return roots


def find_adapter(obj: Any) -> Optional[Adapter]:
    """The adapter that handles ``obj``, or None."""
    for adapter in list(_runtime):
        if adapter.handles(obj):
            return adapter
    eps = _entry_points(ADAPTER_GROUP)
    # an adapter package's own classes (wrappers such as uckpt_tf.OptimizerState) lead
    # to its entry point too
    packages = {ep.value.split(":")[0].split(".")[0]: name for name, ep in eps.items()}
    for root in module_roots(obj):
        name = root if root in eps else packages.get(root)
        if name is not None:
            for adapter in _load(ADAPTER_GROUP, name):
                if adapter.handles(obj):
                    return adapter
    from .builtin_adapters import BUILTIN

    for adapter in BUILTIN:
        if adapter.handles(obj):
            return adapter
    return None


def rng_providers(imported_only: bool = True) -> Dict[str, RNGProvider]:
    """RNG providers of frameworks that are already imported (by name)."""
    import sys

    out: Dict[str, RNGProvider] = {}
    for name in _entry_points(RNG_GROUP):
        if imported_only and sys.modules.get(name) is None:  # None: import blocked
            continue
        try:
            providers = _load(RNG_GROUP, name)
        except ImportError as e:
            import warnings

            warnings.warn(f"uckpt: the random-state provider for {name} cannot be loaded "
                          f"({e}); its state is neither saved nor restored", RuntimeWarning)
            continue
        for provider in providers:
            out[provider.name or name] = provider
    return out


def known_adapter_names() -> List[str]:
    return sorted(_entry_points(ADAPTER_GROUP))
