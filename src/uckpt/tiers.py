"""Storage tiers: a fast node-local root and durable roots, and copying between them.

A tier is a root directory with the layout of docs/format.md section 2. A
checkpoint is committed on the first (fast) tier by a save, then *flushed* to
the other tiers: copied into a hidden temporary directory there, fsynced, read
back from storage and checked against every chunk's checksum, and only then
renamed into place, so it never counts as durable before it verifiably is.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from . import fsutil
from .commit import publish, staged_dir
from .errors import CheckpointExistsError, TruncatedDataError
from .format import MANIFEST_NAME, Manifest
from .reader import CheckpointReader, manifest_bytes_at


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


class Source:
    """A committed checkpoint being copied: its directory open, its manifest's exact
    bytes and their parse. Files are opened relative to the directory, never through a
    symlink, and copied only up to their declared sizes."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.dir_fd = fsutil.open_dir(directory)
        try:
            self.manifest_bytes = manifest_bytes_at(self.dir_fd, directory)
            self.manifest = Manifest.parse(self.manifest_bytes,
                                           where=str(directory / MANIFEST_NAME))
        except BaseException:
            os.close(self.dir_fd)
            raise

    def __enter__(self) -> "Source":
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.dir_fd)

    def copy_file(self, name: str, dst: Path) -> None:
        """Copy data file ``name`` (its declared size) to ``dst``, fsync it and drop it from
        the page cache (so a read-back comes from storage)."""
        size = self.manifest.files[name].size
        path = str(self.directory / name)
        fin = fsutil.open_regular(self.dir_fd, name, what="data file", path=path)
        try:
            with open(dst, "xb") as fout:
                copied = fsutil.copy_range(fin, fout.fileno(), size)
                if copied < size:
                    raise TruncatedDataError(f"data file {path!r} is truncated: {copied} bytes, "
                                             f"the manifest records {size}", path=path,
                                             offset=copied)
                os.fsync(fout.fileno())
                _drop_cache(fout.fileno())
        finally:
            os.close(fin)

    def write_manifest(self, dst: Path) -> None:
        fsutil.write_file_durably(dst, self.manifest_bytes)


def copy_checkpoint(src: Path, dst: Path, verify: bool = True) -> Optional[Path]:
    """Copy committed checkpoint ``src`` to ``dst`` (same name on another tier).

    Returns ``dst``, or None if ``dst`` already holds a committed checkpoint (a
    flush that was already done). Raises on any failure, leaving nothing
    visible at ``dst``.
    """
    if (dst / MANIFEST_NAME).exists():
        return None
    try:
        with Source(src) as source, \
                staged_dir(dst, f"copying {str(src)!r} to tier {str(dst.parent)!r}") as tmp:
            for name in source.manifest.files:
                source.copy_file(name, tmp / name)
            source.write_manifest(tmp / MANIFEST_NAME)
            fsutil.fsync_dir(tmp)
            if verify:
                with CheckpointReader(tmp) as copy:
                    copy.verify()
            publish(tmp, dst, overwrite=False)
    except CheckpointExistsError:
        return None  # committed there meanwhile (the temporary copy is removed)
    return dst
