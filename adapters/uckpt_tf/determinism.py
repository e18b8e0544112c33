"""What a TensorFlow process needs for a resumed run to match an uninterrupted one bitwise.

``make_deterministic(seed, threads=1)`` is to be called at the start of every
process of a run (the first and each resumed one), before TensorFlow runs any
op. It does what docs/frameworks/tensorflow.md lists:

* ``keras.utils.set_random_seed(seed)`` (Python, NumPy, ``tf.random.set_seed``
  and Keras's global seed generator; without Keras, the first three): the
  initial weights and the seeds of layers' ``SeedGenerator``\\ s of a fresh run;
  a resumed run gets every generator back from the checkpoint, but ops traced
  with op-level seeds (e.g. Keras's own ``shuffle=True``) need the same global
  seed in every process;
* ``tf.config.experimental.enable_op_determinism()``: kernels with a fixed
  reduction order (and an error for ops that have none);
* ``tf.random.set_global_generator(tf.random.Generator.from_seed(seed))``:
  under op determinism TensorFlow refuses to create its global generator from
  a non-deterministic seed;
* with ``threads``, the same intra- and inter-op thread counts in every
  process, since CPU kernels split reductions by thread count. One thread also
  makes the losses identical on machines with different numbers of cores.
"""
from __future__ import annotations

import random
import sys
import warnings
from typing import Optional


def make_deterministic(seed: int, threads: Optional[int] = 1) -> None:
    import numpy as np
    import tensorflow as tf

    if threads is not None:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(threads)
        except RuntimeError as e:  # TensorFlow already initialized its thread pools
            warnings.warn(f"uckpt_tf.make_deterministic: could not set the thread counts ({e}); "
                          "call it before TensorFlow runs any op", RuntimeWarning, stacklevel=2)
    tf.config.experimental.enable_op_determinism()
    tf.random.set_global_generator(tf.random.Generator.from_seed(seed))
    if "keras" in sys.modules or _has_keras():
        import keras

        keras.utils.set_random_seed(seed)
    else:
        random.seed(seed)
        np.random.seed(seed)
        tf.random.set_seed(seed)


def _has_keras() -> bool:
    import importlib.util

    return importlib.util.find_spec("keras") is not None
