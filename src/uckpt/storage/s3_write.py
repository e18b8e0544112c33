"""Writing objects: single PUTs and parallel multipart uploads (a mixin of
:class:`uckpt.storage.s3.S3Client`)."""
from __future__ import annotations

import base64
import concurrent.futures as cf
import logging
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Union

from ..errors import (CheckpointExistsError, CheckpointNotFoundError, ObjectStoreError,
                      UnsupportedObjectError)
from .s3_bodies import RangeBody, Source, open_source
from .s3_core import ClientCore

if TYPE_CHECKING:  # collections.abc.Buffer from Python 3.12 on
    from typing_extensions import Buffer

    from .s3_read import ObjectInfo

#: an uploaded range's source, as :func:`~.s3_bodies.open_source` gives it
Opened = Union[memoryview, int]

log = logging.getLogger("uckpt.storage.s3")


def b64_crc32c(value: int) -> str:
    """A CRC-32C as S3 headers write it: base64 of its 4 big-endian bytes."""
    return base64.b64encode(value.to_bytes(4, "big")).decode("ascii")


class Writes(ClientCore):
    """put / upload / copy; needs ``head``, ``size`` (:class:`~.s3_read.Reads`) and
    ``incomplete_uploads`` of the client."""

    if TYPE_CHECKING:
        def head(self, key: str) -> ObjectInfo: ...

        def size(self, key: str) -> int: ...

        def incomplete_uploads(self, prefix: str = "") -> List[Tuple[str, str, float]]: ...

    def put(self, key: str, data: Buffer, *, if_absent: bool = False,
            if_match: Optional[str] = None) -> str:
        """Writes ``data`` (a buffer) to ``key`` in one PUT and returns the new ETag. With
        ``if_absent``, only if no object ``key`` exists (``If-None-Match: *``), else
        CheckpointExistsError; an existing object with the same size and CRC-32C counts as
        this write (a retry of a PUT whose answer was lost), so give objects created this
        way unique content. With ``if_match``, only if the object's ETag is still that
        (``If-Match``), else ObjectStoreError with ``code == "PreconditionFailed"``."""
        url = self.url(key)
        try:
            size = memoryview(data).nbytes
        except TypeError:
            raise UnsupportedObjectError(f"put {url}: a {type(data).__name__} is not a "
                                         "buffer", path=url) from None
        with open_source(data, size, url) as view:
            return self._put_body(key, RangeBody(view, 0, size), if_absent=if_absent,
                                  if_match=if_match)

    def upload(self, key: str, source: Source, size: int) -> None:
        """Uploads the first ``size`` bytes of ``source`` (a buffer such as a NumPy array's
        memoryview, never copied whole; a local file path; or an open file descriptor) to
        ``key``: in one PUT up to ``part_bytes``, else as a multipart upload of
        ``threads`` parts in parallel, aborted if any part fails."""
        url = self.url(key)
        with open_source(source, size, url) as src:
            if size <= self.opts.part_bytes:
                self._put_body(key, RangeBody(src, 0, size))
            else:
                self._multipart(key, src, size)

    def _put_body(self, key: str, body: RangeBody, *, if_absent: bool = False,
                  if_match: Optional[str] = None) -> str:
        start, crc = time.monotonic(), body.crc32c()
        params: Dict[str, Any] = dict(Body=body, ContentLength=len(body),
                                      ChecksumCRC32C=b64_crc32c(crc))
        if if_absent:
            params["IfNoneMatch"] = "*"
        if if_match:
            params["IfMatch"] = if_match
        etag = ""
        try:
            etag = str(self._call("put_object", key, "writing", **params).get("ETag", ""))
        except ObjectStoreError as e:
            if not (if_absent and getattr(e, "code", None) in ("PreconditionFailed",
                                                               "ConditionalRequestConflict")):
                raise
            try:
                info = self.head(key)
            except CheckpointNotFoundError:  # a conflicting write that did not last
                info = None
            if info is None or (info.size, info.checksum_crc32c) != (len(body), b64_crc32c(crc)):
                raise CheckpointExistsError(f"{self.url(key)} already exists; it was not "
                                            "replaced (if_absent=True)", path=self.url(key),
                                            endpoint=self.endpoint) from None
            etag = info.etag
        log.debug("put %s (%d bytes, %.3f s)", self.url(key), len(body),
                  time.monotonic() - start)
        return etag

    def delete_if_match(self, key: str, etag: str) -> None:
        """Deletes ``key`` only if its ETag is still ``etag`` (``If-Match``), else
        ObjectStoreError with ``code == "PreconditionFailed"``."""
        self._call("delete_object", key, "deleting", IfMatch=etag)
        log.debug("deleted %s (If-Match %s)", self.url(key), etag)

    def _multipart(self, key: str, src: Opened, size: int) -> None:
        start, part = time.monotonic(), self.opts.part_size_for(size)
        ranges = [(n + 1, off, min(part, size - off)) for n, off in enumerate(range(0, size, part))]
        answer = self._call("create_multipart_upload", key, "starting an upload of",
                            ChecksumAlgorithm="CRC32C")
        upload_id = answer["UploadId"]
        try:
            if answer.get("ResponseMetadata", {}).get("RetryAttempts"):
                self._abort_orphans(key, upload_id)
            pool = cf.ThreadPoolExecutor(min(self.opts.threads, len(ranges)),
                                         thread_name_prefix="uckpt-s3-part")
            try:
                futures = [pool.submit(self._upload_part, key, upload_id, src, *r)
                           for r in ranges]
                cf.wait(futures, return_when=cf.FIRST_EXCEPTION)
                parts = [f.result() for f in futures]  # raises the first part's error
            finally:
                pool.shutdown(wait=True, cancel_futures=True)  # no part still running
            self._complete(key, upload_id, parts, size)
        except BaseException as e:
            self._abort(key, upload_id, e)
            raise
        log.debug("uploaded %s (%d bytes in %d parts, %.3f s)", self.url(key), size,
                  len(parts), time.monotonic() - start)

    def _abort_orphans(self, key: str, upload_id: str) -> None:
        """A CreateMultipartUpload that was retried may have started uploads whose answer
        was lost: abort the other incomplete uploads of ``key`` (one writer per key)."""
        for other_key, other_id, _ in self.incomplete_uploads(key):
            if other_key == key and other_id != upload_id:
                self._abort(key, other_id, "its CreateMultipartUpload was retried")

    def _upload_part(self, key: str, upload_id: str, src: Opened, number: int, offset: int,
                     length: int) -> Dict[str, Any]:
        body = RangeBody(src, offset, length)
        checksum = b64_crc32c(body.crc32c())
        answer = self._call("upload_part", key, f"uploading part {number} of", Body=body,
                            ContentLength=length, UploadId=upload_id, PartNumber=number,
                            ChecksumCRC32C=checksum)
        return {"PartNumber": number, "ETag": answer["ETag"], "ChecksumCRC32C": checksum}

    def _complete(self, key: str, upload_id: str, parts: List[Dict[str, Any]],
                  size: int) -> None:
        try:
            self._call("complete_multipart_upload", key, "completing the upload of",
                       UploadId=upload_id, MultipartUpload={"Parts": parts})
        except ObjectStoreError as e:
            # a retried request whose first attempt completed the upload finds it gone
            if getattr(e, "code", None) != "NoSuchUpload":
                raise
            info = self.head(key)
            if info.size != size or not info.etag.strip('"').endswith(f"-{len(parts)}"):
                raise

    def _abort(self, key: str, upload_id: str, cause: object) -> None:
        try:
            self._call("abort_multipart_upload", key, "aborting the upload of",
                       UploadId=upload_id)
            log.debug("aborted the upload %s of %s: %s", upload_id, self.url(key), cause)
        except Exception as e:  # the cause is what the caller must see
            log.warning("could not abort the failed upload %s of %s (%s); "
                        "abort_incomplete_uploads() removes it later", upload_id,
                        self.url(key), e)

    #: the largest object one CopyObject request copies (the S3 limit); larger ones are
    #: copied in parts (UploadPartCopy)
    copy_limit = 5 << 30

    def copy(self, src: str, dst: str) -> None:
        """Copies object ``src`` to ``dst`` inside the bucket, on the server (nothing
        passes through this process): one CopyObject, or parts of ``part_bytes`` (at
        most 10,000) for an object over :attr:`copy_limit`."""
        source = {"Bucket": self.bucket, "Key": src}
        size = self.size(src)
        if size <= self.copy_limit:
            self._call("copy_object", dst, f"copying {self.url(src)} to", CopySource=source)
            return
        part = max(self.opts.part_bytes, -(-size // 10_000))
        upload_id = self._call("create_multipart_upload", dst, "starting a copy to")["UploadId"]
        parts = []
        try:
            for number, offset in enumerate(range(0, size, part), 1):
                end = min(offset + part, size) - 1
                answer = self._call("upload_part_copy", dst, f"copying part {number} to",
                                    CopySource=source, CopySourceRange=f"bytes={offset}-{end}",
                                    UploadId=upload_id, PartNumber=number)
                parts.append({"PartNumber": number,
                              "ETag": answer["CopyPartResult"]["ETag"]})
            self._complete(dst, upload_id, parts, size)
        except BaseException as e:
            self._abort(dst, upload_id, e)
            raise
