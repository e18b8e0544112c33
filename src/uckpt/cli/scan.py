"""Find the checkpoints under a root directory and classify them, without reading data.

Unlike :class:`~uckpt.CheckpointManager`, scanning never creates, removes or
renames anything: it is safe on a root another process is saving into.

A child directory of the root is
  * ``committed``: it holds a manifest that parses and validates, and every data
    file the manifest lists exists at (at least) its recorded size;
  * ``damaged``: it is named like a step (``step_00000042``) or holds a
    ``manifest.json``, but the manifest is missing or invalid, or a data file is
    missing or short (``reason`` says which);
  * ``incomplete``: the temporary directory of a save that is in progress or
    was interrupted (``.step_00000042.uckpt-tmp-1a2b3c4d``);
  * ``stale``: a checkpoint being deleted or replaced, left by an interrupted
    retention (``.uckpt-del-``) or overwrite (``.uckpt-old-``).
Other entries are ignored.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

from ..commit import DEL_MARK, OLD_MARK, TMP_MARK
from ..errors import CheckpointNotFoundError, NotACheckpointError, UckptError
from ..format import MANIFEST_NAME, Manifest
from ..reader import read_manifest

COMMITTED, DAMAGED, INCOMPLETE, STALE = "committed", "damaged", "incomplete", "stale"
_STEP = re.compile(r"^step_(\d+)$")
_HIDDEN = re.compile(r"^\.(?P<name>.+?)(?P<mark>%s|%s|%s)[0-9A-Za-z]+$"
                     % (re.escape(TMP_MARK), re.escape(OLD_MARK), re.escape(DEL_MARK)))


@dataclass
class Found:
    """One directory found under a root; ``tier`` is the root's label when several are listed."""

    path: Path
    status: str
    step: Optional[int] = None
    size: int = 0  # bytes of all files in the directory
    manifest: Optional[Manifest] = None
    reason: str = ""  # why it is damaged / incomplete / stale
    tier: Optional[str] = None  # set by tiers.scan_tiers

    @property
    def name(self) -> str:
        return self.path.name


def scan(root) -> List[Found]:
    """The checkpoints under ``root`` by step (unnumbered last); ``root`` itself if it is one."""
    root = Path(root)
    if not root.exists():
        raise CheckpointNotFoundError(f"{str(root)!r} does not exist", path=str(root))
    if not root.is_dir():
        raise NotACheckpointError(f"{str(root)!r} is a file, not a directory of checkpoints",
                                  path=str(root))
    if (root / MANIFEST_NAME).exists():
        return [examine(root)]
    found = []
    with os.scandir(root) as it:
        entries = sorted(it, key=lambda e: e.name)
    for e in entries:
        try:
            if not e.is_dir():
                continue
            item = _classify(Path(e.path))
        except FileNotFoundError:  # vanished while scanning (a save committed, a delete ran)
            continue
        if item is not None:
            found.append(item)
    order = {COMMITTED: 0, DAMAGED: 1, STALE: 2, INCOMPLETE: 3}
    found.sort(key=lambda f: (f.step is None, f.step or 0, order[f.status], f.name))
    return found


def _classify(path: Path) -> Optional[Found]:
    hidden = _HIDDEN.match(path.name)
    if hidden:
        m = _STEP.match(hidden.group("name"))
        temp = hidden.group("mark") == TMP_MARK
        return Found(path, INCOMPLETE if temp else STALE,
                     step=int(m.group(1)) if m else None, size=dir_size(path),
                     reason=("temporary directory of a save in progress or interrupted"
                             if temp else "left by an interrupted delete or overwrite"))
    if _STEP.match(path.name) or (path / MANIFEST_NAME).exists():
        return examine(path)
    return None


def examine(path: Path) -> Found:
    """Classify one checkpoint directory (reads and validates only its manifest)."""
    path = Path(path)
    m = _STEP.match(path.name)
    item = Found(path, DAMAGED, step=int(m.group(1)) if m else None, size=dir_size(path))
    if not (path / MANIFEST_NAME).exists():
        item.reason = f"no {MANIFEST_NAME}"
        return item
    try:
        manifest = read_manifest(path)
    except (UckptError, OSError) as e:
        item.reason = _relative(str(e), path)
        return item
    item.manifest = manifest
    if manifest.step is not None:
        item.step = manifest.step
    for f in manifest.files.values():
        try:
            actual = (path / f.name).stat().st_size
        except FileNotFoundError:
            item.reason = f"data file {f.name} is missing"
            return item
        if actual < f.size:
            item.reason = f"data file {f.name} is truncated: {actual} of {f.size} bytes"
            return item
    item.status = COMMITTED
    return item


def dir_size(path) -> int:
    """Total size of the regular files below ``path`` (skips what vanishes or cannot be read)."""
    total = 0
    try:
        with os.scandir(path) as it:
            for e in it:
                try:
                    if e.is_dir(follow_symlinks=False):
                        total += dir_size(e.path)
                    elif e.is_file(follow_symlinks=False):
                        total += e.stat(follow_symlinks=False).st_size
                except OSError:  # vanished, or unreadable: count what can be seen
                    continue
    except OSError:
        pass
    return total


def _relative(message: str, directory: Path) -> str:
    """An error's first line, with the checkpoint's own path left out (it is in the table)."""
    line = message.splitlines()[0] if message else ""
    for prefix in (str(directory) + os.sep, str(directory.absolute()) + os.sep):
        line = line.replace(prefix, "")
    return line
