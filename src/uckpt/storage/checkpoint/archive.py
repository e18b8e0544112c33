"""Archives and records of a root on a blob store (:mod:`uckpt.storage.archive`): a
checkpoint moves into its archive by one prefix rename where the store has
``atomic_rename``; otherwise (and for ``keep``, a base linked into an archive) it is
copied there, the manifest last (which commits the copy), and then deleted here, the
manifest first. A kill in between leaves it committed in both places, which the next
writer's rollback finishes."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, List, Optional

from ...errors import CheckpointExistsError, CheckpointNotFoundError, UckptError
from ..archive import ARCHIVE_NAME, MAX_RECORD_BYTES
from .names import MANIFEST_NAME

if TYPE_CHECKING:
    from .store import BlobCheckpointStore

log = logging.getLogger("uckpt.storage.archive")


def read_record(store: BlobCheckpointStore, name: str) -> Optional[bytes]:
    """The record's bytes; None if absent, b"" (logged) if it is not one uckpt wrote."""
    try:
        return store.blob.read(store.key(name), MAX_RECORD_BYTES)
    except CheckpointNotFoundError:
        return None
    except UckptError as e:
        log.warning("ignored %s: %s", store.at(name), e)
        return b""


def archive(store: BlobCheckpointStore, name: str, into: str, keep: bool) -> bool:
    blob = store.blob
    here, there = store.key(name) + "/", store.key(into, name) + "/"
    if not keep and blob.atomic_rename:
        try:
            blob.rename_prefix(here, there)
        except CheckpointNotFoundError:  # moved before a kill, or by a rank sharing the root
            return blob.exists(there + MANIFEST_NAME)
        except CheckpointExistsError:  # copied before a kill: finish the move
            if not blob.exists(there + MANIFEST_NAME):
                raise
            blob.delete_prefix(here)
        return True
    objects = [key for key, _ in blob.list(here)]
    if not blob.exists(there + MANIFEST_NAME):
        if here + MANIFEST_NAME not in objects:
            return False
        data = sorted(k for k in objects if k != here + MANIFEST_NAME and "/" not in k[len(here):])
        for key in data + [here + MANIFEST_NAME]:  # the manifest last: it commits the copy
            blob.copy(key, there + key[len(here):])
    if not keep and objects:
        blob.delete(here + MANIFEST_NAME)  # un-commit here first
        blob.delete_prefix(here)
    return True


def archives(store: BlobCheckpointStore) -> List[str]:
    cut = len(store.prefix)
    names = (p[cut:-1] for p in store.blob.list_dir(store.prefix).prefixes)
    return sorted(n for n in names if ARCHIVE_NAME.match(n))
