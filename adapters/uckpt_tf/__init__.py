"""TensorFlow / Keras adapter for uckpt (work in progress)."""
ADAPTERS = []
RNG_PROVIDERS = []
