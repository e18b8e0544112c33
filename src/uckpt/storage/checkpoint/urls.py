"""Which blob store a URL names, for the roots that are neither local paths nor ``s3://``:

* ``memory://<name>[/<prefix>]``: the :class:`~uckpt.storage.blob.memory.MemoryStore`
  named ``<name>`` of this process (made on first use; it lives as long as the process);
* ``shm://<name>[/<prefix>]``: a directory in the node's shared memory
  (:mod:`.shm`: ``/dev/shm/uckpt/<name>``, or ``$UCKPT_SHM_DIR/<name>``);
* ``fsspec+<protocol>://<path>``: ``<protocol>://<path>`` of any fsspec file system
  (``fsspec+gcs://bucket/run``, ``fsspec+memory://run``), with ``storage_options`` passed
  to it; needs ``pip install 'uckpt[fsspec]'`` and the file system's own package.
"""
from __future__ import annotations

import re
import threading
from typing import Any, Dict, Mapping, Optional, Tuple, TypeGuard

from ...errors import StorageConfigError

URL = re.compile(r"^(memory|shm|fsspec\+[A-Za-z0-9][A-Za-z0-9_.-]*)://(.*)$")

_stores: Dict[Any, Any] = {}  # memory names and fsspec roots -> their blob store
_guard = threading.Lock()


def is_blob_url(target: object) -> TypeGuard[str]:
    return isinstance(target, str) and URL.match(target) is not None


def takes_options(target: object) -> bool:
    """Whether ``target`` is a URL of this module that takes ``storage_options`` (an
    ``fsspec+`` one; ``memory://`` and ``shm://`` stores take none)."""
    return is_blob_url(target) and str(target).startswith("fsspec+")


def open_blob_url(url: str, storage_options: Optional[Mapping[str, Any]] = None
                  ) -> Tuple[Any, str, str]:
    """``(blob store, key prefix, where)`` of root ``url`` (where: the root's URL; for
    ``shm://``, its directory); a store is made once per name (memory) or per URL and
    options (fsspec), so saves of one process share it."""
    m = URL.match(url)
    if m is None:
        raise StorageConfigError(f"{url!r} is not a memory://, shm:// or fsspec+<protocol>:// "
                                 "URL",
                                 path=url, hint="write memory://name or fsspec+gcs://bucket/x")
    scheme, rest = m.group(1), m.group(2)
    # (a memory name has no leading "/"; an fsspec path may: file:///abs/path)
    rest = rest.strip("/") if scheme == "memory" else rest.rstrip("/")
    where = f"{scheme}://{rest}"
    if scheme in ("memory", "shm") and storage_options:
        raise StorageConfigError(f"storage_options were given for {url!r}, a {scheme}:// "
                                 "root; they apply to s3:// and fsspec+ URLs only",
                                 path=url, hint="leave storage_options out")
    if scheme == "shm":
        from .shm import open_shm

        return open_shm(rest, url)
    if scheme == "memory":
        name, _, prefix = rest.partition("/")
        if not name:
            raise StorageConfigError(f"{url!r} names no memory store", path=url,
                                     hint="write memory://<name>, e.g. memory://run1")
        from ..blob.memory import MemoryStore

        with _guard:
            blob = _stores.setdefault(("memory", name), MemoryStore(f"memory://{name}"))
        return blob, prefix + "/" if prefix else "", where
    from ..blob.fsspec_store import FsspecStore

    key = (where, tuple(sorted((str(k), repr(v)) for k, v in (storage_options or {}).items())))
    with _guard:
        blob = _stores.get(key)
        if blob is None:
            blob = _stores[key] = FsspecStore.from_url(f"{scheme[len('fsspec+'):]}://{rest}",
                                                       storage_options)
    return blob, "", where


def split(url: str) -> Tuple[str, str]:
    """``(parent root URL, checkpoint name)`` of checkpoint ``url``."""
    m = URL.match(url)
    rest = m.group(2).strip("/") if m else ""
    if "/" not in rest:
        raise StorageConfigError(f"{url!r} names a store, not a checkpoint in it", path=url,
                                 hint="write memory://<name>/<checkpoint> (or shm://...; "
                                      "fsspec+<protocol>://<root>/<checkpoint>)")
    parent, _, name = url.rstrip("/").rpartition("/")
    return parent, name
