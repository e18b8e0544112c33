"""Where checkpoint bytes live: the storage layer (see :mod:`uckpt.storage.base`).

A root or a checkpoint is named by a local path, an ``s3://bucket/prefix`` URL, or a URL
of a store on the blob layer (:mod:`.checkpoint.urls`: ``memory://name/prefix``, a store
in this process's memory, ``shm://name/prefix``, a directory in the node's shared memory
(:mod:`.checkpoint.shm`), and ``fsspec+<protocol>://...``, any fsspec file system).
:func:`open_store` gives the :class:`~uckpt.storage.base.Store` of a root,
:func:`locate` the store and name of one checkpoint, :func:`open_source` a
:class:`~uckpt.storage.base.CheckpointSource` to read one.

Object stores need the optional extra ``pip install 'uckpt[s3]'`` (boto3), which is
imported only when an ``s3://`` URL is used: importing this package imports nothing
beyond the standard library and uckpt's core.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, Mapping, Optional, Tuple, TypeGuard, Union

from ..errors import StorageConfigError
from .base import CheckpointSink, CheckpointSource, Entry, Store
from .checkpoint.urls import is_blob_url, takes_options
from .s3_url import is_s3_url, parse_url

__all__ = ["CheckpointSink", "CheckpointSource", "Entry", "Store", "canonical", "local_path",
           "locate", "open_source", "open_store", "storage_options_for"]

#: a local path or a URL naming a root or a checkpoint
PathOrUrl = Union[str, "os.PathLike[str]"]
#: ``storage_options``: settings of the store a URL names (see :mod:`.s3_config`)
Options = Mapping[str, Any]


def is_remote(target: object) -> TypeGuard[str]:
    """Whether ``target`` names a checkpoint or root by a URL (an object store, memory, an
    fsspec file system), not a local path (for this package only: callers outside it ask
    the store, or the functions below)."""
    return is_s3_url(target) or is_blob_url(target)


def storage_options_for(target: Any, storage_options: Optional[Options]) -> Optional[Options]:
    """The ``storage_options`` that apply to ``target``: all of them for a URL of a store
    that takes options, None for a local path or a ``memory://`` or ``shm://`` URL (which
    take none)."""
    return storage_options if is_s3_url(target) or takes_options(target) else None


def canonical(target: PathOrUrl) -> Union[Path, str]:
    """``target`` as one spelling of it: an absolute Path for a local path, the URL without
    a trailing ``/`` for a URL."""
    if is_remote(target):
        scheme, sep, rest = str(target).partition("://")
        return scheme + sep + rest.rstrip("/")  # "shm://" stays a URL (of no name)
    return Path(target).absolute()


def local_path(target: PathOrUrl) -> Optional[Path]:
    """The local file-system path ``target`` names, None where it names none (a URL): for
    what only a local file can be (another format's input file, the save costs a manager
    records beside its first tier)."""
    return None if is_remote(target) else Path(target)


def _check_options(target: PathOrUrl, storage_options: Optional[Options]) -> None:
    if storage_options and not is_remote(target):
        raise StorageConfigError(f"storage_options were given for {os.fspath(target)!r}, a "
                                 "local path; they apply to s3:// URLs only")


def open_store(root: Union[Store, PathOrUrl], storage_options: Optional[Options] = None) -> Store:
    """The store of root ``root`` (a path, or an ``s3://bucket/prefix`` URL)."""
    if isinstance(root, Store):
        return root
    _check_options(root, storage_options)
    if is_blob_url(root):
        return _blob_root(root, storage_options)
    if is_remote(root):
        bucket, prefix = parse_url(root)
        return _s3_root(bucket, prefix, storage_options)
    return _posix_root(Path(root))


def _posix_root(path: Path) -> Store:
    """The local root directory ``path``: the checkpoint layer on a POSIX blob store."""
    from .blob.posix import PosixStore
    from .checkpoint import BlobCheckpointStore

    return BlobCheckpointStore(PosixStore(path), "", os.fspath(path))


def _blob_root(url: str, storage_options: Optional[Options]) -> Store:
    from .checkpoint import BlobCheckpointStore
    from .checkpoint.urls import open_blob_url

    blob, prefix, where = open_blob_url(url, storage_options)
    return BlobCheckpointStore(blob, prefix, where)


def _s3_root(bucket: str, prefix: str, storage_options: Optional[Options]) -> Store:
    """The root ``s3://bucket/prefix``: the checkpoint layer on the bucket's blob store."""
    from .blob.s3 import S3Store, client_for
    from .checkpoint import BlobCheckpointStore
    from .s3_url import url_of

    blob = S3Store(client_for(bucket, storage_options))
    return BlobCheckpointStore(blob, prefix + "/" if prefix else "", url_of(bucket, prefix))


def locate(target: PathOrUrl, storage_options: Optional[Options] = None) -> Tuple[Store, str]:
    """The store holding checkpoint ``target`` (a path or URL) and the checkpoint's name
    in it: ``/a/b/ckpt`` -> (``/a/b``, ``ckpt``), ``s3://bucket/a/ckpt`` ->
    (``s3://bucket/a``, ``ckpt``)."""
    _check_options(target, storage_options)
    if is_blob_url(target):
        from .checkpoint.urls import split

        parent, name = split(target)
        return _blob_root(parent, storage_options), name
    if is_remote(target):
        bucket, prefix = parse_url(target)
        if not prefix:
            raise StorageConfigError(f"{target!r} names a bucket, not a checkpoint in it",
                                     path=target, hint="write s3://bucket/name")
        parent, _, name = prefix.rpartition("/")
        return _s3_root(bucket, parent, storage_options), name
    path = Path(target).absolute()
    return _posix_root(path.parent), path.name


def open_source(target: Union[CheckpointSource, PathOrUrl],
                storage_options: Optional[Options] = None) -> CheckpointSource:
    """A source reading checkpoint ``target`` (a path, a URL, or a source: returned)."""
    if isinstance(target, CheckpointSource):
        return target
    if is_remote(target):
        store, name = locate(target, storage_options)
        return store.source(name)
    _check_options(target, storage_options)
    store, name = locate(_named_directory(Path(target)))
    return store.source(name)


def _named_directory(path: Path) -> Path:
    """The checkpoint directory the user named by ``path``: a symlink there is followed
    (the user's choice; entries inside it never are), and what is there but not a
    directory (a FIFO, a file) is refused as NotACheckpointError naming what it is."""
    try:
        is_dir = stat.S_ISDIR(os.stat(path).st_mode)
    except OSError:
        return path  # missing (or unreachable): named as such by the first read
    if not is_dir:  # named as the user gave it, a symlink's target as what it is
        from .fsutil import open_dir

        os.close(open_dir(path))  # raises NotACheckpointError: "... is a FIFO, not a ..."
    return Path(os.path.realpath(path)) if path.is_symlink() else path
