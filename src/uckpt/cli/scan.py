"""Find the checkpoints under a root directory and classify them, without reading data.

Unlike :class:`~uckpt.CheckpointManager`, scanning never creates, removes or
renames anything: it is safe on a root another process is saving into.

A child directory of the root is
  * ``committed``: it holds a manifest that parses and validates, and every data
    file the manifest lists exists at its recorded size;
  * ``damaged``: it is named like a step (``step_00000042``) or holds a
    ``manifest.json``, but the manifest is missing, invalid or not a regular file,
    or a data file is missing, short, too long or not a regular file (``reason``
    says which);
    a symlink named like a checkpoint is listed as damaged too, and not followed;
  * ``incomplete``: the temporary directory of a save that is in progress or
    was interrupted (``.step_00000042.uckpt-tmp-1a2b3c4d``);
  * ``stale``: a checkpoint being deleted or replaced, left by an interrupted
    retention (``.uckpt-del-``) or overwrite (``.uckpt-old-``).
Other entries are ignored. Nothing is ever read through a symlink below the root
(the root itself may be one) and nothing is opened that could block (a FIFO).

A checkpoint that the root's writer deletes (retention) or replaces while it is
examined is not damaged: it is gone, and not listed, as ``CheckpointManager.restore``
treats it (:func:`gone`).
"""
from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import List, Optional

from ..leases import DEL_MARK, OLD_MARK, TMP_MARK
from ..errors import CheckpointNotFoundError, NotACheckpointError, UckptError
from ..format import MANIFEST_NAME
from ..fsutil import kind_of, link_kind, open_dir, stat_regular
from ..reader import manifest_at
from ..storage import is_remote
from .found import (COMMITTED, DAMAGED, INCOMPLETE, STALE, Found, order_found,  # noqa: F401
                    size_reason)

_STEP = re.compile(r"^step_(\d+)$")
_HIDDEN = re.compile(r"^\.(?P<name>.+?)(?P<mark>%s|%s|%s)[0-9A-Za-z]+$"
                     % (re.escape(TMP_MARK), re.escape(OLD_MARK), re.escape(DEL_MARK)))


def scan(root, storage_options=None) -> List[Found]:
    """The checkpoints under ``root`` by step (unnumbered last); ``root`` itself if it is one.

    ``root`` may be reached through a symlink (it was given); entries under it are not: a
    symlink named like a checkpoint is listed as damaged and not followed. An ``s3://``
    root is listed by :func:`uckpt.cli.remote.scan_remote`."""
    if is_remote(root):
        from .remote import scan_remote

        return scan_remote(root, storage_options)
    root = Path(root)
    try:
        st = os.stat(root)
    except FileNotFoundError:
        raise CheckpointNotFoundError(f"{str(root)!r} does not exist", path=str(root)) from None
    if not stat.S_ISDIR(st.st_mode):
        raise NotACheckpointError(f"{str(root)!r} is {kind_of(st.st_mode)}, not a directory of "
                                  "checkpoints", path=str(root))
    if os.path.lexists(root / MANIFEST_NAME):
        return [examine(root)]
    found = []
    with os.scandir(root) as it:
        entries = sorted(it, key=lambda e: e.name)
    for e in entries:
        try:
            if e.is_symlink():
                item = _symlink(Path(e.path))
            elif e.is_dir(follow_symlinks=False):
                before = identity(e.path)
                item = _classify(Path(e.path))
                if item is not None and item.status == DAMAGED and gone(item.path, before):
                    continue  # deleted or replaced while it was examined
            else:
                continue
        except FileNotFoundError:  # vanished while scanning (a save committed, a delete ran)
            continue
        if item is not None:
            found.append(item)
    return order_found(found)


def identity(path) -> Optional[tuple]:
    """(device, inode) of the entry at ``path`` (not followed), None if there is none."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def gone(target, before: Optional[tuple], storage_options=None) -> bool:
    """Whether checkpoint ``target`` (a path or an ``s3://`` URL) listed as ``before`` (its
    :func:`identity` then; None: not known) was deleted or replaced since: a local one
    renamed away (retention hides a checkpoint by renaming it before removing its files)
    or another directory there now; in an object store, its manifest gone (a deletion
    removes it first)."""
    if is_remote(str(target)):
        from .remote import remote_gone

        return remote_gone(str(target), storage_options)
    now = identity(target)
    return now is None or (before is not None and now != before)


def _symlink(path: Path) -> Optional[Found]:
    """A symlink in a root named like a checkpoint: damaged, and never followed."""
    hidden = _HIDDEN.match(path.name)
    m = _STEP.match(hidden.group("name") if hidden else path.name)
    if m is None and not hidden:
        return None
    return Found(path, DAMAGED, step=int(m.group(1)) if m else None,
                 reason=f"{link_kind(path)}, not a checkpoint directory: not followed")


def _classify(path: Path) -> Optional[Found]:
    hidden = _HIDDEN.match(path.name)
    if hidden:
        m = _STEP.match(hidden.group("name"))
        temp = hidden.group("mark") == TMP_MARK
        return Found(path, INCOMPLETE if temp else STALE,
                     step=int(m.group(1)) if m else None, size=dir_size(path),
                     reason=("temporary directory of a save in progress or interrupted"
                             if temp else "left by an interrupted delete or overwrite"))
    if _STEP.match(path.name) or os.path.lexists(path / MANIFEST_NAME):
        return examine(path, follow_symlinks=False)
    return None


def examine(path: Path, follow_symlinks: bool = True) -> Found:
    """Classify one checkpoint directory (reads and validates only its manifest; data files
    are only ``lstat``-ed: regular files of their recorded size). Never follows a
    symlink inside the directory, nor at ``path`` itself without ``follow_symlinks``."""
    path = Path(path)
    m = _STEP.match(path.name)
    item = Found(path, DAMAGED, step=int(m.group(1)) if m else None)
    try:
        dir_fd = open_dir(path, follow_symlinks=follow_symlinks)
    except UckptError as e:
        if isinstance(e, FileNotFoundError):
            raise
        item.reason = _relative(str(e), path)
        return item
    try:
        item.size = dir_size(path)
        _examine_at(dir_fd, item)
    finally:
        os.close(dir_fd)
    return item


def _examine_at(dir_fd: int, item: Found) -> None:
    path = item.path
    try:
        os.stat(MANIFEST_NAME, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        item.reason = f"no {MANIFEST_NAME}"
        return
    except OSError:
        pass  # reading it says why
    try:
        manifest = manifest_at(dir_fd, path)
    except UckptError as e:
        item.reason = _relative(str(e), path)
        return
    item.manifest = manifest
    if manifest.step is not None:
        item.step = manifest.step
    for f in manifest.files.values():
        try:
            actual = stat_regular(dir_fd, f.name, what="data file",
                                  path=str(path / f.name)).st_size
        except FileNotFoundError:
            item.reason = f"data file {f.name} is missing"
            return
        except UckptError as e:
            item.reason = _relative(str(e), path)
            return
        item.reason = size_reason(f.name, actual, f.size)
        if item.reason:
            return
    item.status = COMMITTED


def dir_size(top) -> int:
    """Total size of the regular files below directory ``top``; never follows a symlink
    below it; skips what vanishes or cannot be read."""
    total = 0
    pending = [top]  # a stack, not recursion: a deep tree cannot exhaust Python's stack
    while pending:
        where = pending.pop()
        try:
            with os.scandir(where) as it:
                for e in it:
                    try:
                        if e.is_dir(follow_symlinks=False):
                            pending.append(e.path)
                        elif e.is_file(follow_symlinks=False):
                            total += e.stat(follow_symlinks=False).st_size
                    except OSError:  # vanished, or unreadable: count what can be seen
                        continue
        except OSError:
            continue
    return total


def _relative(message: str, directory: Path) -> str:
    """An error's first line, with the checkpoint's own path left out (it is in the table)."""
    line = message.splitlines()[0] if message else ""
    for prefix in (str(directory) + os.sep, str(directory.absolute()) + os.sep):
        line = line.replace(prefix, "")
    return line
