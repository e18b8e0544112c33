"""What a local root holds, for a listing (:meth:`uckpt.storage.base.Store.entries`).

Names, file types and sizes only: nothing is opened but directories, nothing is read
through a symlink below the root (the root itself may be one: it was given), nothing that
could block (a FIFO) is opened, and nothing is changed. A directory is named by its
(device, inode), so that one deleted or replaced while it was examined is told apart
from a damaged one (:func:`still_there`).
"""
from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any, List, Optional, Tuple

from ..errors import CheckpointNotFoundError, NotACheckpointError, UckptError
from ..format import MANIFEST_NAME
from .fsutil import kind_of, link_kind, open_dir
from .leases import DEL_MARK, OLD_MARK, TMP_MARK
from .base import CHECKPOINT, LINK, STALE, STEP_NAME, TEMPORARY, Entry

_HIDDEN = re.compile(r"^\.(?P<name>.+?)(?P<mark>%s|%s|%s)[0-9A-Za-z]+$"
                     % (re.escape(TMP_MARK), re.escape(OLD_MARK), re.escape(DEL_MARK)))


def identity(path: Any) -> Optional[Tuple[int, int]]:
    """(device, inode) of the entry at ``path`` (not followed), None if there is none."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def check_root(root: Path) -> None:
    """Raise CheckpointNotFoundError if ``root`` does not exist, NotACheckpointError if it
    is not a directory (a symlink to one is followed)."""
    try:
        st = os.stat(root)
    except FileNotFoundError:
        raise CheckpointNotFoundError(f"{str(root)!r} does not exist", path=str(root)) from None
    if not stat.S_ISDIR(st.st_mode):
        raise NotACheckpointError(f"{str(root)!r} is {kind_of(st.st_mode)}, not a directory of "
                                  "checkpoints", path=str(root))


def itself(root: Path) -> Optional[Entry]:
    check_root(root)
    if not os.path.lexists(root / MANIFEST_NAME):
        return None
    return checkpoint(root, follow_symlinks=True)


def entries(root: Path) -> List[Entry]:
    check_root(root)
    out = []
    with os.scandir(root) as it:
        found = sorted(it, key=lambda e: e.name)
    for e in found:
        try:
            if e.is_symlink():
                entry = _symlink(Path(e.path))
            elif e.is_dir(follow_symlinks=False):
                entry = _directory(Path(e.path))
            else:
                continue
        except FileNotFoundError:  # vanished while listed (a save committed, a delete ran)
            continue
        if entry is not None:
            out.append(entry)
    return out


def _step(name: str) -> Optional[int]:
    m = STEP_NAME.match(name)
    return int(m.group(1)) if m else None


def _symlink(path: Path) -> Optional[Entry]:
    """A symlink in a root named like a checkpoint: never followed."""
    hidden = _HIDDEN.match(path.name)
    step = _step(hidden.group("name") if hidden else path.name)
    if step is None and not hidden:
        return None
    return Entry(path.name, LINK, str(path), step=step,
                 reason=f"{link_kind(path)}, not a checkpoint directory: not followed")


def _directory(path: Path) -> Optional[Entry]:
    hidden = _HIDDEN.match(path.name)
    if hidden:
        temp = hidden.group("mark") == TMP_MARK
        return Entry(path.name, TEMPORARY if temp else STALE, str(path),
                     step=_step(hidden.group("name")), size=dir_size(path),
                     reason=("temporary directory of a save in progress or interrupted"
                             if temp else "left by an interrupted delete or overwrite"))
    if STEP_NAME.match(path.name) or os.path.lexists(path / MANIFEST_NAME):
        return checkpoint(path, follow_symlinks=False)
    return None


def checkpoint(path: Path, follow_symlinks: bool) -> Entry:
    """A CHECKPOINT entry for directory ``path``: its own files' types and sizes (lstat,
    never opened). Raises CheckpointNotFoundError if it vanished."""
    entry = Entry(path.name, CHECKPOINT, str(path), step=_step(path.name),
                  token=identity(path))
    try:
        dir_fd = open_dir(path, follow_symlinks=follow_symlinks)
    except UckptError as e:
        if isinstance(e, FileNotFoundError):
            raise
        entry.reason = str(e)
        return entry
    try:
        entry.size = dir_size(path)
        with os.scandir(dir_fd) as it:
            for child in it:
                try:
                    st = child.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    entry.files[child.name] = st.st_size
                else:
                    entry.not_plain[child.name] = (link_kind(child.name, dir_fd)
                                                   if stat.S_ISLNK(st.st_mode)
                                                   else kind_of(st.st_mode))
    finally:
        os.close(dir_fd)
    return entry


def still_there(entry: Entry) -> bool:
    now = identity(entry.where)
    return now is not None and (entry.token is None or now == entry.token)


def dir_size(top: Any) -> int:
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
