"""What every part of :class:`uckpt.storage.s3.S3Client` stands on: the bucket, the options
and the boto3 client of one connection, and the plumbing of a request (its errors mapped
into :mod:`uckpt.errors`, a resumed read counted and logged). The read and write mixins
(:mod:`.s3_read`, :mod:`.s3_write`) derive from it."""
from __future__ import annotations

import logging
from typing import Any, Mapping, Optional

from ..errors import StoreNotFoundError, UckptError
from .s3_config import Connection, S3Options
from .s3_errors import http_status, map_error
from .s3_url import parse_url, url_of

log = logging.getLogger("uckpt.storage.s3")


class ClientCore:
    """Objects of one bucket, through one :class:`~.s3_config.Connection`."""

    def __init__(self, bucket: str, storage_options: Optional[Mapping[str, Any]] = None, *,
                 connection: Optional[Connection] = None) -> None:
        parse_url(url_of(bucket))  # checks the bucket's name
        self.bucket = bucket
        self._shared = connection or Connection(S3Options.from_dict(storage_options))
        self.opts = self._shared.opts
        self.endpoint: str = self._shared.endpoint
        #: the boto3 client (Any: botocore makes its class at run time)
        self._s3: Any = self._shared.s3

    def url(self, key: str = "") -> str:
        return url_of(self.bucket, key)

    def _call(self, operation: str, key: Optional[str], doing: str, url: str = "",
              **params: Any) -> Any:
        """boto3's ``operation`` on ``key`` of the bucket: its answer (a dict shaped as
        botocore's service model says), or the uckpt error of its failure."""
        if key is not None:
            params["Key"] = key
        try:
            return getattr(self._s3, operation)(Bucket=self.bucket, **params)
        except Exception as e:
            raise self._error(e, url or self.url(key or ""), doing) from e

    def _error(self, exc: BaseException, url: str, doing: str, attempts: int = 0) -> UckptError:
        if not attempts:
            meta = (getattr(exc, "response", None) or {}).get("ResponseMetadata", {})
            attempts = (meta["RetryAttempts"] + 1 if "RetryAttempts" in meta
                        else self.opts.max_attempts)
        return map_error(exc, url=url, doing=doing, endpoint=self.endpoint, attempts=attempts)

    def _check_bucket(self) -> None:
        """Raises StoreNotFoundError (a CheckpointNotFoundError) if the bucket does not
        exist."""
        try:
            self._s3.head_bucket(Bucket=self.bucket)
        except Exception as e:
            if http_status(e) == 404:
                raise StoreNotFoundError(
                    f"no bucket {self.bucket!r} at {self.endpoint}", path=self.url(),
                    endpoint=self.endpoint,
                    hint="create the bucket, or correct the URL or the endpoint_url") from e

    def _resumed(self, url: str, offset: int, attempt: int, cause: BaseException) -> None:
        self._shared.count("resumed_reads")
        log.info("S3 read of %s broke at byte %d (attempt %d of %d: %s: %s); resuming",
                 url, offset, attempt, self.opts.max_attempts, type(cause).__name__, cause)
