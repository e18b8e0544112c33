"""Storage tiers: a fast node-local root and durable roots, and copying between them.

A tier is a root (a directory, or an ``s3://bucket/prefix`` of an object store) with the
layout of docs/format.md section 2, and a retention policy. A checkpoint is committed on
the first (fast) tier by a save, then *flushed* to the other tiers
(:func:`uckpt.saving.collective.copy_collective`): every data file copied (to an object store:
one parallel multipart upload per file), every chunk read back from the target storage
and checked against its checksum, and only then committed there (a directory renamed
into place; an object store's manifest object PUT last), so a copy never counts as
durable before it verifiably is. A tier with ``compression`` gets its raw chunks
compressed while they are copied (:mod:`uckpt.saving.recode`): the usual setup is a raw fast
tier (the training stall stays a memory copy) and a compressed durable tier.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Union

from ..codecs.pipeline import Compression, compression_of
from ..levels.scheme import Redundancy, parse_redundancy
from ..storage import canonical, open_store, storage_options_for
from ..storage.base import Store


@dataclass
class Tier:
    """One storage level: ``path`` is its root (a path, or an ``s3://bucket/prefix``
    URL); ``keep`` its retention policy; ``storage_options`` the object store's options
    (see :class:`uckpt.storage.s3.S3Options`: ``endpoint_url``, ``key``, ``secret``, ...;
    default: the manager's).

    ``keep`` takes what :func:`uckpt.manager.policies.as_retention` does: None (the
    manager's default), an int n (keep the last n), a policy or a list of them.

    ``compression`` (``"zstd"``, or ``"none"``; None: the manager's default) and
    ``compression_level``: how checkpoints are stored on this tier. Saves to the first
    tier compress as they write; copies to another tier compress the raw chunks they
    copy (chunks already compressed are copied as they are; so are all chunks to a tier
    without compression).

    ``redundancy`` (``"partner"``, ``"xor:G"``; None: none): the redundancy across nodes
    a node-local first tier holds (:mod:`uckpt.manager.redundant_level`, docs/levels.md):
    each save makes every node's piece before any node commits, and a restore rebuilds a
    lost or damaged node's copy from the others.
    """

    path: Union[Path, str]
    keep: Any = None
    name: str = ""
    storage_options: Optional[Mapping[str, Any]] = None
    compression: Optional[str] = None
    compression_level: Optional[int] = None
    redundancy: Optional[str] = None
    _store: Optional[Store] = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        compression_of(self.compression, self.compression_level)  # refuse bad names now
        scheme = parse_redundancy(self.redundancy)  # so are bad redundancy schemes
        self.redundancy = None if scheme is None else str(scheme)
        self.path = canonical(self.path)
        if not self.name:
            self.name = (self.path.name if isinstance(self.path, Path)
                         else self.path.rsplit("/", 1)[-1]) or str(self.path)

    def codec(self, default: Optional[Compression] = None) -> Optional[Compression]:
        """How this tier stores chunks: its own ``compression``, else ``default``."""
        if self.compression is None:
            return default
        return compression_of(self.compression, self.compression_level)

    @property
    def redundancy_scheme(self) -> Optional[Redundancy]:
        """The parsed ``redundancy`` (None: none)."""
        return parse_redundancy(self.redundancy)

    @property
    def store(self) -> Store:
        """The tier's :class:`~uckpt.storage.base.Store` (made on first use)."""
        if self._store is None:
            self._store = open_store(self.path, self.storage_options)
        return self._store


def as_tier(obj, storage_options: Optional[Mapping[str, Any]] = None) -> Tier:
    """A :class:`Tier` for a path, URL or Tier; ``storage_options`` apply to an ``s3://``
    URL (and to a Tier of one that has none of its own)."""
    if isinstance(obj, Tier):
        if obj.storage_options is None:
            obj.storage_options = storage_options_for(obj.path, storage_options)
        return obj
    if isinstance(obj, (str, os.PathLike)):
        path = obj if isinstance(obj, str) else Path(obj)  # as Tier would make it
        return Tier(path, storage_options=storage_options_for(obj, storage_options))
    raise TypeError(f"a tier is a path, an s3:// URL or a uckpt.Tier, got {type(obj).__name__}")


def copy_checkpoint(src, dst, verify: bool = True, storage_options=None, compression=None,
                    compression_level: Optional[int] = None):
    """Copy committed checkpoint ``src`` to ``dst`` (paths or URLs; the same name on
    another tier), from this one process; with ``compression`` (``"zstd"``), its raw
    chunks are compressed on the way.

    Returns ``dst``'s location, or None if it already holds a committed checkpoint (a
    flush that was already done). Raises on any failure, leaving nothing visible at
    ``dst``.
    """
    from ..saving.collective import copy_collective
    from ..comm import SingleProcess
    from ..storage import locate

    src_store, name = locate(src, storage_options_for(src, storage_options))
    dst_store, dst_name = locate(dst, storage_options_for(dst, storage_options))
    if name != dst_name:
        raise ValueError(f"a copy keeps the checkpoint's name: {name!r} != {dst_name!r}")
    return copy_collective(src_store, dst_store, name, SingleProcess(), verify,
                           compression_of(compression, compression_level))
