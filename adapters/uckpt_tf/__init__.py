"""The TensorFlow / Keras 3 / tf_keras (Keras 2) adapters of uckpt.

The core finds them through entry points (see :mod:`uckpt.registry`):
``uckpt.adapters: tensorflow = keras = tf_keras = uckpt_tf:ADAPTERS``, consulted
in list order when an object from ``tensorflow``, ``keras`` or ``tf_keras`` is
saved or loaded (tf_keras specifics: :mod:`uckpt_tf.keras2`), and
``uckpt.rng: tensorflow = uckpt_tf:RNG_PROVIDERS``, consulted by
``uckpt.RandomState()`` once TensorFlow is imported. Importing this package
imports neither framework: each adapter checks ``sys.modules`` in
``handles``, so an object can only match once its framework is loaded. Like
every adapter they never open a file and never know about ranks; each
module's docstring gives its extract / prepare / restore contract.

Also here: :class:`OptimizerState` (an optimizer with what it trains, for a
custom loop), :func:`epoch_shuffled` (a data order that needs no saving),
:func:`make_deterministic`, and the Keras callback (``uckpt.keras.Checkpoint``,
in :mod:`uckpt_tf.callback`, which imports Keras). See
docs/frameworks/tensorflow.md.
"""
from .data import IteratorAdapter, epoch_shuffled
from .determinism import make_deterministic
from .layers import LayerAdapter, layer_variables
from .optim import OptimizerAdapter, OptimizerState, optimizer_variables
from .rng import GeneratorAdapter, SeedGeneratorAdapter, TensorFlowRNG
from .variables import ModuleAdapter, VariableAdapter, module_variables

# The classes handled are disjoint except that a tf.Module adapter would also take
# what the more specific ones handle, so it comes last.
ADAPTERS = [
    LayerAdapter(),
    OptimizerAdapter(),
    SeedGeneratorAdapter(),
    GeneratorAdapter(),
    IteratorAdapter(),
    VariableAdapter(),
    ModuleAdapter(),
]
RNG_PROVIDERS = [TensorFlowRNG()]

__all__ = ["ADAPTERS", "RNG_PROVIDERS", "GeneratorAdapter", "IteratorAdapter", "LayerAdapter",
           "ModuleAdapter", "OptimizerAdapter", "OptimizerState", "SeedGeneratorAdapter",
           "TensorFlowRNG", "VariableAdapter", "epoch_shuffled", "layer_variables",
           "make_deterministic", "module_variables", "optimizer_variables"]
