"""The uckpt error for an OS error that ended a save, a copy or a root's claim.

One mapping for every writer of checkpoints: a full disk (or quota) is a
:class:`~uckpt.errors.StorageFullError`, a read-only or forbidden location a
:class:`~uckpt.errors.StorageAccessError`, any other OS error a
:class:`~uckpt.errors.SaveError`; uckpt's own errors pass through.
"""
from __future__ import annotations

import errno
import os

from . import fsutil
from ..errors import SaveError, StorageAccessError, StorageFullError, UckptError


def save_failure(e: BaseException, doing: str, directory: object,
                 detail: str = "") -> BaseException:
    """The uckpt error to raise for ``e``, which ended ``doing`` (``e`` itself if it is one).
    A full disk names ``directory`` and, for a local one, the bytes still free there."""
    if fsutil.is_enospc(e) and not isinstance(e, UckptError):
        where = str(directory)
        text = f"no space left on the device while {doing}{detail}"
        if where not in text:
            text += f" in {where!r}"
        free = _free_bytes(where)
        if free is not None:
            text += f"; {free} bytes free there"
        return StorageFullError(text, path=where,
                                hint="free space or choose another location; earlier "
                                     "checkpoints are intact")
    if isinstance(e, OSError) and e.errno in (errno.EROFS, errno.EACCES, errno.EPERM) and \
            not isinstance(e, UckptError):
        where = str(e.filename or directory)
        return StorageAccessError(
            f"{doing} failed: {where!r} cannot be written ({os.strerror(e.errno)})",
            path=where, errno=e.errno,
            hint="check that the file system is mounted read-write and that this user may "
                 "write there; earlier checkpoints are intact")
    if isinstance(e, OSError) and not isinstance(e, UckptError):
        return SaveError(f"{doing} failed: {e}", path=str(directory))
    return e


def _free_bytes(where: str) -> "int | None":
    """Bytes free to this user on the file system of ``where`` (a path; its nearest
    existing parent), or None for a URL or where it cannot be told."""
    if "://" in where:
        return None
    path = os.path.abspath(where)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def raise_save_failure(e: BaseException, doing: str, where: object, detail: str = "") -> None:
    """Raise the uckpt error for ``e`` (see :func:`save_failure`), chained to it."""
    err = save_failure(e, doing, where, detail)
    if err is e:
        raise e
    raise err from e

