"""Random state: ``tf.random.Generator``, Keras ``SeedGenerator`` and the global generators.

``GeneratorAdapter`` (``tf.random.Generator``): ``extract`` returns
``{"algorithm": int, "state": int64 array}``; ``prepare`` refuses another
algorithm or state size; ``restore`` calls ``generator.reset(state)``, so
functions that captured the generator see the restored state.

``SeedGeneratorAdapter`` (``keras.random.SeedGenerator``, alone; the ones
layers own are saved with their model): ``{"state": array}``, assigned back.

``TensorFlowRNG`` (the ``tensorflow`` :class:`~uckpt.adapter.RNGProvider`,
used by ``uckpt.RandomState()`` once TensorFlow is imported): ``get`` returns
``{"global_generator": {"algorithm", "state"}}`` for
``tf.random.get_global_generator()``, or ``None`` while it has not been
created (it is created on first use; capturing does not create it), plus,
when Keras is imported, ``"keras": {"seed_generator": array or None,
"random_seed": int or None}``: the global ``SeedGenerator`` that
unseeded ``keras.random`` calls draw from and the seed given to
``keras.utils.set_random_seed`` (Keras keeps both per thread: capture and
restore from the training thread). ``set`` restores them in place: the global
generator by ``reset`` (replaced only if there is none or its algorithm
differs; ``None`` removes it again), the Keras
generator by assignment (created with an explicit seed if missing, so that
Python's restored ``random`` state is not consumed; ``None`` removes it, as
``set_random_seed`` does, and Keras re-creates it from ``random`` when needed).

Not capturable: TensorFlow's *stateful* random ops seeded by
``tf.random.set_seed`` (``tf.random.uniform``, ``tf.random.shuffle``, ...),
whose counters live inside op kernels. Use a ``tf.random.Generator``,
stateless ops or Keras ``SeedGenerator``\\ s for randomness that must survive
a restart.
"""
from __future__ import annotations

import sys
import warnings
from typing import Any, Dict

import numpy as np

from uckpt.adapter import Adapter, RNGProvider
from uckpt.errors import StateMismatchError

from .convert import assign, leaf_problem, raise_problems, to_numpy

_KERAS_GENERATOR = "global_seed_generator"  # keras.src.random.seed_generator.GLOBAL_SEED_GENERATOR
_KERAS_SEED = "global_random_seed"          # keras.src.utils.rng_utils.GLOBAL_RANDOM_SEED


def generator_state(gen: Any) -> Dict[str, Any]:
    return {"algorithm": int(gen.algorithm), "state": to_numpy(gen.state)}


def _check_generator(gen: Any, tree: Any) -> None:
    if not isinstance(tree, dict) or tree.get("algorithm") != int(gen.algorithm):
        saved = tree.get("algorithm") if isinstance(tree, dict) else None
        raise StateMismatchError(
            f"the checkpoint holds the state of a tf.random.Generator with algorithm {saved}, "
            f"the generator to restore uses algorithm {int(gen.algorithm)}",
            hint="create the generator with the same algorithm (tf.random.Algorithm)")
    raise_problems("the tf.random.Generator", [leaf_problem("state", gen.state, tree.get("state"))])


class GeneratorAdapter(Adapter):
    name = "tf.random.generator"

    def handles(self, obj):
        tf = sys.modules.get("tensorflow")
        return tf is not None and isinstance(obj, tf.random.Generator)

    def extract(self, obj):
        return generator_state(obj)

    def prepare(self, obj, spec):
        _check_generator(obj, spec)
        return None

    def restore(self, obj, tree):
        _check_generator(obj, tree)
        obj.reset(np.asarray(tree["state"]))


class SeedGeneratorAdapter(Adapter):
    name = "keras.seed_generator"

    def handles(self, obj):
        keras = sys.modules.get("keras")
        return keras is not None and isinstance(obj, keras.random.SeedGenerator)

    def extract(self, obj):
        return {"state": to_numpy(obj.state)}

    def prepare(self, obj, spec):
        self._check(obj, spec)
        return None

    def restore(self, obj, tree):
        self._check(obj, tree)
        assign(obj.state, tree["state"])

    @staticmethod
    def _check(obj, tree):
        leaf = tree.get("state") if isinstance(tree, dict) else tree
        raise_problems(f"the SeedGenerator {obj.name!r}", [leaf_problem("state", obj.state, leaf)])


def _keras_global_state():
    from keras.src.backend.common import global_state

    return global_state


def keras_random_state() -> Dict[str, Any]:
    gs = _keras_global_state()
    gen = gs.get_global_attribute(_KERAS_GENERATOR)
    seed = gs.get_global_attribute(_KERAS_SEED)
    return {"seed_generator": None if gen is None else to_numpy(gen.state),
            "random_seed": None if seed is None else int(seed)}


def set_keras_random_state(tree: Dict[str, Any]) -> None:
    import keras

    gs = _keras_global_state()
    gs.set_global_attribute(_KERAS_SEED, tree.get("random_seed"))
    saved = tree.get("seed_generator")
    if saved is None:
        gs.set_global_attribute(_KERAS_GENERATOR, None)
        return
    gen = gs.get_global_attribute(_KERAS_GENERATOR)
    if gen is None:
        gen = keras.random.SeedGenerator(seed=0, name="seed_generator")
        gs.set_global_attribute(_KERAS_GENERATOR, gen)
    raise_problems("Keras's global SeedGenerator", [leaf_problem("state", gen.state, saved)])
    assign(gen.state, saved)


def _global_generator():
    """TensorFlow's global generator, or None if it was never created (not creating it:
    ``get_global_generator`` would, and refuses to under op determinism)."""
    from tensorflow.python.ops import stateful_random_ops

    return getattr(stateful_random_ops, "global_generator", None)


class TensorFlowRNG(RNGProvider):
    name = "tensorflow"

    def get(self):
        gen = _global_generator()
        out: Dict[str, Any] = {"global_generator": None if gen is None else generator_state(gen)}
        if "keras" in sys.modules:
            out["keras"] = keras_random_state()
        return out

    def set(self, tree):
        import tensorflow as tf

        saved = tree["global_generator"]
        gen = _global_generator()
        if saved is None:
            if gen is not None:
                tf.random.set_global_generator(None)  # not created yet when it was saved
        elif gen is not None and saved["algorithm"] == int(gen.algorithm) and \
                tuple(np.shape(saved["state"])) == tuple(gen.state.shape):
            gen.reset(np.asarray(saved["state"]))
        else:
            tf.random.set_global_generator(
                tf.random.Generator.from_state(np.asarray(saved["state"]), saved["algorithm"]))
        if "keras" in tree:
            if "keras" in sys.modules:
                set_keras_random_state(tree["keras"])
            else:
                warnings.warn("the checkpoint holds Keras's global random state but keras is not "
                              "imported; that state was not restored. Import keras before "
                              "restoring to restore it.", RuntimeWarning, stacklevel=3)
