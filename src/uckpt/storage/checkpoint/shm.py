"""``shm://NAME[/prefix]`` roots: checkpoints in the node's POSIX shared memory.

``shm://NAME`` is the directory ``NAME`` of the node's shared-memory area: by default
``/dev/shm/uckpt/NAME``; where the environment variable ``UCKPT_SHM_DIR`` is set (a
system without ``/dev/shm``, or a test), ``$UCKPT_SHM_DIR/NAME``. It is written and
read as any local root (:class:`~uckpt.storage.blob.shm.ShmStore`: same commit by
rename, same checksums), survives the process that wrote it and not the node.

``NAME`` and each part of ``prefix`` are one path component of letters, digits,
``_``, ``-`` and ``.`` that does not start with ``.``.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Tuple

from ...errors import StorageConfigError
from ..blob.shm import ShmStore

#: the variable that overrides where shm:// roots live
ENV = "UCKPT_SHM_DIR"
#: the shared-memory file system looked for where ENV is not set
DEFAULT_SHM = "/dev/shm"
_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,254}$")


def base_dir() -> Path:
    """The directory holding every ``shm://`` root of this node (not made here)."""
    explicit = os.environ.get(ENV)
    if explicit:
        if not os.path.isdir(explicit):
            raise StorageConfigError(f"{ENV}={explicit!r} is not a directory", path=explicit,
                                     hint=f"make it (on a memory-backed file system, e.g. a "
                                          f"tmpfs mount), or unset {ENV} to use {DEFAULT_SHM}")
        return Path(explicit)
    if not os.path.isdir(DEFAULT_SHM):
        raise StorageConfigError(
            f"no shared-memory file system for shm:// roots: {DEFAULT_SHM} does not exist "
            "on this system", path=DEFAULT_SHM,
            hint=f"set {ENV} to a directory on a memory-backed file system (e.g. a tmpfs "
                 "mount), or use a local directory as the tier")
    return Path(DEFAULT_SHM) / "uckpt"


def open_shm(rest: str, url: str) -> Tuple[ShmStore, str, str]:
    """``(blob store, key prefix, root path)`` of ``shm://<rest>`` (``url``, as given)."""
    name, _, prefix = rest.strip("/").partition("/")
    for part in [name] + (prefix.split("/") if prefix else []):
        if not _PART.match(part):
            raise StorageConfigError(
                f"{url!r}: {part!r} is not a valid name of a shared-memory root"
                + (" (an empty name)" if not part else "")
                + (" ('{node}' is replaced only in a CheckpointManager's tiers)"
                   if "{" in part else ""), path=url,
                hint="write shm://NAME or shm://NAME/prefix, each part letters, digits, "
                     "'_', '-' or '.' (not first), e.g. shm://run1")
    root = base_dir() / name
    where = root / prefix if prefix else root
    return ShmStore(root, f"shm://{name}"), prefix + "/" if prefix else "", os.fspath(where)
