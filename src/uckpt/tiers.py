"""Storage tiers: a fast node-local root and durable roots, and copying between them.

A tier is a root directory with the layout of docs/format.md section 2. A
checkpoint is committed on the first (fast) tier by a save, then *flushed* to
the other tiers: copied into a hidden temporary directory there, fsynced, read
back from storage and checked against every chunk's checksum, and only then
renamed into place, so it never counts as durable before it verifiably is.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from . import fsutil
from .commit import make_parent_and_tmp, publish, save_failure
from .errors import CheckpointExistsError
from .format import MANIFEST_NAME
from .reader import CheckpointReader


@dataclass
class Tier:
    """One storage level: ``path`` is its root; ``keep`` its retention policy.

    ``keep`` takes what :func:`uckpt.policies.as_retention` does: None (the
    manager's default), an int n (keep the last n), a policy or a list of them.
    """

    path: Path
    keep: Any = None
    name: str = ""

    def __post_init__(self) -> None:
        self.path = Path(self.path).absolute()
        if not self.name:
            self.name = self.path.name or str(self.path)


def as_tier(obj) -> Tier:
    if isinstance(obj, Tier):
        return obj
    if isinstance(obj, (str, os.PathLike)):
        return Tier(Path(obj))
    raise TypeError(f"a tier is a path or a uckpt.Tier, got {type(obj).__name__}")


def _drop_cache(fd: int) -> None:
    """Ask the kernel to forget cached pages, so a read-back comes from storage."""
    if hasattr(os, "posix_fadvise"):
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass


def copy_file(src: Path, dst: Path) -> None:
    """Copy, fsync and drop ``dst`` from the page cache (so a read-back comes from storage)."""
    with open(src, "rb") as fin, open(dst, "xb") as fout:
        shutil.copyfileobj(fin, fout, length=8 << 20)
        fout.flush()
        os.fsync(fout.fileno())
        _drop_cache(fout.fileno())


def copy_checkpoint(src: Path, dst: Path, verify: bool = True) -> Optional[Path]:
    """Copy committed checkpoint ``src`` to ``dst`` (same name on another tier).

    Returns ``dst``, or None if ``dst`` already holds a committed checkpoint (a
    flush that was already done). Raises on any failure, leaving nothing
    visible at ``dst``.
    """
    if (dst / MANIFEST_NAME).exists():
        return None
    with CheckpointReader(src) as reader:  # validates the source manifest first
        files = list(reader.manifest.files)
    lease = None
    try:
        lease = make_parent_and_tmp(dst)
        tmp = lease.path
        for name in files:
            copy_file(src / name, tmp / name)
        copy_file(src / MANIFEST_NAME, tmp / MANIFEST_NAME)
        fsutil.fsync_dir(tmp)
        if verify:
            with CheckpointReader(tmp) as copy:
                copy.verify()
        publish(tmp, dst, overwrite=False)
    except CheckpointExistsError:
        if lease is not None:
            fsutil.remove_tree(lease.path)
        return None
    except BaseException as e:
        if lease is not None:
            fsutil.remove_tree(lease.path)
        err = save_failure(e, f"copying {str(src)!r} to tier {str(dst.parent)!r}", dst)
        if err is e:
            raise
        raise err from e
    finally:
        if lease is not None:
            lease.release()
    return dst
