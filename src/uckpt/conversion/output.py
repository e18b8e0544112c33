"""Writing an output atomically: a temporary name beside it, fsync, rename; a uckpt
checkpoint through its store's sink and commit, as :func:`uckpt.save` writes one.

A failure or Ctrl-C at any point removes the temporary file or directory (or the
sink's objects); the destination either does not change or is complete. An existing
destination is replaced only when asked (``force``): files with ``rename`` (atomic),
uckpt checkpoints with their store's commit (an atomic exchange on a local disk, the
manifest written last in an object store). Without ``force``, a file is put in place
with ``link``, which fails rather than replace one that appeared meanwhile.
"""
from __future__ import annotations

import errno
import os
import secrets
from pathlib import Path
from typing import Callable, Mapping, Optional, Union

from ..storage import fsutil
from ..storage.checkpoint.names import OLD_MARK, TMP_MARK
from ..errors import CheckpointExistsError
from ..storage import CheckpointSink, locate

HINT = "pass --force (force=True) to replace it, or choose another name"


def check_checkpoint(dst, force: bool, storage_options: Optional[Mapping] = None) -> None:
    """Refuse early to replace what must not be: a committed checkpoint (unless ``force``),
    a file, a directory that is neither empty nor a checkpoint."""
    store, name = locate(dst, storage_options)
    if not force and store.has(name):
        where = str(store.location(name))
        raise CheckpointExistsError(f"{where!r} already holds a committed checkpoint",
                                    path=where, hint=HINT)
    store.check_target(name, force)


def write_checkpoint(dst, force: bool, storage_options: Optional[Mapping],
                     write: Callable[[CheckpointSink], bytes]) -> Union[Path, str]:
    """Open a sink for checkpoint ``dst`` (a path or URL) on its store, call ``write(sink)``
    (it writes the data files and returns the manifest's bytes) and commit; returns the
    checkpoint's location. Any failure (Ctrl-C included) removes what was written."""
    store, name = locate(dst, storage_options)
    sink = store.sink(name, overwrite=force)
    try:
        sink.commit(write(sink), overwrite=force)
    except BaseException:
        sink.abort()
        raise
    sink.release()
    location: Union[Path, str] = store.location(name)
    return location

def check_output(dst: Path, directory: bool, force: bool) -> None:
    """Refuse early what must not be replaced."""
    if directory:
        check_checkpoint(dst, force)  # a file, or a directory that is not empty
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
            _place_dir(tmp, dst, force)
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


def _place_dir(tmp: Path, dst: Path, force: bool) -> None:
    """Rename directory ``tmp`` to ``dst`` (onto nothing or an empty directory; with
    ``force``, swapped with what is there, which is then removed); fsync the parent."""
    try:
        os.rename(tmp, dst)
    except OSError as e:
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        if not force:
            raise CheckpointExistsError(f"{str(dst)!r} was created by someone else during the "
                                        "conversion", path=str(dst), hint=HINT) from None
        if not fsutil.exchange(tmp, dst):
            old = dst.parent / f".{dst.name}{OLD_MARK}{secrets.token_hex(4)}"
            os.rename(dst, old)
            os.rename(tmp, dst)
            tmp = old
        fsutil.remove_tree(tmp)  # now holds what was replaced
    fsutil.fsync_dir(dst.parent)


def place(tmp: Path, dst: Path, force: bool) -> None:
    """fsync the file ``tmp`` and put it in place as ``dst``, as :func:`write_atomically`
    does (replacing ``dst`` only with ``force``); the caller fsyncs the directory."""
    _fsync(tmp)
    _place(tmp, dst, force)


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
