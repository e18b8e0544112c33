"""A blob store in this process's memory: for fast tests of everything above the blob
interface, and the basis of a memory level. Thread-safe; every operation is atomic."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, ClassVar

from ...errors import CheckpointExistsError, CheckpointNotFoundError, RootLockedError
from .base import (BlobLock, BlobStore, BlobWriter, Listing, check_below_root, check_key,
                   check_offset, check_prefix, check_rename, closed, flat, writable_view)

if TYPE_CHECKING:
    from typing_extensions import Buffer


class MemoryStore(BlobStore):
    """Objects held as ``bytes`` in a dict, under one lock. ``name`` appears in messages."""

    atomic_rename: ClassVar[bool] = True
    conditional_create = True
    advisory_locks: ClassVar[bool] = True
    durable = False

    def __init__(self, name: str = "memory") -> None:
        self.name = name
        self._objects: dict[str, bytes] = {}
        self._locks: dict[str, int] = {}  # key -> holders (-1: one exclusive)
        self._mutex = threading.Lock()

    def _get(self, key: str) -> bytes:
        try:
            return self._objects[check_key(key)]
        except KeyError:
            raise CheckpointNotFoundError(f"no blob {key!r} in {self.name}",
                                          path=key) from None

    def read_into(self, key: str, offset: int, buf: Buffer) -> int:
        view = writable_view(key, buf)
        data = self._get(key)  # the bytes object itself is never changed
        part = data[check_offset(key, offset):offset + len(view)]
        view[:len(part)] = part
        return len(part)

    def size(self, key: str) -> int:
        return len(self._get(key))

    def list(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        prefix = check_prefix(prefix)
        with self._mutex:
            found = [(k, len(v)) for k, v in self._objects.items() if k.startswith(prefix)]
        return iter(found)

    def list_dir(self, prefix: str = "") -> Listing:
        prefix = check_prefix(prefix)
        keys: set[str] = set()
        prefixes: set[str] = set()
        for key, _ in self.list(prefix):
            head, sep, _rest = key[len(prefix):].partition("/")
            (prefixes if sep else keys).add(prefix + head + sep)
        return Listing(sorted(keys), sorted(prefixes))

    def open_writer(self, key: str) -> BlobWriter:
        return _Writer(self, check_key(key))

    def create_if_absent(self, key: str, data: Buffer) -> bool:
        value = bytes(flat(data))
        with self._mutex:
            if check_key(key) in self._objects:
                return False
            self._objects[key] = value
        return True

    def delete(self, key: str, *, durable: bool = True) -> None:
        with self._mutex:
            self._objects.pop(check_key(key), None)

    def delete_prefix(self, prefix: str) -> None:
        prefix = check_below_root(prefix, self.name)
        with self._mutex:
            for key in [k for k in self._objects if k.startswith(prefix)]:
                del self._objects[key]

    def rename_prefix(self, src: str, dst: str) -> None:
        src, dst = check_rename(src, dst)
        with self._mutex:
            moved = [k for k in self._objects if k.startswith(src)]
            if not moved:
                raise CheckpointNotFoundError(f"nothing below {src!r} in {self.name} to "
                                              "rename", path=src)
            if dst[:-1] in self._objects or any(k.startswith(dst) for k in self._objects):
                raise CheckpointExistsError(f"cannot rename {src!r} to {dst!r} in "
                                            f"{self.name}: {dst!r} holds objects", path=dst,
                                            hint="delete them first, or rename to another "
                                                 "prefix")
            for key in moved:
                self._objects[dst + key[len(src):]] = self._objects.pop(key)

    def lock(self, key: str, *, shared: bool = False) -> BlobLock:
        check_key(key)
        with self._mutex:
            holders = self._locks.get(key, 0)
            if holders < 0 or (holders and not shared):
                raise RootLockedError(f"the lock {key!r} of {self.name} is held",
                                      path=key, hint="wait for its holder to release it")
            self._locks[key] = holders + 1 if shared else -1
        return _Lock(self, key)

    def _unlock(self, key: str) -> None:
        with self._mutex:
            holders = self._locks.pop(key)
            if holders > 1:
                self._locks[key] = holders - 1

    def _put(self, key: str, value: bytes) -> None:
        with self._mutex:
            self._objects[key] = value


class _Writer(BlobWriter):
    def __init__(self, store: MemoryStore, key: str) -> None:
        self.store, self.key = store, key
        self._parts: list[bytes] | None = []

    def write(self, data: Buffer) -> None:
        if self._parts is None:
            raise closed(self.key)
        self._parts.append(bytes(flat(data)))

    def commit(self) -> None:
        if self._parts is not None:
            self.store._put(self.key, b"".join(self._parts))
            self._parts = None

    def abort(self) -> None:
        self._parts = None


class _Lock(BlobLock):
    def __init__(self, store: MemoryStore, key: str) -> None:
        self._store: MemoryStore | None = store
        self._key = key

    def release(self) -> None:
        if self._store is not None:
            self._store._unlock(self._key)
            self._store = None

    def note(self, data: bytes) -> None:
        if self._store is not None:
            self._store._put(self._key, bytes(data))
