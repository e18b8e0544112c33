"""Reading one checkpoint from a blob store (:class:`~uckpt.storage.base.CheckpointSource`)."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Sequence, Union

from ... import knobs
from ...errors import (CheckpointNotFoundError, CorruptCheckpointError, ManifestError,
                       NotACheckpointError, NotRegularFileError, StoreNotFoundError,
                       UckptError)
from .. import base, fsutil
from ..base import step_of
from .listing import is_prefix
from .names import MANIFEST_NAME

if TYPE_CHECKING:
    from ..blob.base import BlobReader, BlobStore


class BlobSource(base.CheckpointSource):
    """The checkpoint under ``prefix`` (``"a/step_1/"``) of ``blob``; ``where`` is its URL
    or path, for messages. Data files are opened and sized once (:meth:`open_file`), then
    read in ranges straight into the caller's buffers, until :meth:`close`."""

    def __init__(self, blob: BlobStore, prefix: str, where: str) -> None:
        self.blob, self.prefix, self.where = blob, prefix, where
        self.block_bytes = max(knobs.read_block_bytes, blob.read_block_bytes)
        self.read_threads = self.verify_threads = max(knobs.io_threads, blob.read_threads)
        self.coalesce = blob.vectored_reads
        self.shares_cache = blob.local_files
        self._readers: Dict[str, BlobReader] = {}
        self._lock = threading.Lock()
        self._read = 0  # bytes read through read_into / read_vectored (bytes_read)
        self._read_lock = threading.Lock()

    @property
    def location(self) -> Union[Path, str]:
        return Path(self.where) if self.blob.local_files else self.where

    def _missing(self) -> NotACheckpointError:
        steps = self._steps_below()
        if steps:
            where = self.where.rstrip("/")
            return NotACheckpointError(
                f"{self.where!r} is a root of checkpoints ({len(steps)} committed: "
                f"{', '.join(dict.fromkeys((steps[0], steps[-1])))}), not one checkpoint",
                path=self.where,
                hint=f"name one of them ({where}/{steps[-1]}); list them with `uckpt ls "
                     f"{where}`, check them all with `uckpt verify --all {where}`; in Python, "
                     "CheckpointManager(root).restore() restores the newest")
        return NotACheckpointError(
            f"{self.where!r} is not a committed uckpt checkpoint: it has no {MANIFEST_NAME}",
            path=self.where,
            hint="a save that was interrupted leaves no manifest; use an earlier checkpoint "
                 "(CheckpointManager.restore() picks the newest committed one)")

    def _steps_below(self) -> List[str]:
        """The names of the committed ``step_N`` checkpoints directly below this prefix,
        oldest first (a manager's root named as a checkpoint); none when it cannot tell."""
        try:
            held = self.blob.list_level(self.prefix, holding=MANIFEST_NAME).holding
        except (OSError, UckptError):
            return []
        names = [p[len(self.prefix):].rstrip("/") for p in held]
        return sorted((n for n in names if step_of(n) is not None), key=lambda n: step_of(n) or 0)

    def manifest_bytes(self) -> bytes:
        key, cap = self.prefix + MANIFEST_NAME, base.MAX_MANIFEST_BYTES
        try:
            size = self.blob.size(key)
            if size > cap:  # refused unread
                where = self.file_where(MANIFEST_NAME)
                raise ManifestError(f"manifest {where!r} holds {size} bytes, more than {cap} "
                                    "bytes, the most uckpt reads for a manifest", path=where)
            buf = bytearray(size + 1)
            n = self.blob.read_into(key, 0, buf)
        except StoreNotFoundError:
            raise
        except CheckpointNotFoundError:
            kind = self._prefix_kind(MANIFEST_NAME)
            if kind:
                raise self._not_regular(MANIFEST_NAME, "manifest", kind,
                                        NotACheckpointError) from None
            if self.blob.local_files and self.prefix and not is_prefix(self.blob, self.prefix):
                raise CheckpointNotFoundError(f"checkpoint {self.where!r} does not exist",
                                              path=self.where) from None
            raise self._missing() from None
        except NotRegularFileError as e:
            raise self._not_regular(MANIFEST_NAME, "manifest", e.kind,
                                    NotACheckpointError) from None
        if n > cap:
            raise ManifestError(f"the manifest of {self.where!r} holds more than {cap} bytes, "
                                "the most read for one", path=self.file_where(MANIFEST_NAME))
        del buf[n:]
        return bytes(buf)

    def file_where(self, name: str) -> str:
        return f"{self.where}/{name}"

    def open_file(self, name: str, what: str = "data file") -> int:
        return self._open(name, what).size

    def reader(self, name: str) -> BlobReader:
        """Data file ``name``, opened (by :meth:`open_file`, else now)."""
        return self._readers.get(name) or self._open(name, "data file")

    def _open(self, name: str, what: str) -> BlobReader:
        with self._lock:
            if name not in self._readers:
                try:
                    self._readers[name] = self.blob.open_reader(self.prefix + name)
                except CheckpointNotFoundError:
                    kind = self._prefix_kind(name)
                    if kind:
                        raise self._not_regular(name, what, kind) from None
                    where = self.file_where(name)
                    raise CheckpointNotFoundError(f"{what} {where!r} listed in the manifest "
                                                  "is missing", path=where) from None
                except NotRegularFileError as e:
                    raise self._not_regular(name, what, e.kind) from None
            return self._readers[name]

    def _not_regular(self, name: str, what: str, kind: str,
                     error: type = NotRegularFileError) -> BaseException:
        """The error of file ``name`` (``what``: "manifest", "data file") being ``kind``."""
        return fsutil.not_regular(self.file_where(name), what, kind, error)

    def _prefix_kind(self, name: str) -> str:
        """What stands at ``name``, where no object does: a directory (a prefix), or
        nothing ("")."""
        if not is_prefix(self.blob, self.prefix + name + "/"):
            return ""
        return "a directory" if self.blob.local_files else "a prefix of further objects"

    def medium_reader(self, name: str) -> base.MediumReader:
        """The store's :meth:`~uckpt.storage.blob.base.BlobStore.open_medium_reader`
        (a local file: O_DIRECT) of data file ``name``, once it was opened as usual."""
        self._open(name, "data file")  # a missing or odd file named as for any read
        return _Medium(self.blob.open_medium_reader(self.prefix + name))

    def read_into(self, name: str, buf: Any, offset: int) -> int:
        return self._counted(self.reader(name).read_into(offset, buf))

    def read_vectored(self, name: str, bufs: Sequence[Any], offset: int) -> int:
        return self._counted(self.reader(name).read_vectored(offset, bufs))

    def _counted(self, n: int) -> int:
        with self._read_lock:  # (reads run on several threads)
            self._read += n
        return n

    @property
    def bytes_read(self) -> int:
        return self._read

    def close(self) -> None:
        with self._lock:
            readers, self._readers = list(self._readers.values()), {}
        for reader in readers:
            reader.close()

    def sibling(self, name: str) -> "BlobSource":
        """The checkpoint ``name`` beside this one (a base of an incremental checkpoint)."""
        parent = self.prefix[:-1].rpartition("/")[0]
        prefix = f"{parent}/{name}/" if parent else f"{name}/"
        where = f"{self.where.rpartition('/')[0]}/{name}"
        try:
            there = self.blob.exists(prefix + MANIFEST_NAME)
        except NotRegularFileError as e:
            raise base.uncommitted_base(where, f"manifest {where + '/' + MANIFEST_NAME!r} is "
                                               f"{e.kind}, not a regular file") from None
        except CorruptCheckpointError:  # local files: the base itself is no directory
            kind = self.blob.others(prefix[:-len(name) - 1]).get(prefix[:-1], "not reachable")
            raise NotACheckpointError(f"{where!r} is {kind}, not a base checkpoint directory",
                                      path=where) from None
        if not there:
            if self.blob.local_files and not is_prefix(self.blob, prefix):
                raise CheckpointNotFoundError(f"base checkpoint {where!r} does not exist",
                                              path=where)
            raise base.uncommitted_base(where, f"it has no {MANIFEST_NAME}")
        return BlobSource(self.blob, prefix, where)


class _Medium:
    """A blob reader as a :class:`~uckpt.storage.base.MediumReader`."""

    def __init__(self, reader: BlobReader) -> None:
        self.reader, self.how = reader, reader.how

    def read(self, buf: Any, offset: int) -> int:
        return self.reader.read_into(offset, buf)

    def close(self) -> None:
        self.reader.close()
