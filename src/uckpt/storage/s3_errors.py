"""Errors of the S3 client, in uckpt's one hierarchy, and the mapping of botocore's
exceptions onto them.

Nothing in this module imports boto3: botocore's exceptions are recognised
by class name, so the mapping works on whatever botocore raises without importing it.
"""
from __future__ import annotations

import errno as _errno
from typing import Optional, cast

from ..errors import (CheckpointNotFoundError, ObjectStoreError, StorageAccessError,  # noqa: F401 (re-exported)
                      StorageConfigError, StorageDependencyError, StorageUnavailableError,
                      UckptError)

INSTALL_HINT = "pip install 'uckpt[s3]'"


def missing_boto3(error: BaseException) -> StorageDependencyError:
    return StorageDependencyError(f"s3:// URLs need the 'boto3' package, which cannot be "
                                  f"imported ({error})", hint=INSTALL_HINT)


# S3 error codes by what they mean to uckpt
_NOT_FOUND = {"NoSuchKey", "NotFound", "404", "NoSuchVersion"}
_ACCESS = {"AccessDenied", "403", "Forbidden", "InvalidAccessKeyId", "SignatureDoesNotMatch",
           "ExpiredToken", "InvalidToken", "TokenRefreshRequired", "AllAccessDisabled",
           "AccountProblem", "InvalidSecurity", "AuthorizationHeaderMalformed"}
_UNAVAILABLE = {"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout",
                "Throttling", "ThrottlingException", "RequestTimeTooSkewed", "503", "500",
                "502", "504", "BandwidthLimitExceeded"}
# botocore exceptions (by class name, bases included) that mean the endpoint did not answer
_TRANSPORT = {"EndpointConnectionError", "ConnectTimeoutError", "ConnectionClosedError",
              "ReadTimeoutError", "ResponseStreamingError", "IncompleteReadError",
              "HTTPClientError", "ConnectionError", "ProxyConnectionError", "SSLError",
              "ProtocolError", "ReadTimeout"}
_CREDENTIALS = {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError",
                "UnauthorizedSSOTokenError", "NoAuthTokenError"}


def error_code(exc: BaseException) -> Optional[str]:
    """The S3 error code of a botocore ``ClientError`` (None for anything else)."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None
    return str(response.get("Error", {}).get("Code", "")) or None


def http_status(exc: BaseException) -> Optional[int]:
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None
    # botocore parses a response's status line into an int (or there is none)
    return cast(Optional[int], response.get("ResponseMetadata", {}).get("HTTPStatusCode"))


def is_transport_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a connection, timeout or truncated-stream error (worth resuming
    a read after), as botocore, urllib3 or the socket layer raise them."""
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    return any(c.__name__ in _TRANSPORT for c in type(exc).__mro__)


def map_error(exc: BaseException, *, url: str, doing: str, endpoint: str,
              attempts: int) -> UckptError:
    """The uckpt error for ``exc`` raised while ``doing`` (e.g. ``"reading"``) the object
    at ``url``; the message names the URL, the endpoint and the number of attempts."""
    if isinstance(exc, UckptError):
        return exc
    code, status = error_code(exc), http_status(exc)
    where = dict(path=url, endpoint=endpoint, code=code, status=status)
    what = f"{code} (HTTP {status})" if code else f"{type(exc).__name__}: {exc}"
    if code == "NoSuchBucket":
        bucket = url[len("s3://"):].split("/", 1)[0]
        return CheckpointNotFoundError(
            f"no bucket {bucket!r} at {endpoint} (while {doing} {url})", **where,
            hint="create the bucket, or correct the URL or the endpoint_url")
    if code in _NOT_FOUND:
        return CheckpointNotFoundError(f"no object {url} at {endpoint} (while {doing} it)",
                                       **where)
    if code in _ACCESS or type(exc).__name__ in _CREDENTIALS:
        return StorageAccessError(
            f"{endpoint} refused access while {doing} {url}: {what}", errno=_errno.EACCES,
            **where, hint="check the key, secret and token (storage_options or the "
                          "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY environment variables "
                          "or ~/.aws/credentials) and the bucket's permissions")
    if code in _UNAVAILABLE or (status or 0) >= 500 or is_transport_error(exc):
        return StorageUnavailableError(
            f"the object store at {endpoint} is unavailable while {doing} {url}: {what}, "
            f"after {attempts} attempt(s)", **where,
            hint="check that the server is up and reachable; max_attempts, connect_timeout "
                 "and read_timeout in storage_options set how long uckpt keeps trying")
    return ObjectStoreError(f"the object store at {endpoint} failed {doing} {url}: {what}",
                            **where)
