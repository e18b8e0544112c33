"""A blob store in an S3 bucket, below a key prefix, over the boto3 client of
:mod:`uckpt.storage.s3` (signing, retries, ranged reads resumed where they broke,
parallel multipart uploads with a CRC-32C per part, errors mapped into
:mod:`uckpt.errors`). ``create_if_absent`` is a PUT with ``If-None-Match: *``."""
from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from ...errors import CheckpointExistsError
from ..s3 import S3Client
from .base import (BlobStore, BlobWriter, Listing, check_below_root, check_key, check_offset,
                   check_prefix, closed, flat, is_buffer, writable_view)

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from .base import Data


class S3Store(BlobStore):
    """Keys below ``prefix`` (``""``: the whole bucket) of ``client``'s bucket."""

    conditional_create = True
    multipart: ClassVar[bool] = True

    def __init__(self, client: S3Client, prefix: str = "") -> None:
        self.client = client
        self.prefix = check_prefix(prefix)

    @classmethod
    def from_url(cls, url: str, storage_options: Mapping[str, Any] | None = None
                 ) -> S3Store:
        """The store of ``s3://bucket/prefix``."""
        client, prefix = S3Client.from_url(url, storage_options)
        return cls(client, prefix)

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

    def delete(self, key: str) -> None:
        self.client.delete([self._key(key)])

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
