"""Errors and warnings of ``uckpt convert`` / ``uckpt diff``, in uckpt's one hierarchy.

Each is a :class:`~uckpt.errors.UckptError` and a fitting built-in exception,
like every uckpt error.
"""
from __future__ import annotations

import importlib
from typing import Any

from ..errors import NotACheckpointError, UckptError

INSTALL_HINT = "pip install 'uckpt[convert]'"  # quoted: zsh expands [...] unquoted


class UnsafeInputError(UckptError, ValueError):
    """The input asks for something uckpt refuses to do while reading it: run code (a pickle
    global outside the allowlist), follow a link out of the file, unpickle an object array."""


class RefusedGlobalError(UnsafeInputError):
    """A pickle names a global (function or class) that is not on the allowlist.

    ``name`` is the refused global as ``module.qualname``; it was never imported or run.
    """


class UnsafeNameError(UnsafeInputError):
    """A name of the input (an NPZ member, a safetensors key, a dict key) would become an
    unsafe name in the output (a zip member or HDF5 path with ``..``, ``.`` or empty
    components, an absolute path, a backslash, NUL or another control character).

    ``name`` is the offending name, as the input spells it.
    """


class LimitExceededError(UnsafeInputError):
    """The input asks for more work or memory than uckpt's limits on hostile input allow
    (tree nodes after shared references are expanded, nesting depth, bytes produced per
    stored byte). ``limit`` names the limit; the message says how to raise it when the
    input is legitimate (docs/convert.md, "Limits on hostile input")."""


class InvalidLimitError(UckptError, ValueError):
    """A limit on hostile input was set to something that is not a positive integer
    (``Limits(...)``, ``UCKPT_CONVERT_MAX_NODES``, ``UCKPT_CONVERT_MAX_RATIO``)."""


class KerasLayoutError(UckptError, ValueError):
    """A Keras tree would be written where Keras cannot read it: a model's weights to an
    HDF5 name other than ``*.weights.h5`` (Keras 3 reads its own layout only from such a
    name), or a legacy Keras ``.h5`` to a ``.keras`` / ``.weights.h5`` target (only Keras
    can map a legacy file's names and model config to those)."""


class UnknownFormatError(NotACheckpointError):
    """The format of a file or directory could not be recognised (or is not a source)."""


class MissingDependencyError(UckptError, ImportError):
    """A format needs an optional package that is not installed."""


class ConvertWarning(UserWarning):
    """Something of the source that the target format cannot hold, or that was changed."""


def importable(module: str, what: str, hint: str) -> Any:
    """The module ``module``, or :class:`MissingDependencyError` saying that ``what`` needs
    it (``what``: "reading ... needs TensorFlow") and how to install it (``hint``)."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingDependencyError(f"{what}, which cannot be imported ({e})",
                                     hint=hint) from None


def missing(package: str, what: str) -> MissingDependencyError:
    return MissingDependencyError(f"{what} needs the {package!r} package, which is not installed",
                                  hint=INSTALL_HINT)
