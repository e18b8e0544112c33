"""Writing an output atomically: a temporary name beside it, fsync, rename.

A failure or Ctrl-C at any point removes the temporary file or directory; the
destination either does not change or is complete. An existing destination is
replaced only when asked (``force``): files with ``rename`` (atomic), uckpt
checkpoints with uckpt's own commit (an atomic exchange). Without ``force``, a
file is put in place with ``link``, which fails rather than replace one that
appeared meanwhile.
"""
from __future__ import annotations

import errno
import os
import secrets
from pathlib import Path
from typing import Callable

from .. import fsutil
from ..leases import TMP_MARK
from ..storage.local import check_target, publish
from ..errors import CheckpointExistsError
from ..format import MANIFEST_NAME

HINT = "pass --force (force=True) to replace it, or choose another name"


def check_output(dst: Path, directory: bool, force: bool) -> None:
    """Refuse early what must not be replaced."""
    if directory:
        if (dst / MANIFEST_NAME).exists() and not force:
            raise CheckpointExistsError(f"{str(dst)!r} already holds a committed checkpoint",
                                        path=str(dst), hint=HINT)
        check_target(dst, force)  # a file, or a directory that is not a checkpoint
        return
    if dst.is_dir():
        raise CheckpointExistsError(f"{str(dst)!r} is a directory; refusing to replace it with "
                                    "a file", path=str(dst))
    if (dst.exists() or dst.is_symlink()) and not force:
        raise CheckpointExistsError(f"{str(dst)!r} already exists", path=str(dst), hint=HINT)


def write_atomically(dst, directory: bool, force: bool, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp)`` (a new empty directory, or a file name to create) and put the
    result in place as ``dst``; returns ``dst``."""
    dst = Path(dst).absolute()
    check_output(dst, directory, force)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.parent / f".{dst.name}{TMP_MARK}{secrets.token_hex(4)}"
    try:
        if directory:
            tmp.mkdir()
            write(tmp)
            publish(tmp, dst, force)
        else:
            write(tmp)
            _fsync(tmp)
            _place(tmp, dst, force)
            fsutil.fsync_dir(dst.parent)
    except BaseException:
        if tmp.is_dir() and not tmp.is_symlink():
            fsutil.remove_tree(tmp)
        elif tmp.exists():
            tmp.unlink()
        raise
    return dst


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _place(tmp: Path, dst: Path, force: bool) -> None:
    if force:
        os.replace(tmp, dst)
        return
    try:
        os.link(tmp, dst)  # never replaces: fails if dst appeared meanwhile
    except FileExistsError:
        raise CheckpointExistsError(f"{str(dst)!r} was created by someone else during the "
                                    "conversion", path=str(dst), hint=HINT) from None
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EXDEV, errno.ENOTSUP, errno.EOPNOTSUPP,
                           errno.EMLINK):
            raise
        check_output(dst, False, False)
        os.rename(tmp, dst)
        return
    tmp.unlink()
