"""A blob store on any fsspec file system (GCS, Azure, HDFS, ... through their
maintained fsspec libraries): ``pip install 'uckpt[fsspec]'`` plus the file system's
own package.

An object is written to a hidden temporary path beside its key and moved into place
when its writer commits, so readers never see it half written. fsspec promises neither
an atomic rename of a directory nor an atomic exclusive create, so ``atomic_rename``
is False and ``conditional_create`` is True only where this process alone can see the
file system (fsspec's ``memory``), where a lock makes it atomic.
"""
from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, NoReturn

from ...errors import (CheckpointNotFoundError, ObjectStoreError, StorageAccessError,
                       StorageDependencyError)
from .base import (RESERVED, BlobStore, BlobWriter, Listing, check_below_root, check_key,
                   check_offset, check_prefix, closed, flat, writable_view)

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem
    from typing_extensions import Buffer

#: protocols whose file systems live in this process: one lock makes creates atomic
IN_PROCESS = {"memory"}
_CREATE = threading.Lock()


def _protocols(fs: AbstractFileSystem) -> set[str]:
    protocol = fs.protocol
    return {protocol} if isinstance(protocol, str) else set(protocol)


class FsspecStore(BlobStore):
    """Keys below ``root`` (a path of ``fs``) of the fsspec file system ``fs``."""

    def __init__(self, fs: AbstractFileSystem, root: str) -> None:
        self.fs = fs
        self.root = str(fs._strip_protocol(root)).rstrip("/")
        self.conditional_create = bool(_protocols(fs) & IN_PROCESS)
        self.durable = not self.conditional_create  # a memory file system is not

    @classmethod
    def from_url(cls, url: str, storage_options: Mapping[str, Any] | None = None
                 ) -> FsspecStore:
        """The store of ``url`` (``memory://x``, ``gcs://bucket/prefix``, ...)."""
        try:
            import fsspec.core
        except ImportError as e:
            raise StorageDependencyError(f"{url!r} needs the 'fsspec' package ({e})",
                                         hint="pip install 'uckpt[fsspec]'") from None
        fs, root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
        return cls(fs, root)

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}"

    def _error(self, e: OSError, key: str, doing: str) -> NoReturn:
        where = f"{self.fs.protocol}://{self._path(key)}"
        if isinstance(e, (FileNotFoundError, IsADirectoryError, NotADirectoryError)):
            raise CheckpointNotFoundError(f"no blob {key!r} at {where}", path=where) from None
        if isinstance(e, PermissionError):
            raise StorageAccessError(f"{doing} {where} was refused: {e}", path=where,
                                     hint="check the file system's credentials and "
                                          "permissions") from e
        raise ObjectStoreError(f"{doing} {where} failed: {type(e).__name__}: {e}",
                               path=where) from e

    def read_into(self, key: str, offset: int, buf: Buffer) -> int:
        view, done = writable_view(key, buf), 0
        path = self._path(check_key(key))
        try:
            if self.fs.info(path)["type"] != "file":
                raise FileNotFoundError(path)
            # a range read, not open + seek + read: some file systems hand every opener
            # the same file object (fsspec's memory one does), so reads on two threads
            # would move each other's position
            start = check_offset(key, offset)
            data = self.fs.cat_file(path, start=start, end=start + len(view))
            done = len(data)
            view[:done] = data
        except OSError as e:
            self._error(e, key, "reading")
        return done

    def size(self, key: str) -> int:
        try:
            info = self.fs.info(self._path(check_key(key)))
        except OSError as e:
            self._error(e, key, "reading")
        if info["type"] != "file":
            self._error(FileNotFoundError(key), key, "reading")
        return int(info["size"])

    def age(self, key: str) -> float | None:
        """From the file's ``modified`` time (compared with this host's clock: the file
        system's own clock is not exposed); None where the file system gives none."""
        try:
            modified = self.fs.modified(self._path(check_key(key)))
        except (OSError, NotImplementedError):
            return None
        stamp = modified.timestamp() if hasattr(modified, "timestamp") else None
        return None if stamp is None else max(0.0, time.time() - stamp)

    def list(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        prefix = check_prefix(prefix)
        try:
            found = self.fs.find(self._path(prefix), detail=True)
        except FileNotFoundError:
            return iter(())
        cut = len(self.root) + 1
        return ((str(p)[cut:], int(i["size"])) for p, i in sorted(found.items())
                if i["type"] == "file" and str(p)[cut:].startswith(prefix)
                and f"/{RESERVED}" not in "/" + str(p)[cut:])

    def list_dir(self, prefix: str = "") -> Listing:
        prefix = check_prefix(prefix)
        try:
            entries = self.fs.ls(self._path(prefix), detail=True)
        except FileNotFoundError:
            return Listing([], [])
        keys: list[str] = []
        prefixes: list[str] = []
        for info in entries:
            name = str(info["name"]).rstrip("/").rsplit("/", 1)[-1]
            if name.startswith(RESERVED):
                continue
            (keys if info["type"] == "file" else prefixes).append(
                prefix + name + ("" if info["type"] == "file" else "/"))
        return Listing(sorted(keys), sorted(prefixes))

    def open_writer(self, key: str) -> BlobWriter:
        return _Writer(self, check_key(key))

    def create_if_absent(self, key: str, data: Buffer) -> bool:
        if not self.conditional_create:  # a check, then a write: not atomic here
            return not self.exists(key) and self._write_new(key, data)
        with _CREATE:
            return not self.exists(key) and self._write_new(key, data)

    def _write_new(self, key: str, data: Buffer) -> bool:
        self.write(key, data)
        return True

    def delete(self, key: str, *, durable: bool = True) -> None:
        try:
            if self.fs.isfile(self._path(check_key(key))):
                self.fs.rm_file(self._path(key))
        except FileNotFoundError:
            pass
        except OSError as e:
            self._error(e, key, "deleting")

    def delete_prefix(self, prefix: str) -> None:
        prefix = check_below_root(prefix, repr(self.root))
        try:
            self.fs.rm(self._path(prefix).rstrip("/"), recursive=True)
        except FileNotFoundError:
            pass
        except OSError as e:
            self._error(e, prefix, "deleting")


class _Writer(BlobWriter):
    def __init__(self, store: FsspecStore, key: str) -> None:
        self.store, self.key = store, key
        final = store._path(key)
        parent = final.rsplit("/", 1)[0]
        self._tmp = f"{parent}/{RESERVED}w-{uuid.uuid4().hex}"
        try:
            store.fs.makedirs(parent, exist_ok=True)
            self._file: Any = store.fs.open(self._tmp, "wb")
        except OSError as e:
            store._error(e, key, "writing")

    def write(self, data: Buffer) -> None:
        view = flat(data)
        if self._file is None:
            raise closed(self.key)
        try:
            self._file.write(view)
        except OSError as e:
            self.store._error(e, self.key, "writing")

    def commit(self) -> None:
        if self._file is None:
            return
        try:
            self._file.close()
            self._file = None
            self.store.fs.mv(self._tmp, self.store._path(self.key))
        except OSError as e:
            self.store._error(e, self.key, "writing")
        finally:
            self.abort()

    def abort(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        try:
            self.store.fs.rm_file(self._tmp)
        except OSError:
            pass  # moved into place, or never made
