"""Reading objects: HEAD, whole small objects, ranges streamed into a caller's buffer
(resumed when a response breaks), and the CRC-32C of what the store holds (a mixin of
:class:`uckpt.storage.s3.S3Client`)."""
from __future__ import annotations

import logging
import time
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any, Dict, NamedTuple, Optional, Type

from .. import knobs
from ..codecs.checksum import crc32c
from ..errors import (CheckpointNotFoundError, CorruptCheckpointError, ObjectStoreError,
                      TruncatedDataError, UckptError, UnsupportedObjectError)
from .s3_core import ClientCore
from .s3_errors import is_transport_error

if TYPE_CHECKING:  # collections.abc.Buffer from Python 3.12 on
    from typing_extensions import Buffer

log = logging.getLogger("uckpt.storage.s3")

VERIFY_BLOCK_BYTES = 8 << 20   # bytes per ranged GET when reading an object back


class ObjectInfo(NamedTuple):
    key: str
    size: int
    etag: str
    #: the store's ``x-amz-checksum-crc32c`` (base64; ``"...-N"`` for an N-part upload), or None
    checksum_crc32c: Optional[str]


class Versioned(NamedTuple):
    """A small object read whole, with what the server said about it and about its clock."""
    data: bytes
    etag: str
    #: when the object was last written, on the server's clock (``Last-Modified``, seconds
    #: since the epoch; whole seconds on most servers)
    modified: float
    #: the server's time when it answered (its ``Date`` header; whole seconds)
    server_now: float


class Reads(ClientCore):
    """head / size / exists / get / get_range / crc32c_of."""

    def head(self, key: str) -> ObjectInfo:
        """Size, ETag and stored CRC-32C of ``key`` (CheckpointNotFoundError if missing)."""
        try:
            a = self._call("head_object", key, "reading", ChecksumMode="ENABLED")
        except CheckpointNotFoundError:
            self._check_bucket()
            raise
        return ObjectInfo(key, a["ContentLength"], a.get("ETag", ""), a.get("ChecksumCRC32C"))

    def size(self, key: str) -> int:
        return self.head(key).size

    def exists(self, key: str) -> bool:
        """Whether object ``key`` exists (False too where the bucket does not)."""
        try:
            self._call("head_object", key, "reading")
            return True
        except CheckpointNotFoundError:
            return False

    def get(self, key: str, cap: int, *, what: str = "object",
            too_large: Type[UckptError] = CorruptCheckpointError) -> bytes:
        """The whole object ``key``, refused with ``too_large`` when it holds more than
        ``cap`` bytes: checked on its Content-Length, and at most ``cap + 1`` bytes read."""
        url = self.url(key)
        for attempt in range(1, self.opts.max_attempts + 1):
            answer = self._call("get_object", key, "reading")
            body, length = answer["Body"], answer.get("ContentLength")
            if length is not None and length > cap:
                body.close()
                raise too_large(f"{what} {url} holds {length} bytes, more than the {cap} "
                                f"uckpt reads for a {what}", path=url)
            try:  # botocore's StreamingBody reads bytes
                data: bytes = body.read(min(cap, length if length is not None else cap) + 1)
            except Exception as e:
                body.close()
                if not is_transport_error(e) or attempt == self.opts.max_attempts:
                    raise self._error(e, url, "reading", attempt) from e
                self._resumed(url, 0, attempt, e)
                continue
            if len(data) > cap:
                body.close()
                raise too_large(f"{what} {url} holds more than {cap} bytes, the most uckpt "
                                f"reads for a {what}", path=url)
            if length is None or len(data) == length:
                return data
            short = TruncatedDataError(f"{url}: read {len(data)} of its {length} bytes",
                                       path=url)  # (urllib3 raises first, in practice)
            if attempt == self.opts.max_attempts:
                raise short
            self._resumed(url, 0, attempt, short)
        raise AssertionError("unreachable")

    def get_versioned(self, key: str, cap: int, *, what: str = "object") -> Versioned:
        """The whole object ``key`` (at most ``cap`` bytes, else CorruptCheckpointError), its
        ETag, when it was last written and the server's time now, both on the server's
        clock (CheckpointNotFoundError if it does not exist)."""
        url = self.url(key)
        answer = self._call("get_object", key, "reading")
        body, length = answer["Body"], answer.get("ContentLength") or 0
        try:
            if length > cap:
                raise CorruptCheckpointError(f"{what} {url} holds {length} bytes, more than "
                                             f"the {cap} uckpt reads for a {what}", path=url)
            try:
                data = body.read(cap + 1)
            except Exception as e:
                raise self._error(e, url, "reading") from e
        finally:
            body.close()
        if len(data) > cap:
            raise CorruptCheckpointError(f"{what} {url} holds more than {cap} bytes", path=url)
        modified = answer.get("LastModified")
        date = answer.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
        try:
            now = parsedate_to_datetime(date).timestamp()
        except (TypeError, ValueError, IndexError):  # no Date header: the client's clock
            now = time.time()
        return Versioned(data, answer.get("ETag", ""),
                         modified.timestamp() if modified is not None else now, now)

    def get_range(self, key: str, offset: int, length: int, into: Buffer, *,
                  if_match: Optional[str] = None) -> int:
        """Reads bytes ``[offset, offset + length)`` of ``key`` into the writable buffer
        ``into`` (at least ``length`` bytes), streaming, and returns how many were read:
        fewer only where the object ends first (0 at or past its end). A broken
        response is resumed where it stopped, at most ``max_attempts`` times, on the same
        version of the object (``If-Match`` its ETag; ``if_match`` pins it from the
        start)."""
        url = self.url(key)
        view = _writable(into, length, url)
        done, etag, attempt, end = 0, if_match, 0, offset + length - 1
        chunk = max(1 << 16, knobs.read_block_bytes)
        while done < length:
            attempt += 1
            params: Dict[str, Any] = {"Range": f"bytes={offset + done}-{end}"}
            if etag:
                params["IfMatch"] = etag
            try:
                answer = self._call("get_object", key, "reading", **params)
            except ObjectStoreError as e:
                code = getattr(e, "code", None)
                if code == "InvalidRange" or getattr(e, "status", 0) == 416:
                    return done  # the object ends before offset + done
                if code == "PreconditionFailed":
                    raise ObjectStoreError(f"{url} was replaced while being read (its ETag "
                                           f"is no longer {etag})", path=url,
                                           endpoint=self.endpoint, code=code) from e
                raise
            if "ContentRange" not in answer and offset + done > 0:
                answer["Body"].close()
                raise ObjectStoreError(f"{self.endpoint} ignored the Range of a read of "
                                       f"{url}", path=url, endpoint=self.endpoint)
            etag, body, first = etag or answer.get("ETag"), answer["Body"], done
            try:
                while done < length:
                    n = body.readinto(view[done:min(length, done + chunk)])
                    if not n:
                        break
                    done += n
            except Exception as e:
                body.close()
                if not is_transport_error(e) or attempt >= self.opts.max_attempts:
                    raise self._error(e, url, "reading", attempt) from e
                self._resumed(url, offset + done, attempt, e)
                continue
            if done - first < (answer.get("ContentLength") or 0):
                body.close()  # more was sent than asked for: drop the connection
            if done < length:
                return done  # the object is shorter
        return done

    def crc32c_of(self, key: str, size: int) -> int:
        """CRC-32C of the ``size`` bytes object ``key`` holds, computed by reading it back
        in ranged GETs of one version of it; TruncatedDataError or CorruptCheckpointError
        if it holds fewer or more bytes than ``size``."""
        info, url = self.head(key), self.url(key)
        if info.size != size:
            kind = TruncatedDataError if info.size < size else CorruptCheckpointError
            raise kind(f"{url} holds {info.size} bytes, not the {size} written", path=url)
        block = memoryview(bytearray(min(size, VERIFY_BLOCK_BYTES)))
        value, pos = 0, 0
        while pos < size:
            n = min(len(block), size - pos)
            if self.get_range(key, pos, n, block, if_match=info.etag or None) != n:
                raise TruncatedDataError(f"{url} ended before byte {pos + n} while being "
                                         "read back", path=url)
            value = crc32c(block[:n], value)
            pos += n
        return value


def _writable(into: Buffer, length: int, url: str) -> memoryview:
    if isinstance(length, bool) or not isinstance(length, int) or length < 0:
        raise UnsupportedObjectError(f"read of {url}: length must be an integer >= 0, not "
                                     f"{length!r}", path=url)
    view = memoryview(into)
    if view.readonly or not view.c_contiguous:
        raise UnsupportedObjectError(f"read of {url}: the destination buffer must be "
                                     "writable and C-contiguous", path=url)
    view = view.cast("B") if view.ndim != 1 or view.format != "B" else view
    if view.nbytes < length:
        raise UnsupportedObjectError(f"read of {url}: the destination holds {view.nbytes} "
                                     f"bytes, fewer than the {length} asked for", path=url)
    return view
