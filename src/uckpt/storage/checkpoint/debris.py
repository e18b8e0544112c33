"""What dead saves and deletions left under a root on a blob store, and its removal
(the root's writer only; never a live save's):

* with ``atomic_rename``: hidden prefixes ``.<name>.uckpt-tmp-<token>/`` whose save
  lease is free (the store has ``advisory_locks``; else this process's live saves are
  kept and the others removed only when the root's writer starts), an overwrite's old
  checkpoint ``.<name>.uckpt-old-<token>/`` (put back if nothing took its place, else
  removed) and a deletion's ``.<name>.uckpt-del-<token>/`` (removed), symbolic links
  and other entries named like them (unlinked, never followed), and what the
  store's own killed operations left there (:meth:`BlobStore.abort_incomplete`: a
  POSIX deletion's directory moved aside, a write's temporary file);
* without it: ``step_N/`` prefixes holding data objects but no manifest, whose newest
  object is older than ``knobs.debris_expiry_s`` by the store's clock
  (:meth:`~uckpt.storage.blob.base.BlobStore.age`), and not this process's live saves.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Dict, List

from ... import knobs
from ...errors import RootLockedError
from ..base import STEP_NAME
from .names import (HIDDEN, LEASE_SUFFIX, MANIFEST_NAME, OLD_MARK, TMP_MARK, is_live,
                    live_below, take_failed)

if TYPE_CHECKING:
    from .store import BlobCheckpointStore

log = logging.getLogger("uckpt.storage.checkpoint")


def remove_debris(store: BlobCheckpointStore) -> List[str]:
    if store.blob.atomic_rename:
        return _hidden_debris(store)
    return _unmanifested_debris(store)


def _dead(store: BlobCheckpointStore, prefix: str) -> bool:
    """Whether no save holds the temporary prefix ``prefix`` (``a/.x.uckpt-tmp-t/``). A
    free save lease is removed while this writer holds it: a save that made it but has
    not locked it yet then finds it gone and makes a new one (the store's
    :meth:`~uckpt.storage.blob.base.BlobStore.lock` locks only a file still linked), so
    a live save never holds a lease that a later sweep cannot see."""
    blob = store.blob
    if is_live(store.at(prefix[len(store.prefix):-1])):
        return False
    if not blob.advisory_locks:
        return True
    key = prefix[:-1] + LEASE_SUFFIX
    try:
        lease = blob.lock(key)
    except RootLockedError:
        return False
    try:
        blob.delete(key)
    finally:
        lease.release()
    return True


def _hidden_debris(store: BlobCheckpointStore) -> List[str]:
    blob, removed = store.blob, []
    blob.abort_incomplete(store.prefix, knobs.debris_expiry_s)  # a killed deletion's, ...
    listing = blob.list_dir(store.prefix)
    judged = set()  # temporary prefixes whose lease was judged (and, if dead, removed)
    for prefix in listing.prefixes:
        entry = prefix[len(store.prefix):-1]
        m = HIDDEN.match(entry)
        if not m:
            continue
        name, mark = m.group(1), m.group(2)
        if mark == TMP_MARK:
            judged.add(prefix)
            if not _dead(store, prefix):
                log.debug("kept %s: a live save holds it", prefix)
                continue
            blob.delete_prefix(prefix)
            log.info("removed %s: an interrupted save", store.at(entry))
        elif mark == OLD_MARK and not blob.exists(store.key(name, MANIFEST_NAME)) and \
                blob.exists(prefix + MANIFEST_NAME):
            blob.delete_prefix(store.key(name))  # anything half moved in is not committed
            blob.rename_prefix(prefix, store.key(name))
            log.info("put back %s as %s: an overwrite was interrupted", entry, name)
            continue
        else:
            blob.delete_prefix(prefix)
            log.info("removed %s: an interrupted %s", store.at(entry),
                     "overwrite" if mark == OLD_MARK else "deletion")
        removed.append(entry)
    for key, kind in blob.others(store.prefix).items():  # never followed: unlinked
        entry = key[len(store.prefix):]
        if HIDDEN.match(entry):
            blob.delete(key)
            log.info("removed %s: %s named like uckpt's debris", store.at(entry), kind)
            removed.append(entry)
    for key in listing.keys:  # leases of dead saves (_dead removes them)
        entry = key[len(store.prefix):]
        if entry.endswith(LEASE_SUFFIX) and HIDDEN.match(entry[:-len(LEASE_SUFFIX)]) and \
                key[:-len(LEASE_SUFFIX)] + "/" not in judged:
            _dead(store, key[:-len(LEASE_SUFFIX)] + "/")
    return removed


def _unmanifested_debris(store: BlobCheckpointStore) -> List[str]:
    blob, removed = store.blob, []
    steps: Dict[str, List[str]] = {}
    for key, _ in blob.list(store.prefix):
        parts = key[len(store.prefix):].split("/")
        if len(parts) == 2 and STEP_NAME.match(parts[0]):
            steps.setdefault(parts[0], []).append(key)
    for name, keys in sorted(steps.items()):
        prefix = store.key(name) + "/"
        if prefix + MANIFEST_NAME in keys:
            continue
        if is_live(store.at(name)):
            log.debug("kept %s: a save of this process is writing it", prefix)
            continue
        ages = [blob.age(k) for k in keys]
        if any(a is None or a < knobs.debris_expiry_s for a in ages):
            log.debug("kept %s: it has no manifest, but an object of it is recent (or of "
                      "unknown age): a save of another process may be writing it", prefix)
            continue
        blob.delete_prefix(prefix)
        removed.append(name)
        log.info("removed %s: %d objects of an interrupted save or deletion (no manifest; "
                 "newest object %.0f s old)", store.at(name), len(keys),
                 min(a for a in ages if a is not None))
    live = [store.key(w.rpartition("/")[2]) + "/" for w in live_below(store.where)]
    blob.abort_incomplete(store.prefix, knobs.debris_expiry_s, keep=live)
    return removed


def remove_failed(store: BlobCheckpointStore) -> None:
    """Remove what this process's failed saves under ``store`` left while the store could
    not be reached (they are dead: no other process writes them)."""
    for where in take_failed(store.where):
        name = where.rpartition("/")[2]
        if not store.blob.exists(store.key(name, MANIFEST_NAME)):
            store.blob.delete_prefix(store.key(name))
            log.info("removed %s: the objects of a failed save of this process", where)
