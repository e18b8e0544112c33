"""An object store's archives and records (:mod:`uckpt.storage.archive`). There is no
rename: a checkpoint is copied into its archive on the server (data objects first, the
manifest last, which commits the copy: docs/format.md section 3.1), then deleted here
(the manifest first); a kill in between leaves it committed in both places, which the
next writer's rollback finishes."""
from __future__ import annotations

import logging
from typing import List, Optional

from ..errors import CheckpointNotFoundError, UckptError
from ..format import MANIFEST_NAME
from .archive import ARCHIVE_NAME, MAX_RECORD_BYTES

log = logging.getLogger("uckpt.storage.archive")


def read_record(store, name: str) -> Optional[bytes]:
    try:
        return store.client.get(store.key(name), MAX_RECORD_BYTES, what="record")
    except CheckpointNotFoundError:
        return None
    except UckptError as e:
        if store.client.exists(store.key(name)):
            log.warning("ignored %s: %s", store.location(name), e)
            return b""
        raise


def archive(store, name: str, into: str, keep: bool) -> bool:
    client = store.client
    here, there = store.key(name) + "/", store.key(into, name) + "/"
    objects = client.list(here, delimiter=None).objects
    if not client.exists(there + MANIFEST_NAME):
        if here + MANIFEST_NAME not in objects:
            return False
        data = sorted(k for k in objects if k != here + MANIFEST_NAME and "/" not in k[len(here):])
        for key in data + [here + MANIFEST_NAME]:  # the manifest last: it commits the copy
            client.copy(key, there + key[len(here):])
    if not keep and objects:
        client.delete([here + MANIFEST_NAME])  # un-commit here first
        client.delete_prefix(here)
    return True


def archives(store) -> List[str]:
    under = store._under()
    prefixes = store.client.list(under, delimiter="/").prefixes
    return sorted(p[len(under):].rstrip("/") for p in prefixes
                  if ARCHIVE_NAME.match(p[len(under):].rstrip("/")))
