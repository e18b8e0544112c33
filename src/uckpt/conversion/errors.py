"""Errors and warnings of ``uckpt convert`` / ``uckpt diff``, in uckpt's one hierarchy.

Each is a :class:`~uckpt.errors.UckptError` and a fitting built-in exception,
like every uckpt error.
"""
from __future__ import annotations

from ..errors import NotACheckpointError, UckptError

INSTALL_HINT = "pip install uckpt[convert]"


class UnsafeInputError(UckptError, ValueError):
    """The input asks for something uckpt refuses to do while reading it: run code (a pickle
    global outside the allowlist), follow a link out of the file, unpickle an object array."""


class RefusedGlobalError(UnsafeInputError):
    """A pickle names a global (function or class) that is not on the allowlist.

    ``name`` is the refused global as ``module.qualname``; it was never imported or run.
    """


class UnknownFormatError(NotACheckpointError):
    """The format of a file or directory could not be recognised (or is not a source)."""


class MissingDependencyError(UckptError, ImportError):
    """A format needs an optional package that is not installed."""


class ConvertWarning(UserWarning):
    """Something of the source that the target format cannot hold, or that was changed."""


def missing(package: str, what: str) -> MissingDependencyError:
    return MissingDependencyError(f"{what} needs the {package!r} package, which is not installed",
                                  hint=INSTALL_HINT)
