"""Random-number-generator state: Python, NumPy, and every imported framework."""
from __future__ import annotations

import random
import warnings
from typing import Any, Dict

import numpy as np


class RandomState:
    """Put one in the state mapping to capture the global RNG state of this process.

    ``uckpt.save(d, {"model": m, "rng": uckpt.RandomState()})`` records Python's
    ``random`` module, NumPy's global generator and the global generators of
    every framework that is imported and has an adapter (PyTorch CPU and CUDA,
    ...). Loading into a ``RandomState()`` sets them all back. A framework whose
    state is in the checkpoint but which is not imported at load time is skipped
    with a warning.
    """

    def __repr__(self) -> str:
        return "uckpt.RandomState()"


def python_state(rng: "random.Random | None" = None) -> Dict[str, Any]:
    version, internal, gauss_next = (rng or random).getstate()
    return {"version": int(version), "state": np.asarray(internal, dtype=np.uint32),
            "gauss_next": gauss_next}


def set_python_state(tree: Dict[str, Any], rng: "random.Random | None" = None) -> None:
    internal = tuple(int(x) for x in np.asarray(tree["state"]).tolist())
    (rng or random).setstate((int(tree["version"]), internal, tree["gauss_next"]))


def capture_global() -> Dict[str, Any]:
    from .plugins import rng_providers

    out: Dict[str, Any] = {
        "python": python_state(),
        "numpy": np.random.get_state(legacy=False),
    }
    for name, provider in rng_providers().items():
        out[name] = provider.get()
    return out


def restore_global(tree: Dict[str, Any]) -> None:
    from .plugins import rng_providers

    providers = rng_providers()
    for name, sub in tree.items():
        if name == "python":
            set_python_state(sub)
        elif name == "numpy":
            np.random.set_state(_numpy_legacy(sub))
        elif name in providers:
            providers[name].set(sub)
        else:
            warnings.warn(
                f"the checkpoint holds {name!r} random state but {name} is not imported "
                f"(or has no uckpt adapter); that state was not restored. Import {name} "
                "before restoring to restore it.", RuntimeWarning, stacklevel=3)


def _numpy_legacy(state: Dict[str, Any]):
    return (state["bit_generator"], np.asarray(state["state"]["key"], dtype=np.uint32),
            int(state["state"]["pos"]), int(state["has_gauss"]), float(state["gauss"]))
