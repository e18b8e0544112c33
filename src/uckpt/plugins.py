"""Entry points of adapter packages, loaded only when needed.

Two groups: ``uckpt.adapters`` (adapters, found by :mod:`uckpt.registry`) and
``uckpt.rng`` (:class:`~uckpt.adapter.RNGProvider` objects, the global random
state of a framework, captured by :class:`uckpt.RandomState`). Each entry point is
named after the top-level module of the framework it serves and points at an
object, a list of them, or a callable returning either. Providers registered at run
time with :func:`register_rng_provider` (tests, packages not installed) come first.
"""
from __future__ import annotations

import sys
import threading
import warnings
from typing import TYPE_CHECKING, Any, Dict, List

from .adapter import Adapter, RNGProvider

if TYPE_CHECKING:
    from importlib import metadata

ADAPTER_GROUP = "uckpt.adapters"
RNG_GROUP = "uckpt.rng"

_lock = threading.Lock()
_loaded: Dict[str, List[Any]] = {}  # "group:name" -> loaded objects
_eps: Dict[str, Dict[str, metadata.EntryPoint]] = {}
_runtime_rng: Dict[str, RNGProvider] = {}  # module name -> provider


def _entry_points(group: str) -> Dict[str, metadata.EntryPoint]:
    with _lock:
        if group not in _eps:
            from importlib import metadata  # slow to import: kept out of `import uckpt`

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


def register_rng_provider(module: str, provider: RNGProvider) -> None:
    """Register ``provider`` for this process as the random state of the framework whose
    top-level module is ``module`` (consulted while that module is imported), ahead of
    the ``uckpt.rng`` entry points. ``provider=None`` takes a registration back."""
    if provider is not None and not isinstance(provider, RNGProvider):
        raise TypeError(f"expected a uckpt.adapter.RNGProvider, got {type(provider).__name__}")
    with _lock:
        if provider is None:
            _runtime_rng.pop(module, None)
        else:
            _runtime_rng[module] = provider


def rng_providers(imported_only: bool = True) -> Dict[str, RNGProvider]:
    """RNG providers of frameworks that are already imported (by name)."""
    out: Dict[str, RNGProvider] = {}
    for name in _entry_points(RNG_GROUP):
        if imported_only and sys.modules.get(name) is None:  # None: import blocked
            continue
        try:
            providers = _load(RNG_GROUP, name)
        except ImportError as e:
            warnings.warn(f"uckpt: the random-state provider for {name} cannot be loaded "
                          f"({e}); its state is neither saved nor restored", RuntimeWarning,
                          stacklevel=2)
            continue
        for provider in providers:
            out[provider.name or name] = provider
    with _lock:
        runtime = dict(_runtime_rng)
    for name, provider in runtime.items():
        if not imported_only or sys.modules.get(name) is not None:
            out[provider.name or name] = provider
    return out


def known_adapter_names() -> List[str]:
    return sorted(_entry_points(ADAPTER_GROUP))
