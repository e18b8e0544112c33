"""Conversion between checkpoint formats: NPZ, Pickle (torch.save), HDF5, safetensors, uckpt,
and PyTorch DCP as a source (``uckpt convert``, ``uckpt diff``, :func:`uckpt.convert`).

See docs/convert.md. Nothing here imports torch, TensorFlow or Chainer; h5py is
imported only for HDF5 files.
"""
from .api import Report, convert, open_checkpoint
from .diff import diff
from .errors import (ConvertWarning, KerasLayoutError, LimitExceededError,
                     MissingDependencyError, RefusedGlobalError, UnknownFormatError,
                     UnsafeInputError, UnsafeNameError)
from .limits import Limits

__all__ = ["ConvertWarning", "KerasLayoutError", "LimitExceededError", "Limits",
           "MissingDependencyError", "RefusedGlobalError", "Report", "UnknownFormatError",
           "UnsafeInputError", "UnsafeNameError", "convert", "diff", "open_checkpoint"]
