"""Names that travel from an input into an output, checked so none can do harm there.

An NPZ member name or a safetensors key is split on ``/`` into a path; a dict key of
any input becomes a component of a zip member name (NPZ output) or an HDF5 path
(HDF5 output). A name is refused (:class:`~.errors.UnsafeNameError`, naming it) when a
component is empty, ``.`` or ``..``, or the name holds a backslash, a NUL or another
control character, or starts like an absolute or drive path (``/x``, ``C:x``): an
archive tool extracting the output could write outside its directory, a Windows tool
would split it differently, a terminal would show it falsely. Nothing is renamed:
a renamed entry would silently no longer match the framework's state dict.
"""
from __future__ import annotations

import re
from typing import Iterable, Optional

from .errors import UnsafeNameError

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_DRIVE = re.compile(r"^[A-Za-z]:")


def problem(name: str) -> Optional[str]:
    """What makes ``name`` (components joined by ``/``) unsafe as a path; None if nothing."""
    if not isinstance(name, str):
        return f"it is a {type(name).__name__}, not a string"
    if name == "":
        return "it is empty"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "it is not valid Unicode (an unpaired surrogate)"
    if _CONTROL.search(name):
        return "it holds a NUL or another control character"
    if "\\" in name:
        return "it holds a backslash (a path separator on Windows)"
    if name.startswith("/"):
        return "it is an absolute path"
    if _DRIVE.match(name):
        return "it starts with a drive letter"
    for part in name.split("/"):
        if part == "":
            return "it has an empty component (a doubled or trailing '/')"
        if part in (".", ".."):
            return f"it has a {part!r} component"
    return None


def check(name: str, where: str, what: str, hint: str, shown: Optional[str] = None) -> None:
    """Refuse an unsafe name of the input: ``what`` says what it is (``zip member``), shown
    as ``shown`` (default: the name itself)."""
    why = problem(name)
    if why is not None:
        shown = name if shown is None else shown
        raise UnsafeNameError(f"{where}: {what} {shown!r} cannot be used as a name: {why}",
                              path=where, name=shown, hint=hint)


def check_output(names: Iterable[str], fmt: str, what: str) -> None:
    """Refuse entry names (uckpt paths: escaped components joined by ``/``) that would be
    unsafe as ``what`` (zip member names, HDF5 paths) of a ``fmt`` output."""
    for name in names:
        why = problem(name)
        if why is not None:
            raise UnsafeNameError(
                f"{name!r} cannot be written as {what} of {fmt}: {why}", name=name, leaf=name,
                hint="rename the key in the source (e.g. load it, rename, save), or convert "
                     "to a format that does not use names as paths (pickle, safetensors, uckpt)")
