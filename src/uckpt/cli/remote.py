"""``s3://`` URLs on the command line: the storage options flags, and listing a root of an
object store the way :mod:`uckpt.cli.scan` lists a directory (reading only manifests,
changing nothing).

Options come from ``--endpoint-url``, ``--region`` and ``--storage-option KEY=VALUE``,
else from the standard AWS environment variables and files (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, ``~/.aws/...``).
"""
from __future__ import annotations

import argparse
from typing import Any, Dict, List, Optional

from ..errors import UckptError
from ..format import MANIFEST_NAME, Manifest
from ..storage import is_remote, open_store
from ..storage.base import step_of
from .found import COMMITTED, DAMAGED, INCOMPLETE, Found, order_found, size_reason

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


def options_for(target, args) -> Optional[Dict[str, Any]]:
    """The options for ``target``: the command line's for a URL, none for a path."""
    return storage_options(args) if is_remote(target) else None


def scan_remote(root: str, options=None) -> List[Found]:
    """The checkpoints under ``root`` (an ``s3://`` URL), or ``root`` itself if it is one:
    committed (a manifest that verifies, every data object there at its size), damaged,
    or incomplete (objects of a ``step_N`` prefix without a manifest: a save in progress
    or interrupted)."""
    store = open_store(root, options)
    if store.client.exists(store.key(MANIFEST_NAME)):  # the root is a checkpoint
        parent, _, name = store.prefix.rpartition("/")
        from ..storage.objects import ObjectStore

        up = ObjectStore(store.client, parent)
        listing = {name: _objects(store, store.prefix)}
        return [_examine(up, name, listing[name])]
    found = [_examine(store, name, files) for name, files in store._listing().items()
             if step_of(name) is not None or MANIFEST_NAME in files]
    return order_found([f for f in found  # not those deleted while they were examined
                        if f.status != DAMAGED or store.has(f.name)])


def remote_gone(url: str, options=None) -> bool:
    """Whether the checkpoint at ``url`` is no longer committed (its manifest object is
    gone: a deletion removes it first)."""
    from ..storage import locate

    store, name = locate(url, options)
    return not store.has(name)


def _objects(store, prefix: str) -> Dict[str, Any]:
    listing = store.client.list(prefix + "/", delimiter=None)
    return {k[len(prefix) + 1:]: (size, listing.modified.get(k, 0.0))
            for k, size in listing.objects.items() if "/" not in k[len(prefix) + 1:]}


def _examine(store, name: str, files: Dict[str, Any]) -> Found:
    url = store.location(name)
    item = Found(None, DAMAGED, step=step_of(name), url=url,
                 size=sum(size for size, _ in files.values()))
    if MANIFEST_NAME not in files:
        item.status = INCOMPLETE
        item.reason = "objects of a save in progress or interrupted (no manifest)"
        return item
    try:
        with store.source(name) as source:
            manifest = Manifest.parse(source.manifest_bytes(), where=f"{url}/{MANIFEST_NAME}")
    except UckptError as e:
        item.reason = str(e).splitlines()[0].replace(url + "/", "")
        return item
    item.manifest = manifest
    if manifest.step is not None:
        item.step = manifest.step
    for f in manifest.files.values():
        if f.name not in files:
            item.reason = f"data file {f.name} is missing"
            return item
        item.reason = size_reason(f.name, files[f.name][0], f.size)
        if item.reason:
            return item
    item.status = COMMITTED
    return item
