"""A small synchronous client for S3-compatible object stores, over boto3.

boto3 (botocore) does what a client must not re-implement: request signing, the
credential chain, connection pooling, and retries of transient failures (5xx answers,
throttling, timeouts, connection resets) with exponential backoff and jitter. This module
adds what uckpt needs on top:

* parallel multipart uploads straight from a caller's buffer or a local file, each part
  sent with its CRC-32C (``x-amz-checksum-crc32c``, checked by the store), an upload that
  fails aborted so that it leaves no incomplete upload behind;
* range reads streamed into a caller's buffer, resumed where they stopped when the
  connection breaks mid-body (botocore retries a request only until its headers arrive);
* the CRC-32C of what the store holds, computed by reading it back;
* botocore's exceptions mapped into :mod:`uckpt.errors`, every message naming the
  ``s3://`` URL of the object (:mod:`uckpt.storage.s3_errors`).

One :class:`S3Client` may be shared by any number of threads (boto3 clients are
thread-safe; the boto3 session is used only while the client is built). Uploads and
deletions are logged at DEBUG and failed attempts (retried by botocore, or reads
resumed here) at INFO, on the logger ``uckpt.storage.s3``.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Dict, Iterable, List, Mapping, NamedTuple, Optional, Tuple

from ..errors import ObjectStoreError, StorageConfigError
from .s3_config import S3Options
from .s3_read import ObjectInfo, Reads
from .s3_url import parse_url
from .s3_write import Writes, b64_crc32c

__all__ = ["Listing", "ObjectInfo", "S3Client", "S3Options", "b64_crc32c", "parse_url"]

log = logging.getLogger("uckpt.storage.s3")

DELETE_BATCH = 1000            # keys per DeleteObjects request (the S3 maximum)


class Listing(NamedTuple):
    prefixes: List[str]        # the common prefixes (sub-"directories"), each ending in "/"
    objects: Dict[str, int]    # key -> size in bytes
    modified: Dict[str, float]  # key -> when it was last written (seconds since the epoch)


class S3Client(Reads, Writes):
    """Objects of one bucket. ``storage_options``: see :class:`S3Options` (``endpoint_url``,
    ``key``, ``secret``, ``token``, ``region``, ``max_attempts``, ``retry_mode``,
    ``max_pool_connections``, ``part_bytes``, ``threads``, ``connect_timeout``,
    ``read_timeout``, ``page_size``). Keys are bucket-relative (``"run1/step_1/x.bin"``).
    """

    @classmethod
    def from_url(cls, url: str, storage_options: Optional[Mapping[str, Any]] = None
                 ) -> Tuple["S3Client", str]:
        """The client for the bucket of ``url`` and the key prefix ``url`` names."""
        bucket, prefix = parse_url(url)
        return cls(bucket, storage_options), prefix

    def sibling(self, bucket: str) -> "S3Client":
        """A client for another bucket sharing this one's connections and options."""
        return S3Client(bucket, connection=self._shared)

    @property
    def failed_attempts(self) -> int:
        return self._shared.failed_attempts

    @property
    def resumed_reads(self) -> int:
        return self._shared.resumed_reads

    def close(self) -> None:
        """Closes the connections (of every sibling too)."""
        self._s3.close()

    def __enter__(self) -> "S3Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- listing and deleting ------------------------------------------------------------
    def list(self, prefix: str = "", delimiter: Optional[str] = "/") -> Listing:
        """Common prefixes and objects (key -> size) under ``prefix``, every page of them;
        ``delimiter=None`` lists every object below ``prefix``, however deep."""
        params = {"Bucket": self.bucket, "Prefix": prefix,
                  "PaginationConfig": {"PageSize": self.opts.page_size}}
        if delimiter:
            params["Delimiter"] = delimiter
        prefixes: List[str] = []
        objects: Dict[str, int] = {}
        modified: Dict[str, float] = {}
        try:
            for page in self._s3.get_paginator("list_objects_v2").paginate(**params):
                prefixes.extend(p["Prefix"] for p in page.get("CommonPrefixes", ()))
                for o in page.get("Contents", ()):
                    objects[o["Key"]] = o["Size"]
                    if "LastModified" in o:
                        modified[o["Key"]] = o["LastModified"].timestamp()
        except Exception as e:
            raise self._error(e, self.url(prefix), "listing") from e
        return Listing(prefixes, objects, modified)

    def delete(self, keys: Iterable[str]) -> None:
        """Deletes ``keys`` (missing ones are no error), 1000 per request."""
        keys = list(keys)
        for i in range(0, len(keys), DELETE_BATCH):
            batch = keys[i:i + DELETE_BATCH]
            answer = self._call("delete_objects", None, "deleting objects such as",
                                url=self.url(batch[0]),
                                Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True})
            failed = answer.get("Errors") or []
            if failed:
                from botocore.exceptions import ClientError

                first = failed[0]
                error = ClientError({"Error": {"Code": first.get("Code"),
                                               "Message": first.get("Message")}},
                                    "DeleteObjects")
                raise self._error(error, self.url(first.get("Key", "")),
                                  f"deleting ({len(failed)} of {len(batch)} keys failed)")
            for k in batch:
                log.debug("deleted %s", self.url(k))

    def delete_prefix(self, prefix: str) -> int:
        """Removes everything under ``prefix`` (which must end in ``/``): incomplete
        multipart uploads first, then every object. Returns the number of objects."""
        if not prefix or not prefix.endswith("/"):
            raise StorageConfigError(f"delete_prefix({prefix!r}) on {self.url()}: the prefix "
                                     "must be non-empty and end in '/' (so that 'step_1/' "
                                     "cannot take 'step_10/' with it)", path=self.url(prefix))
        self.abort_incomplete_uploads(prefix)
        keys = sorted(self.list(prefix, delimiter=None).objects)
        self.delete(keys)
        return len(keys)

    def incomplete_uploads(self, prefix: str = "") -> List[Tuple[str, str, float]]:
        """Multipart uploads started and neither completed nor aborted under ``prefix``:
        (key, upload id, seconds since it started)."""
        found = []
        try:
            pages = self._s3.get_paginator("list_multipart_uploads").paginate(
                Bucket=self.bucket, Prefix=prefix)
            for page in pages:
                for u in page.get("Uploads", ()):
                    age = time.time() - u["Initiated"].timestamp() if "Initiated" in u else 0.0
                    found.append((u["Key"], u["UploadId"], age))
        except Exception as e:
            raise self._error(e, self.url(prefix), "listing the uploads under") from e
        return found

    def abort_incomplete_uploads(self, prefix: str = "", older_than_s: float = 0.0) -> int:
        """Aborts the incomplete multipart uploads under ``prefix`` started at least
        ``older_than_s`` seconds ago (never those of a save still running, when that
        bound exceeds how long a save may take). Returns how many were aborted."""
        aborted = 0
        for key, upload_id, age in self.incomplete_uploads(prefix):
            if age < older_than_s:
                continue
            try:
                self._call("abort_multipart_upload", key, "aborting the upload of",
                           UploadId=upload_id)
            except ObjectStoreError as e:
                if getattr(e, "code", None) != "NoSuchUpload":
                    raise
            aborted += 1
            log.debug("aborted the incomplete upload %s of %s", upload_id, self.url(key))
        return aborted
