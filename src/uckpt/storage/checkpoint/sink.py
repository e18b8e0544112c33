"""Writing one checkpoint to a blob store (:class:`~uckpt.storage.base.CheckpointSink`),
and its commit, chosen by the store's capabilities (docs/format.md section 2):

* ``atomic_rename``: the data files and then the manifest are written under the save's
  temporary prefix, held by its save lease, which is then renamed into place (an
  overwrite swaps it with the old checkpoint where the store has ``atomic_exchange``,
  so that readers never miss the name, else renames the old one aside first; the old
  one is removed after). The lease's holder (the coordinator; on a node-local copy, the
  rank of that copy that took it) stages the prefix
  (:meth:`~uckpt.storage.blob.base.BlobStore.stage`): its own objects there are made
  durable by the rename, which the committing rank makes after every rank wrote, not
  one by one; other ranks' objects stay durable one by one, so the rule holds on any
  file system, shared by several nodes or not. The lease file
  is removed without waiting for the removal to be durable: one that comes back after
  a crash is a dead save's lease, which the root's writer removes (:mod:`.debris`);
* otherwise: the data files are written under the final prefix and the manifest, written
  last (``create_if_absent`` unless overwriting), is the commit (section 2).
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Iterable, List, Optional, Tuple

from ...errors import CheckpointExistsError, CheckpointNotFoundError, RootLockedError, SaveError
from .. import base
from ..blob.base import BlobReader
from .names import (COORDINATOR_MARK, LEASE_SUFFIX, MANIFEST_NAME, OLD_MARK, failed, forget,
                    hidden, live)
from .source import BlobSource

if TYPE_CHECKING:
    from ..blob.base import BlobLock
    from .store import BlobCheckpointStore

log = logging.getLogger("uckpt.storage.checkpoint")
#: tries at taking a new save lease (see _take_lease)
_LEASE_TRIES = 100

def committed_meanwhile(where: str) -> CheckpointExistsError:
    return CheckpointExistsError(f"{where!r} was committed by another save during this one",
                                 path=where,
                                 hint="two savers wrote the same step; the first one's "
                                      "checkpoint is kept, this one is discarded")


class BlobSink(base.CheckpointSink):
    """One rank's part of a save of checkpoint ``name`` into ``store``. ``token``: the
    temporary prefix's name (stores with ``atomic_rename``), else the checkpoint's name.
    The coordinator's sink is made by :meth:`BlobCheckpointStore.sink`, the others' by
    :meth:`BlobCheckpointStore.join_sink`."""

    copies_stream_pieces = True  # a blob writer is done with a buffer once write() returns

    def __init__(self, store: BlobCheckpointStore, name: str, token: str,
                 coordinator: bool, shared: bool) -> None:
        self.store, self.blob, self.name = store, store.blob, name
        self.where = store.at(name)
        self.renames = store.blob.atomic_rename
        self.token = token
        self.prefix = store.key(token) + "/"
        self.coordinator, self.shared = coordinator, shared
        self.keys: List[str] = []
        self.lease: Optional[BlobLock] = None
        self.made_prefix = False
        self.live = store.at(token)
        live(self.live)
        if self.renames and coordinator:
            self._take_lease()
            if shared:
                self.blob.write(self.prefix + COORDINATOR_MARK, b"")

    def _take_lease(self, tries: int = _LEASE_TRIES) -> None:
        """Hold the temporary prefix (so that no writer takes it for debris), and own it;
        ``tries`` times, 10 ms apart, while it is held elsewhere."""
        if self.blob.advisory_locks:
            for attempt in range(tries):
                try:
                    self.lease = self.blob.lock(self.prefix[:-1] + LEASE_SUFFIX)
                    break
                except RootLockedError:
                    # a new lease is held elsewhere only by the writer's debris removal,
                    # for as long as it takes to remove it (see debris._dead)
                    if attempt + 1 == tries:
                        raise
                    time.sleep(0.01)
        self.made_prefix = True
        self.blob.stage(self.prefix)

    def replica(self) -> str:
        if not self.renames:
            return "shared"  # every rank sees the same objects, under their final names
        if self.coordinator and not self.shared:
            return "coordinator"
        if self.blob.exists(self.prefix + COORDINATOR_MARK):
            return "coordinator"
        if not self.made_prefix:  # this rank's own copy of the store (node-local)
            try:  # once: held, it is held by the rank of this copy that came first
                self._take_lease(tries=1)
            except RootLockedError:
                pass  # another rank of this copy holds it
        return self.blob.copy_of(self.prefix)

    def _key(self, name: str) -> str:
        key = self.prefix + name
        self.keys.append(key)
        return key

    def write_pieces(self, name: str, size: int, pieces: List[Tuple[int, Any]]) -> None:
        self.blob.write_pieces(self._key(name), pieces, size)

    def write_stream(self, name: str, pieces: Iterable[Tuple[int, Any]],
                     reserve: Optional[int] = None) -> None:
        self.blob.write_pieces(self._key(name), pieces, None, reserve or 0)

    def write_image(self, name: str, image: Any, size: int) -> None:
        self.blob.write_image(self._key(name), image, size)

    def copy_file(self, source: base.CheckpointSource, name: str, size: int) -> None:
        """Through the store's :meth:`~BlobStore.copy_in` (in the kernel from a local
        file to a local file), in bounded memory."""
        actual = source.open_file(name)
        if actual != size:
            raise base.wrong_size(source.file_where(name), actual, size)
        reader = (source.reader(name) if isinstance(source, BlobSource)
                  else _FromSource(source, name))
        done = self.blob.copy_in(self._key(name), reader, size)
        if done < size:  # cut short while it was copied
            raise base.wrong_size(source.file_where(name), done, size)

    def open_writer(self, name: str) -> Any:
        return self.blob.open_writer(self._key(name))

    def written(self, manifest: Any) -> base.CheckpointSource:
        return BlobSource(self.blob, self.prefix, self.where)

    def commit(self, manifest_bytes: bytes, overwrite: bool = False) -> None:
        self.store.check_writer()
        if self.renames:
            if self.shared:
                self.blob.delete(self.prefix + COORDINATOR_MARK)
            self.blob.write(self.prefix + MANIFEST_NAME, manifest_bytes)
            self._publish(overwrite)
            self.made_prefix = False
        else:
            key = self.prefix + MANIFEST_NAME
            if overwrite:
                self.blob.write(key, manifest_bytes)
            elif not self.blob.create_if_absent(key, manifest_bytes):
                raise committed_meanwhile(self.where)
        self.release()

    def _publish(self, overwrite: bool) -> None:
        """Rename the temporary prefix into place (swapping out a committed checkpoint
        when overwriting: the old one goes aside first and comes back if the move fails)."""
        final = self.store.key(self.name)
        old = None
        if self.blob.exists(final + "/" + MANIFEST_NAME):
            if not overwrite:  # appeared since check_target: never clobber
                raise committed_meanwhile(self.where)
            if self.blob.atomic_exchange and self.blob.exchange_prefix(self.prefix, final):
                # readers saw the old checkpoint until now, the new one from now on; the
                # old one is under this save's lease (debris if this process dies here)
                try:
                    self.blob.delete_prefix(self.prefix)
                except Exception as e:  # noqa: BLE001 - committed: the rest is debris
                    log.warning("could not remove the replaced checkpoint %s (%s); the "
                                "root's writer removes it later", self.store.at(self.token), e)
                return
            old = self.store.key(hidden(self.name, OLD_MARK))
            self.blob.rename_prefix(final, old)
        try:
            self.blob.rename_prefix(self.prefix, final)
        except CheckpointExistsError:
            raise committed_meanwhile(self.where) from None
        except CheckpointNotFoundError:
            raise SaveError(f"could not commit {self.where!r}: its temporary prefix "
                            f"{self.token!r} was removed by another process during the save",
                            path=self.where,
                            hint="only the root's writer removes interrupted saves, and "
                                 "never a live one; something outside uckpt deleted it"
                            ) from None
        except BaseException:
            if old is not None:
                self.blob.rename_prefix(old, final)  # the committed checkpoint stays
            raise
        if old is not None:
            self.blob.delete_prefix(old)

    def release(self) -> None:
        forget(self.live)
        self.blob.unstage(self.prefix)
        if self.lease is not None:
            try:  # removed while held, as the writer's debris removal does; not durably
                # (one that comes back after a crash is a dead save's lease: debris)
                self.blob.delete(self.prefix[:-1] + LEASE_SUFFIX, durable=False)
            finally:
                self.lease.release()
                self.lease = None

    def abort(self) -> None:
        """Remove what this rank wrote (the temporary prefix it made, else its own objects,
        unless a manifest committed them meanwhile); what cannot be removed now is debris
        the root's writer removes later."""
        try:
            if self.renames and self.made_prefix:
                self.blob.delete_prefix(self.prefix)
            elif not self.renames and self.blob.exists(self.prefix + MANIFEST_NAME):
                pass  # another save of this checkpoint committed it meanwhile: keep it
            else:
                for key in self.keys:
                    self.blob.delete(key)
                self.blob.abort_incomplete(self.prefix, 0.0)
        except Exception as e:  # noqa: BLE001 - the failure being handled is what matters
            failed(self.live)
            log.warning("could not remove what a failed save wrote under %s (%s); the next "
                        "save to this root removes it", self.where, e)
        finally:
            self.release()


class _FromSource(BlobReader):
    """Data file ``name`` of a source that is not a blob store's, read as a blob."""

    def __init__(self, source: base.CheckpointSource, name: str) -> None:
        self.source, self.name = source, name

    def read_into(self, offset: int, buf: Any) -> int:
        return self.source.read_into(self.name, buf, offset)
