"""The PyTorch adapters of uckpt.

The core finds them through two entry points (see :mod:`uckpt.registry`):
``uckpt.adapters: torch = uckpt_torch:ADAPTERS``, consulted in list order when an
object from ``torch`` is saved or loaded, and ``uckpt.rng: torch =
uckpt_torch:RNG_PROVIDERS``, consulted by ``uckpt.RandomState`` once torch is
imported. Like every adapter they never open a file and never know about ranks;
each module's docstring gives its extract / prepare / restore contract.
"""
from .module import ModuleAdapter
from .optim import OptimizerAdapter
from .rng import GeneratorAdapter, TorchRNG
from .sampler import ResumableSampler, SamplerAdapter
from .scaler import GradScalerAdapter
from .sched import SchedulerAdapter
from .tensor import TensorAdapter

# Most specific first; the classes handled are disjoint, so the order only matters
# to third parties that insert their own adapters.
ADAPTERS = [
    ModuleAdapter(),
    OptimizerAdapter(),
    SchedulerAdapter(),
    GradScalerAdapter(),
    GeneratorAdapter(),
    TensorAdapter(),
    SamplerAdapter(),
]
RNG_PROVIDERS = [TorchRNG()]

__all__ = ["ADAPTERS", "RNG_PROVIDERS", "ModuleAdapter", "OptimizerAdapter", "SchedulerAdapter",
           "GradScalerAdapter", "GeneratorAdapter", "TensorAdapter", "TorchRNG",
           "ResumableSampler", "SamplerAdapter"]
