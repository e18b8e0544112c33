"""Finding the adapter for an object, without importing frameworks eagerly.

Adapters come from three places, consulted in this order:

1. adapters registered at run time with :func:`register_adapter` (the newest
   first; :func:`unregister_adapter` takes one back);
2. the ``uckpt.adapters`` entry-point group. Each entry point is named after
   the top-level module of the framework it serves (``torch``,
   ``tensorflow``, ...) and points at an :class:`~uckpt.adapter.Adapter`, a
   list of them, or a callable returning either. It is loaded only when an
   object whose class hierarchy comes from that module is handed to uckpt, so
   ``import uckpt`` never imports a framework;
3. the built-in adapters (NumPy and Python random generators,
   :class:`uckpt.RandomState`, and any object with ``state_dict()`` /
   ``load_state_dict()``);
4. the entry points of frameworks already imported, for classes of other modules that
   such a framework knows (a dataclass registered as a JAX pytree node).
"""
from __future__ import annotations

import sys
import threading
from typing import Any, List, Optional

from .adapter import Adapter
from .builtin_adapters import BUILTIN
from .errors import UnsupportedObjectError
from .plugins import (ADAPTER_GROUP, RNG_GROUP, _entry_points, _load,  # noqa: F401
                      known_adapter_names, register_rng_provider, rng_providers)

# Which extra installs an adapter, for the hint in error messages.
INSTALL_HINTS = {
    "torch": "pip install 'uckpt[torch]'",
    "tensorflow": "pip install 'uckpt[tensorflow]'",
    "keras": "pip install 'uckpt[tensorflow]'",
    "chainer": "pip install 'uckpt[chainer]'",
    "jax": "pip install 'uckpt[jax]'",
    "jaxlib": "pip install 'uckpt[jax]'",
    "flax": "pip install 'uckpt[jax]'",
    "optax": "pip install 'uckpt[jax]'",
}

_lock = threading.Lock()
_runtime: List[Adapter] = []


def register_adapter(adapter: Adapter) -> None:
    """Register an adapter for this process; it takes precedence over all others."""
    if not isinstance(adapter, Adapter):
        raise TypeError(f"expected a uckpt.adapter.Adapter, got {type(adapter).__name__}")
    with _lock:
        _runtime.insert(0, adapter)


def unregister_adapter(adapter: Adapter) -> None:
    """Undo :func:`register_adapter` (e.g. at the end of a test); unknown adapters are ignored."""
    with _lock:
        if adapter in _runtime:
            _runtime.remove(adapter)


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
    roots = module_roots(obj)
    for root in roots:
        name = root if root in eps else packages.get(root)
        if name is not None:
            for adapter in _load(ADAPTER_GROUP, name):
                if adapter.handles(obj):
                    return adapter
    for adapter in BUILTIN:
        if adapter.handles(obj):
            return adapter
    for name in eps:  # a class of the user's that an imported framework knows (a JAX
        if name not in roots and sys.modules.get(name) is not None:  # pytree node)
            for adapter in _load(ADAPTER_GROUP, name):
                if adapter.handles(obj):
                    return adapter
    return None


def no_adapter_error(obj: Any, path: str, saving: bool) -> UnsupportedObjectError:
    """The error for an object no adapter handles, at ``path`` in the state, with a hint
    saying which adapter to install or how to make the object savable."""
    cls = type(obj)
    name = f"{cls.__module__}.{cls.__qualname__}"
    hint = ("pass arrays, plain values, containers of them, or an object of a supported "
            "framework; give your own classes state_dict()/load_state_dict(), or register "
            "an adapter with uckpt.register_adapter()")
    installed = set(known_adapter_names())
    for root in module_roots(obj):
        if root in installed:
            hint = (f"the {root} adapter is installed but handles no {name}; save the "
                    "object's state (arrays, plain values) instead, or register an adapter "
                    "with uckpt.register_adapter()")
            break
        if root in INSTALL_HINTS:
            hint = f"the {root} adapter is not installed: {INSTALL_HINTS[root]}"
            break
    doing = "save" if saving else "restore"
    return UnsupportedObjectError(
        f"no adapter knows how to {doing} {name} at {path or '<root>'!r}", hint=hint, leaf=path)
