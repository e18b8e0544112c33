"""CuPy's global random generators, for ``uckpt.RandomState()`` (the ``cupy`` provider).

Chainer on a GPU draws from CuPy's global generators (``F.dropout`` without
cuDNN, the initializers of parameters on the GPU, ``cupy.random``): one
``cupy.random.RandomState`` per device, each a cuRAND generator. cuRAND does
not let anyone read a generator's position, so the state cannot be copied
out as NumPy's can. ``get`` therefore draws a 63-bit seed from each device's
generator, re-seeds that generator with it and records ``{device id:
{"method": cuRAND method, "seed": seed}}``; ``set`` re-seeds each device's
generator (of the same method) with the recorded seed. A run resumed from a
checkpoint then draws exactly what the uninterrupted run drew after saving it.
The price: saving changes the stream that follows (deterministically), so runs
are comparable bit for bit when they save at the same steps.

Only devices whose generator exists are recorded. This module imports CuPy
only inside ``get`` and ``set``, which the core calls only when ``cupy`` is
already imported; ``RNG_PROVIDERS`` is empty where CuPy is not installed.
"""
from __future__ import annotations

import importlib.util
import warnings
from typing import Any, Dict

import numpy as np

from uckpt.adapter import RNGProvider


def cupy_installed() -> bool:
    try:
        return importlib.util.find_spec("cupy") is not None
    except (ImportError, ValueError):
        return False


def _generators(cupy) -> Dict[int, Any]:
    """Device id -> CuPy's global RandomState of that device, for those created so far."""
    module = getattr(cupy.random, "_generator", None)
    states = getattr(module, "_random_states", None)
    if isinstance(states, dict):
        return {int(k): v for k, v in states.items()}
    return {int(cupy.cuda.Device().id): cupy.random.get_random_state()}


class CupyRNG(RNGProvider):
    name = "cupy"

    def get(self):
        import cupy

        out = {}
        for device, generator in sorted(_generators(cupy).items()):
            with cupy.cuda.Device(device):
                seed = int(generator.tomaxint())  # 63 bits from the generator's own stream
                generator.seed(np.uint64(seed))
            out[str(device)] = {"method": int(generator.method), "seed": seed}
        return out

    def set(self, tree):
        import cupy

        have = cupy.cuda.runtime.getDeviceCount()
        skipped = []
        for device, entry in sorted(tree.items()):
            index = int(device)
            if index >= have:
                skipped.append(index)
                continue
            with cupy.cuda.Device(index):
                generator = cupy.random.get_random_state()
                if int(generator.method) != int(entry["method"]):
                    generator = cupy.random.RandomState(method=int(entry["method"]))
                    cupy.random.set_random_state(generator)
                generator.seed(np.uint64(int(entry["seed"])))
        if skipped:
            warnings.warn(
                f"the checkpoint holds CuPy random state for device(s) {skipped} but "
                f"{have} device(s) are available; their state was not restored",
                RuntimeWarning, stacklevel=2)
