"""Storage options on the command line (for ``s3://`` URLs).

Options come from ``--endpoint-url``, ``--region`` and ``--storage-option KEY=VALUE``,
else from the standard AWS environment variables and files (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, ``~/.aws/...``).
"""
from __future__ import annotations

import argparse
from typing import Any, Dict, Mapping, Optional

from ..storage import storage_options_for

ENV_HELP = ("s3:// URLs: the endpoint and credentials come from these options, else from "
            "the standard AWS environment variables (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, "
            "AWS_SECRET_ACCESS_KEY, AWS_PROFILE) and files (~/.aws/credentials)")
_NUMBERS = {"max_attempts": int, "max_pool_connections": int, "part_bytes": int,
            "threads": int, "page_size": int, "connect_timeout": float, "read_timeout": float}


def add_storage_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("object stores", ENV_HELP)
    g.add_argument("--endpoint-url", metavar="URL",
                   help="the S3 endpoint, e.g. http://127.0.0.1:8333 (MinIO, SeaweedFS, ...)")
    g.add_argument("--region", metavar="NAME", help="the S3 region")
    g.add_argument("--storage-option", metavar="KEY=VALUE", action="append", default=[],
                   type=_key_value,
                   help="any other storage option (e.g. max_attempts=3); repeatable")


def _key_value(text: str):
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, _NUMBERS.get(key, str)(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{key} must be a number, got {value!r}") from None


def storage_options(args) -> Optional[Dict[str, Any]]:
    """The storage options the command line gives (None: none given)."""
    out: Dict[str, Any] = dict(getattr(args, "storage_option", None) or [])
    if getattr(args, "endpoint_url", None):
        out["endpoint_url"] = args.endpoint_url
    if getattr(args, "region", None):
        out["region"] = args.region
    return out or None


def options_for(target, args) -> Optional[Mapping[str, Any]]:
    """The options for ``target``: the command line's where they apply (a URL), else none."""
    return storage_options_for(target, storage_options(args))
