"""S3-compatible object stores: a root is a key prefix of a bucket (``s3://bucket/run1``).

There is no rename and no lock in an object store, so (docs/format.md, section 3.1):

* **the manifest object, written last, is the commit.** A save uploads every data file
  (``<root>/<name>/data-NNNNN.bin``, one multipart upload per file, parts in
  parallel, each part sent with its CRC-32C), then PUTs ``<root>/<name>/manifest.json``
  (conditionally: only if none exists). Readers list and open only checkpoints whose
  manifest exists, and trust one only once it verifies (its own CRC-32C, then every
  chunk's). A PUT is atomic: a manifest is there whole or not at all;
* **deleting un-commits first**: the manifest object is deleted before the data objects,
  so a reader sees the checkpoint whole or not at all;
* **debris** (data objects under a ``step_N`` prefix without a manifest: a save or a
  deletion that died) is removed by the root's writer only, never one of its own
  process's live saves, and only once its newest object is older than
  ``knobs.debris_expiry_s`` (an hour by default): there is no ``flock`` to tell a live save
  of another process from a dead one, so age decides. Incomplete multipart uploads under
  the root are aborted by the same rule.

The writer lock of a root is an object, ``<root>/.uckpt-writer.lock``, held under a
lease that its holder renews and that another writer takes over once it has expired
(:class:`~uckpt.storage.object_lock.ObjectWriterLock`). A writer that lost its lease
commits and deletes nothing more: :class:`ObjectStore` checks it first.
"""
from __future__ import annotations

import logging
import os
import re
import tempfile
import threading
import time
from typing import Dict, Hashable, List, Optional, Set, Tuple

from .. import fsutil, knobs
from ..errors import (CheckpointExistsError, CheckpointNotFoundError, ManifestError,
                      NotACheckpointError)
from ..format import MANIFEST_NAME
from . import archive_objects, base
from .archive import hidden_steps
from .base import (CHECKPOINT, STEP_NAME, TEMPORARY, CheckpointSink, CheckpointSource, Entry,
                   Store, step_of)
from .object_lock import CONCURRENT_DIR, LOCK_NAME, ObjectWriterLock  # noqa: F401 (re-exported)
from .s3 import S3Client
from .s3_bodies import Gather, Readable
from .s3_config import Connection, S3Options
from .s3_url import join_key, parse_url, url_of

log = logging.getLogger("uckpt.storage.objects")

#: what a data file of a step may be called (anything else in a step prefix is not ours)
_DATA_FILE = re.compile(r"^data-\d+\.bin$")
#: bytes a reader asks for in one ranged GET (each block is checksummed as it lands)
READ_BLOCK_BYTES = 16 << 20

# key prefixes of this process's live saves: never debris
_live: Set[Tuple[str, str]] = set()
# (bucket, key prefix) of this process's failed saves whose objects could not be removed
# then (the store was unreachable): removed by the next save to that root
_failed: Set[Tuple[str, str]] = set()
_live_guard = threading.Lock()

# -- clients, shared by every store of the same options ------------------------------------------
_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
        "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION",
        "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE")
_connections: Dict[tuple, Connection] = {}
_connections_guard = threading.Lock()


def client_for(bucket: str, storage_options=None) -> S3Client:
    """A client for ``bucket``; clients of equal options (and AWS environment) share one
    boto3 client and its connection pool."""
    opts = S3Options.from_dict(storage_options)
    key = (opts, tuple(os.environ.get(name) for name in _ENV))
    with _connections_guard:
        conn = _connections.get(key)
        if conn is None:
            conn = _connections[key] = Connection(opts)
    return S3Client(bucket, connection=conn)


# -- reading ----------------------------------------------------------------------------------
class ObjectSource(CheckpointSource):
    """A checkpoint under ``prefix`` (no trailing ``/``) of a bucket."""

    def __init__(self, client: S3Client, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self.where = client.url(prefix)
        self.block_bytes = max(READ_BLOCK_BYTES, knobs.read_block_bytes)
        # requests in flight at once: as many as the parts of an upload
        self.read_threads = self.verify_threads = max(knobs.io_threads, client.opts.threads)
        self._etags: Dict[str, str] = {}

    def manifest_bytes(self) -> bytes:
        try:
            return self.client.get(join_key(self.prefix, MANIFEST_NAME), base.MAX_MANIFEST_BYTES,
                                   what="manifest", too_large=ManifestError)
        except CheckpointNotFoundError as e:
            if getattr(e, "code", None) == "NoSuchBucket" or "no bucket" in str(e):
                raise
            raise NotACheckpointError(
                f"{self.where!r} is not a committed uckpt checkpoint: it has no "
                f"{MANIFEST_NAME}", path=self.where,
                hint="a save that was interrupted leaves no manifest; use an earlier "
                     "checkpoint (CheckpointManager.restore() picks the newest committed "
                     "one)") from None

    def file_where(self, name: str) -> str:
        return self.client.url(join_key(self.prefix, name))

    def sibling(self, name: str) -> "ObjectSource":
        """The checkpoint under prefix ``name`` beside this one (a base of an incremental
        checkpoint)."""
        parent = self.prefix.rsplit("/", 1)[0] if "/" in self.prefix else ""
        prefix = join_key(parent, name)
        if not self.client.exists(join_key(prefix, MANIFEST_NAME)):
            raise base.uncommitted_base(self.client.url(prefix), "it has no manifest object")
        return ObjectSource(self.client, prefix)

    def open_file(self, name: str) -> int:
        try:
            info = self.client.head(join_key(self.prefix, name))
        except CheckpointNotFoundError:
            where = self.file_where(name)
            raise CheckpointNotFoundError(f"data file {where!r} listed in the manifest is "
                                          "missing", path=where) from None
        self._etags[name] = info.etag
        return info.size

    def read_into(self, name: str, buf, offset: int) -> int:
        view = memoryview(buf).cast("B")
        return self.client.get_range(join_key(self.prefix, name), offset, len(view), view,
                                     if_match=self._etags.get(name) or None)


class _SourceFile(Readable):
    """A data file of any source, read on demand (a copy between object stores)."""

    def __init__(self, source: CheckpointSource, name: str, size: int) -> None:
        self.source, self.name = source, name
        self.size = min(size, source.open_file(name))

    def pread(self, n: int, offset: int) -> bytearray:
        buf = bytearray(max(0, min(n, self.size - offset)))
        got = self.source.read_into(self.name, buf, offset) if buf else 0
        return buf[:got]


# -- writing ----------------------------------------------------------------------------------
class ObjectSink(CheckpointSink):
    """A save of checkpoint ``name``: data objects first, the manifest object last."""

    def __init__(self, store: "ObjectStore", name: str) -> None:
        self.store = store
        self.client = store.client
        self.prefix = store.key(name)
        self.where = self.client.url(self.prefix)
        self.keys: List[str] = []
        self._live = (self.client.bucket, self.prefix + "/")
        with _live_guard:
            _live.add(self._live)

    def view(self) -> str:
        return "object-store"  # every rank sees the same objects

    def _key(self, name: str) -> str:
        key = join_key(self.prefix, name)
        self.keys.append(key)
        return key

    def write_pieces(self, name, size, pieces) -> None:
        self.client.upload(self._key(name), Gather(pieces, size), size)

    def write_image(self, name, image, size) -> None:
        self.client.upload(self._key(name), image, size)

    def write_stream(self, name, pieces, reserve=None) -> None:
        """Without ``reserve`` (a piece's memory may be reused once the next is asked for):
        each piece copied as it comes into an anonymous local temporary file, uploaded from
        there in parallel parts, so memory stays a constant whatever the file's size. With
        it: gathered (the pieces stay valid) and uploaded as :meth:`write_pieces` does."""
        if reserve is not None:
            super().write_stream(name, pieces, reserve)
            return
        with tempfile.TemporaryFile(prefix="uckpt-upload-") as spool:
            fd = spool.fileno()
            end = 0
            for offset, data in pieces:
                fsutil.pwritev_all(fd, [memoryview(data).cast("B")], offset)
                end = offset + memoryview(data).nbytes
            os.ftruncate(fd, end)  # gaps (and none after the last piece) are zeros
            self.client.upload(self._key(name), fd, end)

    def copy_file(self, source: CheckpointSource, name: str, size: int) -> None:
        from .local import LocalSource

        key = self._key(name)
        actual = source.open_file(name)
        if actual != size:
            raise base.wrong_size(source.file_where(name), actual, size)
        if isinstance(source, LocalSource):
            self.client.upload(key, source.fd(name), size)  # parallel preads of the file
        else:
            self.client.upload(key, _SourceFile(source, name, size), size)

    def written(self, manifest) -> CheckpointSource:
        return ObjectSource(self.client, self.prefix)

    def commit(self, manifest_bytes: bytes, overwrite: bool = False) -> None:
        key = join_key(self.prefix, MANIFEST_NAME)
        self.store.check_writer()
        try:
            self.client.put(key, manifest_bytes, if_absent=not overwrite)
        except CheckpointExistsError:
            from .local import committed_meanwhile

            raise committed_meanwhile(self.where) from None
        self.release()

    def release(self) -> None:
        with _live_guard:
            _live.discard(self._live)

    def abort(self) -> None:
        """Remove the data objects this rank wrote, unless a manifest committed them
        meanwhile (another save of the same checkpoint won the race); if the store cannot
        be reached, the next save to this root removes them."""
        try:
            if self.keys and not self.client.exists(join_key(self.prefix, MANIFEST_NAME)):
                self.client.delete(self.keys)
            self.client.abort_incomplete_uploads(self.prefix + "/")
        except Exception as e:  # noqa: BLE001 - the failure being handled is what matters
            with _live_guard:
                _failed.add(self._live)
            log.warning("could not remove the objects of a failed save under %s (%s); the "
                        "next save to this root removes them", self.where, e)
        finally:
            self.release()


# -- the root ---------------------------------------------------------------------------------
class ObjectStore(Store):
    """A root ``s3://bucket/prefix`` (the prefix may be empty: the bucket's root)."""

    def __init__(self, client: S3Client, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self.where = client.url(prefix)
        #: the writer lock this process holds on the root, if any (set by the lock)
        self.lease: Optional[ObjectWriterLock] = None

    def check_writer(self) -> None:
        """Raise WriterLeaseLostError if this process held the root's writer lock and lost
        its lease: it must not commit or delete beside a new holder."""
        if self.lease is not None:
            self.lease.check()

    @classmethod
    def from_url(cls, url: str, storage_options=None) -> "ObjectStore":
        bucket, prefix = parse_url(url)
        return cls(client_for(bucket, storage_options), prefix)

    def key(self, *names: str) -> str:
        return join_key(self.prefix, *names)

    def location(self, name: str) -> str:
        return url_of(self.client.bucket, self.key(name))

    def acts_here(self, rank: int) -> bool:
        return rank == 0  # one view for all ranks

    def exists(self) -> bool:
        return True  # a prefix holds whatever is put under it

    def identity(self) -> Hashable:
        return self.where.rstrip("/")

    def itself(self) -> Optional[Entry]:
        listing = self.client.list(self._under(), delimiter="/")
        if self.key(MANIFEST_NAME) not in listing.objects:
            return None
        name = self.prefix.rpartition("/")[2]
        files = {k[len(self._under()):]: size for k, size in listing.objects.items()}
        return Entry(name, CHECKPOINT, self.where, step=step_of(name),
                     size=sum(files.values()), files=files)

    def entries(self) -> List[Entry]:
        out = []
        for name, objects in sorted(self._listing().items()):
            files = {f: size for f, (size, _) in objects.items()}
            step = step_of(name)
            entry = Entry(name, CHECKPOINT, self.location(name), step=step,
                          size=sum(files.values()), files=files)
            if MANIFEST_NAME not in files:
                if step is None:
                    continue  # not a checkpoint's objects
                entry.kind = TEMPORARY  # the manifest object is the commit (format.md 3.1)
                entry.reason = "objects of a save in progress or interrupted (no manifest)"
            out.append(entry)
        return out

    def still_there(self, entry: Entry) -> bool:
        return self.has(entry.name)  # a deletion removes the manifest first

    def _under(self) -> str:
        return self.prefix + "/" if self.prefix else ""

    def _listing(self):
        """Every object under the root: {step name: {file name: (size, modified)}}."""
        listing = self.client.list(self._under(), delimiter=None)
        out: Dict[str, Dict[str, Tuple[int, float]]] = {}
        start = len(self._under())
        for key, size in listing.objects.items():
            parts = key[start:].split("/")
            if len(parts) == 2:
                out.setdefault(parts[0], {})[parts[1]] = (size, listing.modified.get(key, 0.0))
        return out

    def steps(self) -> List[int]:
        steps = sorted(int(m.group(1)) for name, files in self._listing().items()
                       for m in [STEP_NAME.match(name)] if m and MANIFEST_NAME in files)
        hidden = hidden_steps(self) if steps else ()
        return [s for s in steps if s not in hidden] if hidden else steps

    def has(self, name: str) -> bool:
        return self.client.exists(self.key(name, MANIFEST_NAME))

    def source(self, name: str, manifest=None) -> ObjectSource:
        return ObjectSource(self.client, self.key(name))

    def check_target(self, name: str, overwrite: bool) -> None:
        where = self.location(name)
        listing = self.client.list(self.key(name) + "/", delimiter=None).objects
        names = {k.rsplit("/", 1)[-1] for k in listing}
        if MANIFEST_NAME in names and not overwrite:
            raise CheckpointExistsError(
                f"{where!r} already holds a committed checkpoint", path=where,
                hint="pass overwrite=True to replace it, or save to another location")
        foreign = sorted(n for n in names if n != MANIFEST_NAME and not _DATA_FILE.match(n))
        nested = [k for k in listing if "/" in k[len(self.key(name)) + 1:]]
        if foreign or nested:
            raise CheckpointExistsError(
                f"{where!r} holds objects that are not a uckpt checkpoint's (e.g. "
                f"{(foreign or nested)[0]!r}); refusing to write there", path=where,
                hint="choose an empty or new prefix")

    def sink(self, name: str, overwrite: bool = False, shared: bool = False) -> ObjectSink:
        self._clean_failed_saves()
        self.check_target(name, overwrite)
        if overwrite and self.has(name):
            # no rename here: the old checkpoint is un-committed first, so that its manifest
            # never describes data objects being replaced (docs/format.md section 3.1)
            self.client.delete([self.key(name, MANIFEST_NAME)])
            log.info("overwrite of %s: the old checkpoint is no longer committed",
                     self.location(name))
        return ObjectSink(self, name)

    def _clean_failed_saves(self) -> None:
        """Remove what this process's failed saves under this root left while the store
        could not be reached (they are dead: no other process writes them)."""
        with _live_guard:
            mine = [f for f in _failed if f[0] == self.client.bucket and
                    f[1].startswith(self._under()) and f not in _live]
        for bucket, prefix in mine:
            if not self.client.exists(prefix + MANIFEST_NAME):
                n = self.client.delete_prefix(prefix)
                log.info("removed %s: %d objects of a failed save of this process",
                         self.client.url(prefix), n)
            with _live_guard:
                _failed.discard((bucket, prefix))

    def join_sink(self, name: str, token: str) -> ObjectSink:
        return ObjectSink(self, name)

    def delete(self, name: str) -> bool:
        self.check_writer()
        key = self.key(name, MANIFEST_NAME)
        if not self.client.exists(key):
            return False
        self.client.delete([key])  # un-commit first: readers stop seeing it
        self.client.delete_prefix(self.key(name) + "/")
        return True

    def remove_debris(self) -> List[str]:
        """Data objects under ``step_N/`` prefixes without a manifest, and incomplete
        uploads, older than ``knobs.debris_expiry_s`` and not this process's live saves."""
        now, removed = time.time(), []
        with _live_guard:
            live = {prefix for bucket, prefix in _live if bucket == self.client.bucket}
        for name, files in sorted(self._listing().items()):
            if not STEP_NAME.match(name) or MANIFEST_NAME in files:
                continue
            prefix = self.key(name) + "/"
            age = now - max(modified for _, modified in files.values())
            if prefix in live:
                log.debug("kept %s: a save of this process is writing it", prefix)
            elif age < knobs.debris_expiry_s:
                log.debug("kept %s: it has no manifest, but its newest object is only "
                          "%.0f s old (a save of another process may be writing it)",
                          self.client.url(prefix), age)
            else:
                self.client.delete(prefix + f for f in files)
                removed.append(name)
                log.info("removed %s: %d objects of an interrupted save or deletion (no "
                         "manifest; newest object %.0f s old)", self.client.url(prefix),
                         len(files), age)
        for key, upload_id, age in self.client.incomplete_uploads(self._under()):
            if age >= knobs.debris_expiry_s and not any(key.startswith(p) for p in live):
                self.client._abort(key, upload_id, f"an incomplete upload {age:.0f} s old")
                log.info("aborted an incomplete upload of %s (%.0f s old)",
                         self.client.url(key), age)
        return removed

    def writer_lock(self, job: str, shared: bool) -> ObjectWriterLock:
        return ObjectWriterLock(self, job, shared)

    def prepare_root(self) -> None:
        self.client._check_bucket()

    def record(self, name: str) -> Optional[bytes]:
        return archive_objects.read_record(self, name)

    def put_record(self, name: str, data: bytes) -> None:
        self.client.put(self.key(name), data)

    def drop_record(self, name: str) -> None:
        self.client.delete([self.key(name)])

    def archive(self, name: str, into: str, keep: bool = False) -> bool:
        return archive_objects.archive(self, name, into, keep)

    def archives(self) -> List[str]:
        return archive_objects.archives(self)

    def within(self, into: str) -> "ObjectStore":
        return ObjectStore(self.client, self.key(into))

