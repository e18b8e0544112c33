"""A worked example for docs/adapters.md: an adapter for a small estimator class.

``SGDRegressor`` stands in for a framework's object: a linear model fitted by
stochastic gradient descent, with weights (float32), a bias (float64), a step
counter and its own NumPy generator. Before its first ``partial_fit`` it has no
weights at all ("unbuilt"), as a Keras model before it is built or an optimizer
before its first step.

``SGDRegressorAdapter`` is the whole adapter: ``handles``, ``extract``, ``prepare``
(validate before anything changes; give the core the object's own arrays to read
into) and ``restore``. ``ExampleRNG`` captures this module's global generator
(``default_rng``, which estimators created without a seed draw from) for
``uckpt.RandomState()``. tests/test_conformance.py runs uckpt's conformance suite on the
adapter and a round trip through the provider.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

from uckpt.adapter import Adapter, ArraySpec, RNGProvider, check_class, class_name
from uckpt.dtypes import name_of
from uckpt.errors import KeyMismatchError, ShapeMismatchError


#: the framework's global generator, as ``torch``'s or NumPy's global one
default_rng = np.random.default_rng(0)


class SGDRegressor:
    """``y = x @ weights + bias``, fitted one batch at a time."""

    def __init__(self, n_features: int, lr: float = 0.01, seed: Optional[int] = 0) -> None:
        self.n_features = n_features
        self.lr = lr
        self.weights: Optional[np.ndarray] = None  # float32 [n_features], after the first fit
        self.bias: Optional[np.ndarray] = None     # float64 [], after the first fit
        self.steps = 0
        self.rng = np.random.default_rng(seed if seed is not None else default_rng.integers(1 << 62))

    def partial_fit(self, x: np.ndarray, y: np.ndarray) -> None:
        if self.weights is None:  # built on first use, from the generator
            self.weights = self.rng.normal(size=self.n_features).astype(np.float32)
            self.bias = np.zeros((), np.float64)
        noise = self.rng.normal(scale=1e-3, size=self.n_features).astype(np.float32)
        error = x @ self.weights + self.bias - y
        self.weights -= (self.lr * (x.T @ error) / len(y)).astype(np.float32) + noise
        self.bias -= self.lr * error.mean()
        self.steps += 1


class SGDRegressorAdapter(Adapter):
    """The state of an :class:`SGDRegressor`: arrays, plain values, the generator's state."""

    name = "example.sgd_regressor"  # recorded in the manifest next to the subtree

    def handles(self, obj: Any) -> bool:
        return isinstance(obj, SGDRegressor)

    def extract(self, obj: SGDRegressor) -> Dict[str, Any]:
        # arrays may be the object's own memory: the core copies them before save returns
        return {"class": class_name(obj), "n_features": obj.n_features, "lr": obj.lr,
                "steps": obj.steps, "weights": obj.weights, "bias": obj.bias,
                "rng": obj.rng.bit_generator.state}

    def prepare(self, obj: SGDRegressor, spec: Dict[str, Any]) -> Dict[str, Any]:
        # nothing is read yet: refuse what does not fit, before anything changes
        check_class(obj, spec, "estimator")
        missing = [k for k in ("weights", "bias", "steps", "rng") if k not in spec]
        if missing:
            raise KeyMismatchError("estimator state", missing=missing)
        weights = spec["weights"]
        if isinstance(weights, ArraySpec) and weights.shape != (obj.n_features,):
            raise ShapeMismatchError(
                f"the checkpoint holds {weights.shape[0]} weights, the estimator has "
                f"{obj.n_features} features", hint="create the estimator with the saved "
                "n_features before loading")
        # read straight into the object's own weights when they exist and fit exactly
        target = obj.weights
        if target is not None and isinstance(weights, ArraySpec) and \
                name_of(target.dtype) == weights.dtype and target.flags.c_contiguous:
            return {"weights": target}
        return {}

    def restore(self, obj: SGDRegressor, tree: Dict[str, Any]) -> None:
        # the arrays are ours now: keep them (the weights may already be obj's own)
        obj.weights = tree["weights"]
        obj.bias = tree["bias"]
        obj.steps = tree["steps"]
        obj.lr = tree["lr"]
        obj.rng.bit_generator.state = tree["rng"]


class ExampleRNG(RNGProvider):
    """The global random state of this "framework": registered under the name of its
    top-level module, consulted by ``uckpt.RandomState()`` while that module is imported."""

    name = "estimator_adapter"  # the key of this state in the RandomState subtree

    def get(self) -> Dict[str, Any]:
        return default_rng.bit_generator.state

    def set(self, tree: Dict[str, Any]) -> None:
        default_rng.bit_generator.state = tree
