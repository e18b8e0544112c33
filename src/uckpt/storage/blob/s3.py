"""A blob store in an S3 bucket, below a key prefix, over the boto3 client of
:mod:`uckpt.storage.s3` (signing, retries, ranged reads resumed where they broke,
parallel multipart uploads with a CRC-32C per part, errors mapped into
:mod:`uckpt.errors`). ``create_if_absent`` is a PUT with ``If-None-Match: *``; versions
are ETags (``replace_if`` and ``delete_if`` send ``If-Match``) and the clock is the
server's (``Last-Modified`` against the ``Date`` of the answer)."""
from __future__ import annotations

import concurrent.futures as cf
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from ...errors import CheckpointExistsError, CheckpointNotFoundError, UckptError
from ..s3 import S3Client
from ..s3_config import Connection, S3Options
from ..s3_url import parse_url
from .base import (BlobStore, BlobWriter, Listing, Version, check_below_root, check_key,
                   check_offset, check_prefix, closed, flat, is_buffer, writable_view)

log = logging.getLogger("uckpt.storage.blob.s3")

#: bytes a reader asks for in one ranged GET (each block is checksummed as it lands)
READ_BLOCK_BYTES = 16 << 20

#: what a client's connection depends on besides its options
_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
        "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION",
        "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE")
_connections: dict[tuple[Any, ...], Connection] = {}
_connections_guard = threading.Lock()


def client_for(bucket: str, storage_options: Mapping[str, Any] | None = None) -> S3Client:
    """A client for ``bucket``; clients of equal options (and AWS environment) share one
    boto3 client and its connection pool."""
    opts = S3Options.from_dict(storage_options)
    key = (opts, tuple(os.environ.get(name) for name in _ENV))
    with _connections_guard:
        conn = _connections.get(key)
        if conn is None:
            conn = _connections[key] = Connection(opts)
    return S3Client(bucket, connection=conn)


def _code(e: BaseException) -> str | None:
    code = getattr(e, "code", None)
    return code if isinstance(code, str) else None

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from .base import Data


class S3Store(BlobStore):
    """Keys below ``prefix`` (``""``: the whole bucket) of ``client``'s bucket."""

    conditional_create = True
    multipart: ClassVar[bool] = True
    versioned: ClassVar[bool] = True

    def __init__(self, client: S3Client, prefix: str = "") -> None:
        self.client = client
        self.prefix = check_prefix(prefix)
        self.read_block_bytes = READ_BLOCK_BYTES
        self.read_threads = client.opts.threads  # as many requests as an upload's parts

    @classmethod
    def from_url(cls, url: str, storage_options: Mapping[str, Any] | None = None
                 ) -> S3Store:
        """The store of ``s3://bucket/prefix`` (sharing connections: :func:`client_for`)."""
        bucket, prefix = parse_url(url)
        return cls(client_for(bucket, storage_options), prefix)

    def _key(self, key: str) -> str:
        return self.prefix + check_key(key)

    def read_into(self, key: str, offset: int, buf: Buffer) -> int:
        view = writable_view(key, buf)
        offset = check_offset(key, offset)
        if not len(view):
            self.size(key)  # a missing key raises
            return 0
        return int(self.client.get_range(self._key(key), offset, len(view), view))

    def size(self, key: str) -> int:
        return int(self.client.size(self._key(key)))

    def list(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        found = self.client.list(self.prefix + check_prefix(prefix), delimiter=None).objects
        cut = len(self.prefix)
        return ((k[cut:], size) for k, size in found.items())

    def list_dir(self, prefix: str = "") -> Listing:
        found = self.client.list(self.prefix + check_prefix(prefix))
        cut = len(self.prefix)
        return Listing(sorted(k[cut:] for k in found.objects),
                       sorted(p[cut:] for p in found.prefixes))

    def open_writer(self, key: str) -> BlobWriter:
        return _Writer(self.client, key, self._key(key))

    def write(self, key: str, data: Data) -> None:
        if not is_buffer(data):  # pieces: streamed
            super().write(key, data)
            return
        view = flat(data)  # type: ignore[arg-type]
        self.client.upload(self._key(key), view, len(view))  # in parallel parts, no copy

    def create_if_absent(self, key: str, data: Buffer) -> bool:
        try:
            self.client.put(self._key(key), flat(data), if_absent=True)
        except CheckpointExistsError:
            return False
        return True

    def delete(self, key: str, *, durable: bool = True) -> None:
        self.client.delete([self._key(key)])

    def age(self, key: str) -> float | None:
        """From the listing's ``LastModified`` (against this host's clock, as the
        listing carries no ``Date``)."""
        modified = self.client.list(self._key(key), delimiter=None).modified.get(self._key(key))
        if modified is None:
            raise CheckpointNotFoundError(f"no blob {key!r} at {self.client.url(self._key(key))}",
                                          path=self.client.url(self._key(key)))
        return max(0.0, time.time() - modified)

    def read_versioned(self, key: str, cap: int) -> Version:
        v = self.client.get_versioned(self._key(key), cap, what="writer lock")
        return Version(bytes(v.data), str(v.etag), float(v.modified), float(v.server_now))

    def create_versioned(self, key: str, data: Buffer) -> str | None:
        try:
            return str(self.client.put(self._key(key), flat(data), if_absent=True))
        except CheckpointExistsError:
            return None

    def replace_if(self, key: str, data: Buffer, tag: str) -> str | None:
        try:
            return str(self.client.put(self._key(key), flat(data), if_match=tag))
        except UckptError as e:
            if _code(e) == "NotImplemented":  # the store has no conditional writes
                log.warning("%s does not take If-Match; %s is checked by reading it back "
                            "only", self.client.endpoint, self.client.url(self._key(key)))
                return str(self.client.put(self._key(key), flat(data)))
            if _code(e) not in ("PreconditionFailed", "ConditionalRequestConflict"):
                raise
            return None

    def delete_if(self, key: str, tag: str) -> bool:
        try:
            self.client.delete_if_match(self._key(key), tag)
        except UckptError as e:
            if _code(e) == "NotImplemented":  # no conditional delete
                self.client.delete([self._key(key)])
                return True
            if _code(e) != "PreconditionFailed":
                raise
            return False
        return True

    def copy(self, src: str, dst: str) -> None:
        """On the server (CopyObject; UploadPartCopy beyond ``client.copy_limit``)."""
        self.client.copy(self._key(src), self._key(dst))

    def abort_incomplete(self, prefix: str, older_than_s: float,
                         keep: Iterable[str] = ()) -> int:
        kept = [self.prefix + k for k in keep]
        aborted = 0
        for key, upload_id, age in self.client.incomplete_uploads(self.prefix + prefix):
            if age >= older_than_s and not any(key.startswith(k) for k in kept):
                self.client._abort(key, upload_id, f"an incomplete upload {age:.0f} s old")
                log.info("aborted an incomplete upload of %s (%.0f s old)",
                         self.client.url(key), age)
                aborted += 1
        return aborted

    def delete_prefix(self, prefix: str) -> None:
        self.client.delete_prefix(self.prefix + check_below_root(
            prefix, self.client.url(self.prefix)))

    def close(self) -> None:
        self.client.close()


class _Writer(BlobWriter):
    """Gathers ``part_bytes`` at a time: an object that fits is one PUT, a larger one a
    multipart upload of ``threads`` parts in flight (so at most that many parts are
    held), aborted when anything fails."""

    def __init__(self, client: S3Client, key: str, full_key: str) -> None:
        self.client, self.key, self._full = client, key, full_key
        self._part = bytearray()
        self._upload: str | None = None
        self._pool: cf.ThreadPoolExecutor | None = None
        self._futures: list[cf.Future[dict[str, Any]]] = []
        self._size = 0
        self._open = True

    def write(self, data: Buffer) -> None:
        view = flat(data)
        if not self._open:
            raise closed(self.key)
        limit = self.client.opts.part_bytes
        while view:
            n = min(len(view), limit - len(self._part))
            self._part += view[:n]
            view = view[n:]
            if len(self._part) == limit:
                self._send()

    def _send(self) -> None:
        if self._upload is None:
            answer = self.client._call("create_multipart_upload", self._full,
                                       "starting an upload of", ChecksumAlgorithm="CRC32C")
            self._upload = str(answer["UploadId"])
            self._pool = cf.ThreadPoolExecutor(self.client.opts.threads,
                                               thread_name_prefix="uckpt-s3-part")
        assert self._pool is not None
        if len(self._futures) - sum(f.done() for f in self._futures) >= \
                self.client.opts.threads:
            cf.wait([f for f in self._futures if not f.done()],
                    return_when=cf.FIRST_COMPLETED)
        for f in self._futures:
            if f.done():
                f.result()  # the first failed part's error
        part, self._part = memoryview(bytes(self._part)), bytearray()
        self._futures.append(self._pool.submit(
            self.client._upload_part, self._full, self._upload, part,
            len(self._futures) + 1, 0, len(part)))
        self._size += len(part)

    def commit(self) -> None:
        if not self._open:
            return
        try:
            if self._upload is None:
                self.client.put(self._full, self._part)
            else:
                if self._part:
                    self._send()
                parts = [f.result() for f in self._futures]
                self.client._complete(self._full, self._upload, parts, self._size)
                self._upload = None
        finally:
            self.abort()

    def abort(self) -> None:
        self._open, self._part = False, bytearray()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._upload is not None:
            self.client._abort(self._full, self._upload, "the writer was aborted")
            self._upload = None
