"""A root of checkpoints on any blob store (:class:`~uckpt.storage.base.Store`)."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Hashable, List, Optional, Sequence, Union

from ...errors import CheckpointExistsError, CheckpointNotFoundError
from .. import base
from ..base import Entry
from ..archive import hidden_steps
from . import archive as archives_
from . import listing
from .debris import remove_debris, remove_failed
from .lock import writer_lock
from .names import DATA_FILE, DEL_MARK, MANIFEST_NAME, hidden
from .sink import BlobSink
from .source import BlobSource

if TYPE_CHECKING:
    from ..blob.base import BlobStore
    from .lease_lock import LeaseWriterLock

log = logging.getLogger("uckpt.storage.checkpoint")


class BlobCheckpointStore(base.Store):
    """The checkpoints below ``prefix`` (``""`` or ``"a/b/"``) of ``blob``; ``where`` is
    the root's URL or path as the user gave it. Every rule is chosen by ``blob``'s
    capability flags (see :mod:`uckpt.storage.checkpoint`)."""

    def __init__(self, blob: BlobStore, prefix: str = "", where: str = "") -> None:
        self.blob = blob
        self.prefix = prefix
        self.where = where or f"{type(blob).__name__}:{prefix}"
        #: the lease lock this process holds on the root, if any (set by the lock)
        self.lease: Optional[LeaseWriterLock] = None

    def acts_here(self, rank: int) -> bool:
        """Every rank where each sees its own copy (a store with ``atomic_rename``: a
        directory, or a process's memory; ranks sharing one tolerate each other), rank 0
        alone where all see the same objects."""
        return self.blob.atomic_rename or rank == 0

    def exists(self) -> bool:
        """The root's directory, where the store has directories of their own
        (:attr:`~uckpt.storage.blob.base.BlobStore.local_files`); else always (a prefix
        holds whatever is put under it)."""
        if not self.blob.root_exists():
            return False
        if not self.prefix or not self.blob.local_files:
            return True
        return listing.is_prefix(self.blob, self.prefix)

    def identity(self) -> Hashable:
        return self.where.rstrip("/")

    def itself(self) -> Optional[Entry]:
        return listing.itself(self)

    def entries(self) -> List[Entry]:
        return listing.entries(self)

    def still_there(self, entry: Entry) -> bool:
        """The same directory at its name, where the store keeps local files (a deletion
        renames it away, an overwrite puts another in its place); else its manifest (a
        deletion un-commits it first)."""
        if entry.token is not None:
            return bool(listing.identity(self, entry.name) == entry.token)
        return self.has(entry.name)

    def key(self, *names: str) -> str:
        return self.prefix + "/".join(names)

    def at(self, name: str) -> str:
        """The path or URL of ``name`` below the root, as a string (for messages and keys
        of this process's registries)."""
        return f"{self.where}/{name}"

    def location(self, name: str) -> Union[Path, str]:
        """A Path where the blob store keeps its objects as local files
        (:attr:`~uckpt.storage.blob.base.BlobStore.local_files`), else a URL."""
        return Path(self.at(name)) if self.blob.local_files else self.at(name)

    def check_writer(self) -> None:
        """WriterLeaseLostError if this process held the root's lease lock and lost it."""
        if self.lease is not None:
            self.lease.check()

    # -- reading -------------------------------------------------------------------------
    def steps(self) -> List[int]:
        """The committed ``step_N`` children: on local files from one scan of the root's
        own entries with a look at each directory's manifest
        (:meth:`~uckpt.storage.blob.base.BlobStore.list_level`); on an object store from
        one listing of every key below the root (:func:`listing.children`)."""
        if self.blob.local_files:
            holding = self.blob.list_level(self.prefix, MANIFEST_NAME).holding
            found = [s for sub in holding
                     if (s := base.step_of(sub[len(self.prefix):-1])) is not None]
        else:
            found = [s for n, sub, tree in listing.children(self)
                     if (s := base.step_of(n)) is not None and sub + MANIFEST_NAME in tree.keys]
        steps = sorted(found)
        hidden_ = hidden_steps(self) if steps else ()
        return [s for s in steps if s not in hidden_] if hidden_ else steps

    def has(self, name: str) -> bool:
        """Also where something else stands at the manifest's name (a FIFO, a symlink, a
        directory of local files): a damaged checkpoint, which loading names as such."""
        return self.blob.occupied(self.key(name, MANIFEST_NAME))

    def files_present(self, name: str, files: Sequence[str]) -> bool:
        """Without a rename every rank sees the same objects; else ask for each."""
        return not self.blob.atomic_rename or all(self.blob.exists(self.key(name, f))
                                                  for f in files)

    def source(self, name: str, manifest: Any = None) -> BlobSource:
        return BlobSource(self.blob, self.key(name) + "/", self.at(name))

    # -- writing -------------------------------------------------------------------------
    def check_target(self, name: str, overwrite: bool) -> None:
        where = self.at(name)
        if self.blob.exists(self.key(name)):
            raise CheckpointExistsError(f"{where!r} exists and is an object (a file); "
                                        "refusing to replace it with a checkpoint", path=where,
                                        hint="save to another name, or delete that object")
        files = [k[len(self.key(name)) + 1:] for k, _ in self.blob.list(self.key(name))]
        if MANIFEST_NAME in files:
            if not overwrite:
                raise CheckpointExistsError(
                    f"{where!r} already holds a committed checkpoint", path=where,
                    hint="pass overwrite=True to replace it, or save to another location")
            return
        # without a rename, data objects of a dead save of this name are replaced
        foreign = [f for f in files if self.blob.atomic_rename or not DATA_FILE.match(f)]
        if foreign:
            raise CheckpointExistsError(
                f"{where!r} holds objects that are not a uckpt checkpoint's (e.g. "
                f"{sorted(foreign)[0]!r}); refusing to write there", path=where,
                hint="choose an empty or new location")

    def sink(self, name: str, overwrite: bool = False, shared: bool = False) -> BlobSink:
        remove_failed(self)
        self.check_target(name, overwrite)
        if self.blob.atomic_rename:
            return BlobSink(self, name, hidden(name, ".uckpt-tmp-"), True, shared)
        if overwrite and self.has(name):
            # no rename: the old checkpoint is un-committed first, so that its manifest
            # never describes data objects being replaced (docs/format.md section 2)
            self.check_writer()
            self.blob.delete(self.key(name, MANIFEST_NAME))
            log.info("overwrite of %s: the old checkpoint is no longer committed",
                     self.at(name))
        return BlobSink(self, name, name, True, shared)

    def join_sink(self, name: str, token: str) -> BlobSink:
        return BlobSink(self, name, token if self.blob.atomic_rename else name, False, True)

    def rewriter(self, name: str, file: str) -> Any:
        self.check_writer()
        return self.blob.open_writer(self.key(name, file))

    def delete(self, name: str) -> bool:
        """Hide first (a rename), or un-commit first (the manifest), then delete."""
        self.check_writer()
        if self.blob.atomic_rename:
            gone = self.key(hidden(name, DEL_MARK))
            try:
                self.blob.rename_prefix(self.key(name), gone)
            except CheckpointNotFoundError:
                return False  # another rank sharing this root deleted it first
            self.blob.delete_prefix(gone)
            return True
        if not self.has(name):
            return False
        self.blob.delete(self.key(name, MANIFEST_NAME))
        self.blob.delete_prefix(self.key(name))
        return True

    def remove_debris(self) -> List[str]:
        return remove_debris(self)

    def writer_lock(self, job: str, shared: bool) -> base.WriterLock:
        return writer_lock(self, job, shared)

    # -- archives (uckpt.storage.archive) --------------------------------------------------
    def record(self, name: str) -> Optional[bytes]:
        return archives_.read_record(self, name)

    def put_record(self, name: str, data: bytes) -> None:
        self.blob.write(self.key(name), data)

    def drop_record(self, name: str) -> None:
        self.blob.delete(self.key(name))

    def archive(self, name: str, into: str, keep: bool = False) -> bool:
        return archives_.archive(self, name, into, keep)

    def archives(self) -> List[str]:
        return archives_.archives(self)

    def within(self, into: str) -> "BlobCheckpointStore":
        return BlobCheckpointStore(self.blob, self.key(into) + "/", self.at(into))
