"""Adapters the core ships: NumPy and Python generators, RandomState, stateful objects."""
from __future__ import annotations

import random
import numpy as np

from .adapter import Adapter
from .rng import RandomState, capture_global, python_state, restore_global, set_python_state


class GlobalRandomAdapter(Adapter):
    name = "uckpt.random_state"
    restore_last = True

    def handles(self, obj):
        return isinstance(obj, RandomState)

    def extract(self, obj):
        return capture_global()

    def restore(self, obj, tree):
        restore_global(tree)


class PythonRandomAdapter(Adapter):
    name = "python.random"

    def handles(self, obj):
        return isinstance(obj, random.Random)

    def extract(self, obj):
        return python_state(obj)

    def restore(self, obj, tree):
        set_python_state(tree, obj)


class NumpyGeneratorAdapter(Adapter):
    """``np.random.Generator``, ``np.random.RandomState`` and bare bit generators."""

    name = "numpy.random"

    def handles(self, obj):
        return isinstance(obj, (np.random.Generator, np.random.RandomState,
                                np.random.BitGenerator))

    @staticmethod
    def _bitgen(obj):
        if isinstance(obj, np.random.Generator):
            return obj.bit_generator
        return obj

    def extract(self, obj):
        if isinstance(obj, np.random.RandomState):
            return obj.get_state(legacy=False)
        return self._bitgen(obj).state

    def restore(self, obj, tree):
        from .errors import StateMismatchError

        want = type(self._bitgen(obj)).__name__ if not isinstance(obj, np.random.RandomState) \
            else "MT19937"
        if tree.get("bit_generator") != want:
            raise StateMismatchError(
                f"checkpoint holds a {tree.get('bit_generator')} generator state, "
                f"the object is a {want}")
        if isinstance(obj, np.random.RandomState):
            obj.set_state(tree)
        else:
            self._bitgen(obj).state = tree


class StatefulAdapter(Adapter):
    """Any object with ``state_dict()`` and ``load_state_dict(sd)`` (the DCP protocol)."""

    name = "stateful"

    def handles(self, obj):
        return callable(getattr(obj, "state_dict", None)) and \
            callable(getattr(obj, "load_state_dict", None))

    def extract(self, obj):
        return obj.state_dict()

    def restore(self, obj, tree):
        obj.load_state_dict(tree)


BUILTIN = [GlobalRandomAdapter(), PythonRandomAdapter(), NumpyGeneratorAdapter(), StatefulAdapter()]
