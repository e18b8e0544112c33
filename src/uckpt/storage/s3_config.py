"""``storage_options`` for S3: their names, defaults and checks, and the boto3 client
built from them (boto3 is imported here, lazily, on the first client)."""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field, fields
from typing import Any, Dict, Mapping, NoReturn, Optional, Tuple

from ..errors import StorageConfigError
from .s3_errors import missing_boto3
from .s3_url import url_of

log = logging.getLogger("uckpt.storage.s3")

MIN_PART_BYTES = 5 << 20  # S3's smallest part (all but the last)
MAX_PARTS = 10_000        # S3's most parts in one multipart upload


@dataclass(frozen=True)
class S3Options:
    """What ``storage_options`` may hold for an ``s3://`` URL. Credentials left out come
    from boto3's default chain (``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` /
    ``AWS_SESSION_TOKEN``, ``AWS_PROFILE``, ``~/.aws/credentials`` and ``~/.aws/config``,
    instance roles); an endpoint left out from ``AWS_ENDPOINT_URL_S3`` or
    ``AWS_ENDPOINT_URL``, else AWS itself."""

    endpoint_url: Optional[str] = None
    key: Optional[str] = None
    secret: Optional[str] = field(default=None, repr=False)
    token: Optional[str] = field(default=None, repr=False)
    region: Optional[str] = None
    #: attempts per request, the first included (botocore's retry modes back off
    #: exponentially with jitter between them); also bounds resumed reads
    max_attempts: int = 8
    retry_mode: str = "standard"
    #: HTTP connections kept per client (0: enough for ``threads`` parallel parts, at least 10)
    max_pool_connections: int = 0
    #: multipart part size: objects larger than this are uploaded in parts of this size
    part_bytes: int = 16 << 20
    #: parts uploaded in parallel by one upload
    threads: int = 8
    connect_timeout: float = 10.0
    read_timeout: float = 60.0
    #: keys asked for per listing request (S3 answers at most 1000)
    page_size: int = 1000

    @classmethod
    def from_dict(cls, options: Optional[Mapping[str, Any]]) -> "S3Options":
        options = dict(options or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise StorageConfigError(
                f"unknown S3 storage option(s) {', '.join(map(repr, unknown))}",
                hint=f"the options are {', '.join(sorted(known))}")
        opts = cls(**options)
        opts._check()
        return opts

    def _check(self) -> None:
        def bad(name: str, why: str) -> NoReturn:
            raise StorageConfigError(f"S3 storage option {name}={getattr(self, name)!r}: {why}")

        for name in ("endpoint_url", "key", "secret", "token", "region"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                bad(name, "must be a string")
        if (self.key is None) != (self.secret is None):
            raise StorageConfigError("S3 storage options 'key' and 'secret' go together: "
                                     "give both or neither")
        if self.endpoint_url is not None and not self.endpoint_url.startswith(("http://",
                                                                               "https://")):
            bad("endpoint_url", "must start with http:// or https://")
        for name, low in (("max_attempts", 1), ("threads", 1), ("max_pool_connections", 0),
                          ("page_size", 1), ("part_bytes", MIN_PART_BYTES)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                bad(name, f"must be an integer >= {low}")
        for name in ("connect_timeout", "read_timeout"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                bad(name, "must be a number of seconds > 0")
        if self.retry_mode not in ("standard", "adaptive", "legacy"):
            bad("retry_mode", "must be 'standard', 'adaptive' or 'legacy'")
        if self.page_size > 1000:
            bad("page_size", "S3 lists at most 1000 keys per request")

    def effective_endpoint(self) -> Optional[str]:
        """The endpoint given, or the one the AWS environment variables name (None: AWS)."""
        return (self.endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3")
                or os.environ.get("AWS_ENDPOINT_URL") or None)

    def part_size_for(self, size: int) -> int:
        """The part size for an object of ``size`` bytes: ``part_bytes``, grown (to whole
        MiB) where the object would otherwise need more than S3's 10,000 parts."""
        need = -(-size // MAX_PARTS)
        if need <= self.part_bytes:
            return self.part_bytes
        return -(-need // (1 << 20)) << 20


def make_client(opts: S3Options) -> Any:
    """A boto3 S3 client for ``opts`` (path-style addressing for a custom endpoint; no
    request checksums computed by botocore: uckpt sends its own CRC-32C per request; no
    SHA-256 of payloads, which the CRC-32C header replaces). Typed Any: botocore makes the
    client's class at run time, from the service's JSON model."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError as e:
        raise missing_boto3(e) from e
    from .._version import __version__

    endpoint = opts.effective_endpoint()
    config = Config(
        region_name=opts.region,
        signature_version="s3v4",
        retries={"mode": opts.retry_mode, "total_max_attempts": opts.max_attempts},
        max_pool_connections=opts.max_pool_connections or max(10, 2 * opts.threads),
        connect_timeout=opts.connect_timeout,
        read_timeout=opts.read_timeout,
        s3={"addressing_style": "path" if endpoint else "auto",
            "payload_signing_enabled": False},
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        user_agent_extra=f"uckpt/{__version__}",
    )
    # one session per client: sessions are not thread-safe, clients are
    session = boto3.session.Session(aws_access_key_id=opts.key,
                                    aws_secret_access_key=opts.secret,
                                    aws_session_token=opts.token, region_name=opts.region)
    return session.client("s3", endpoint_url=opts.endpoint_url, config=config)


class Connection:
    """The boto3 client of one set of options (shared by the S3Clients of its buckets),
    and the counters of its failed attempts, which it logs at INFO."""

    def __init__(self, opts: S3Options):
        self.opts = opts
        self.s3 = make_client(opts)
        self.endpoint = self.s3.meta.endpoint_url
        self._lock = threading.Lock()
        self.failed_attempts = 0   # requests that failed and went to botocore's retry logic
        self.resumed_reads = 0     # response bodies that broke and were asked for again
        events = self.s3.meta.events
        events.register("before-parameter-build.s3", self._remember_url)
        events.register_first("needs-retry.s3", self._observe_attempt)

    def count(self, name: str) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + 1)

    @staticmethod
    def _remember_url(params: Optional[Dict[str, Any]] = None,
                      context: Optional[Dict[str, Any]] = None, **_: Any) -> None:
        if context is not None and params:
            context["uckpt_url"] = url_of(params.get("Bucket", "?"), params.get("Key", ""))

    def _observe_attempt(self, response: Optional[Tuple[Any, Dict[str, Any]]] = None,
                         caught_exception: Optional[BaseException] = None, attempts: int = 1,
                         operation: Any = None, request_dict: Optional[Dict[str, Any]] = None,
                         **_: Any) -> None:
        """Logs (INFO) and counts an attempt that failed; returns None, so botocore's own
        retry handler decides whether and when to retry."""
        status = response[0].status_code if response else None
        if caught_exception is None and status is not None and status < 500 and status != 429:
            return None
        self.count("failed_attempts")
        if caught_exception is not None:
            cause = f"{type(caught_exception).__name__}: {caught_exception}"
        else:  # botocore gives a response wherever it caught no exception
            assert response is not None
            cause = f"HTTP {status} {response[1].get('Error', {}).get('Code', '')}".rstrip()
        url = ((request_dict or {}).get("context") or {}).get("uckpt_url", "?")
        more = "; retrying" if attempts < self.opts.max_attempts else "; giving up"
        log.info("S3 %s %s: attempt %d of %d failed (%s)%s",
                 getattr(operation, "name", "?"), url, attempts, self.opts.max_attempts,
                 cause, more)
        return None
