"""``s3://bucket/prefix`` URLs: parsing, checking and building them (no boto3 here)."""
from __future__ import annotations

import re
from typing import Tuple, TypeGuard

from ..errors import StorageConfigError

SCHEME = "s3://"
#: bucket names as S3 allows them today: 3 to 63 lowercase letters, digits, dots and
#: hyphens, starting and ending with a letter or digit
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]")
_MAX_KEY_BYTES = 1024  # the S3 limit on a key's UTF-8 length


def is_s3_url(text: object) -> TypeGuard[str]:
    """Whether ``text`` is a string starting with ``s3://`` (not whether it is valid)."""
    return isinstance(text, str) and text.startswith(SCHEME)


def parse_url(url: str) -> Tuple[str, str]:
    """``"s3://bucket/some/prefix"`` -> ``("bucket", "some/prefix")``; the prefix has no
    leading or trailing ``/`` and is ``""`` for the bucket's root.

    Refuses (StorageConfigError, a ValueError) anything else: another scheme, a bad
    bucket name, a query or fragment, empty, ``.`` or ``..`` path components, control
    characters or backslashes, or a key longer than S3 allows."""
    if not is_s3_url(url):
        raise _bad(url, f"it does not start with {SCHEME!r}")
    bucket, _, prefix = url[len(SCHEME):].partition("/")
    if not _BUCKET.fullmatch(bucket) or ".." in bucket:
        raise _bad(url, f"{bucket!r} is not a valid bucket name (3 to 63 lowercase letters, "
                        "digits, '.' and '-', starting and ending with a letter or digit)")
    if "?" in url or "#" in url:
        raise _bad(url, "it holds a query ('?') or fragment ('#'); options go in "
                        "storage_options, not in the URL")
    prefix = prefix.rstrip("/")
    if prefix:
        check_key(prefix, url=url)
    return bucket, prefix


def check_key(key: str, *, url: str = "") -> str:
    """``key`` itself when it is a plain relative object key (no empty, ``.`` or ``..``
    components, no control characters or backslashes, at most 1024 UTF-8 bytes)."""
    where = url or key
    if not key:
        raise _bad(where, "the object key is empty")
    if any(ord(c) < 32 or c in "\\\x7f" for c in key):
        raise _bad(where, "it holds a control character or a backslash")
    parts = key.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise _bad(where, "it has an empty, '.' or '..' path component")
    if len(key.encode("utf-8")) > _MAX_KEY_BYTES:
        raise _bad(where, f"the object key is longer than {_MAX_KEY_BYTES} bytes")
    return key


def join_key(prefix: str, *names: str) -> str:
    """``prefix`` and ``names`` joined by ``/`` (``prefix`` may be ``""``)."""
    return "/".join(p for p in (prefix, *names) if p)


def url_of(bucket: str, key: str = "") -> str:
    """The ``s3://`` URL of an object (or of a bucket when ``key`` is empty)."""
    return f"{SCHEME}{bucket}/{key}" if key else f"{SCHEME}{bucket}"


def _bad(url: str, why: str) -> StorageConfigError:
    return StorageConfigError(f"malformed S3 URL {url!r}: {why}", path=url,
                              hint="write it as s3://bucket/prefix, e.g. s3://my-bucket/run1")
