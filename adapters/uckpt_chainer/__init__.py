"""The Chainer adapters of uckpt.

Importing this package makes Chainer 7.8.1 importable under NumPy 2
(:mod:`.compat`) and imports neither Chainer nor CuPy: under NumPy 2, import
it (or ``uckpt.chainer``) before ``chainer``.

The core finds the adapters through two entry points (see
:mod:`uckpt.registry`): ``uckpt.adapters: chainer = uckpt_chainer:ADAPTERS``,
loaded when an object from ``chainer`` is saved or loaded (it imports Chainer
then), and ``uckpt.rng: cupy = uckpt_chainer:RNG_PROVIDERS``, consulted by
``uckpt.RandomState`` once CuPy is imported (empty where CuPy is not
installed). Like every adapter they never open a file and never know about
ranks; each module's docstring gives its extract / prepare / restore contract.

Trainer integration: :func:`snapshot` (a replacement for
``chainer.training.extensions.snapshot``) and :func:`resume`, in
:mod:`.extension`, also available as ``uckpt.chainer``.
"""
from . import compat
from .rng import CupyRNG, cupy_installed

compat.apply()

RNG_PROVIDERS = [CupyRNG()] if cupy_installed() else []

# Loaded on first use, so that importing this package does not import Chainer.
_LAZY = {
    "LinkAdapter": ".link", "OptimizerAdapter": ".optim", "TrainerAdapter": ".training",
    "UpdaterAdapter": ".training", "SerializableAdapter": ".generic",
    "VariableAdapter": ".variable", "snapshot": ".extension", "resume": ".extension",
    "Snapshot": ".extension", "checkpoint_state": ".extension",
}


def _adapters():
    from .generic import SerializableAdapter
    from .link import LinkAdapter
    from .optim import OptimizerAdapter
    from .training import TrainerAdapter, UpdaterAdapter
    from .variable import VariableAdapter

    # Most specific first: a trainer, updater, optimizer or link also has serialize().
    return [TrainerAdapter(), UpdaterAdapter(), OptimizerAdapter(), LinkAdapter(),
            VariableAdapter(), SerializableAdapter()]


def __getattr__(name):
    if name == "ADAPTERS":
        value = _adapters()
    elif name in _LAZY:
        from importlib import import_module

        value = getattr(import_module(_LAZY[name], __name__), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


__all__ = ["ADAPTERS", "RNG_PROVIDERS", "CupyRNG", "LinkAdapter", "OptimizerAdapter",
           "TrainerAdapter", "UpdaterAdapter", "SerializableAdapter", "VariableAdapter",
           "Snapshot", "snapshot", "resume", "checkpoint_state", "compat"]
