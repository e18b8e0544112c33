"""Find the checkpoints under a root and classify them, without reading data: the one
listing of ``uckpt ls``, ``uckpt verify --all`` and ``uckpt ls ROOT ROOT...`` (tiers),
whatever the store (a directory, an ``s3://`` prefix, ...). It asks the store what the
root holds (:meth:`~uckpt.storage.base.Store.entries`) and reads only manifests.

Unlike :class:`~uckpt.CheckpointManager`, scanning never creates, removes or
renames anything: it is safe on a root another process is saving into.

What the store lists is
  * ``committed``: a manifest that parses and validates, and every data file the
    manifest lists there at its recorded size;
  * ``damaged``: named like a step (``step_00000042``) or holding a ``manifest.json``,
    but the manifest is missing, invalid or not a regular file, or a data file is
    missing, short, too long or not a regular file (``reason`` says which); a symlink
    named like a checkpoint is listed as damaged too, and not followed;
  * ``incomplete``: what a save in progress or interrupted left (a temporary directory
    ``.step_00000042.uckpt-tmp-1a2b3c4d``; in an object store, the objects of a
    ``step_N`` prefix without a manifest);
  * ``stale``: a checkpoint being deleted or replaced, left by an interrupted
    retention (``.uckpt-del-``) or overwrite (``.uckpt-old-``).
Nothing is ever read through a symlink below the root (the root itself may be one) and
nothing is opened that could block (a FIFO).

A checkpoint that the root's writer deletes (retention) or replaces while it is
examined is not damaged: it is gone, and not listed, as ``CheckpointManager.restore``
treats it (:meth:`~uckpt.storage.base.Store.still_there`).
"""
from __future__ import annotations

import os
from typing import List

from ..loading import manifest_io
from ..errors import UckptError
from ..format import MANIFEST_NAME, Manifest
from ..format import parse_manifest
from ..storage import Entry, open_source, open_store
from ..storage.base import CHECKPOINT, STALE as STALE_ENTRY, TEMPORARY
from .found import (COMMITTED, DAMAGED, INCOMPLETE, STALE, Found, order_found,  # noqa: F401
                    size_reason)


def scan(root, storage_options=None) -> List[Found]:
    """The checkpoints under ``root`` (a path or URL) by step (unnumbered last); ``root``
    itself if it is one. ``root`` may be reached through a symlink (it was given); entries
    under it are not."""
    store = open_store(root, storage_options)
    own = store.itself()
    if own is not None:
        return [examine(own, lambda: open_source(root, storage_options))]
    found = []
    for entry in store.entries():
        try:
            item = examine(entry, lambda e=entry: store.source(e.name))
        except FileNotFoundError:  # vanished while examined (a save committed, a delete ran)
            continue
        item.store = store
        if item.gone():
            continue  # deleted or replaced while it was examined
        found.append(item)
    return order_found(found)


def read_manifest(source, where: str) -> Manifest:
    """The validated manifest of the checkpoint ``source`` reads (``where``: its path), its
    parts read and attached."""
    return parse_manifest(source.manifest_bytes(), where=where,
                          read_part=lambda part: manifest_io.part_bytes(source, part))


def examine(entry: Entry, source) -> Found:
    """Classify one entry: read and validate its manifest (``source()`` opens it), compare
    the data files it lists with those the store listed."""
    item = Found(entry.where, DAMAGED, step=entry.step, size=entry.size, reason=entry.reason,
                 entry=entry)
    if entry.kind != CHECKPOINT:
        item.status = {TEMPORARY: INCOMPLETE, STALE_ENTRY: STALE}.get(entry.kind, DAMAGED)
        return item
    if entry.reason:  # it could not be listed
        item.reason = _relative(entry.reason, entry.where)
        return item
    if MANIFEST_NAME not in entry.files and MANIFEST_NAME not in entry.not_plain:
        item.reason = f"no {MANIFEST_NAME}"
        return item
    try:
        with source() as src:
            manifest = read_manifest(src, f"{entry.where}/{MANIFEST_NAME}")
    except UckptError as e:
        if isinstance(e, FileNotFoundError):
            raise
        item.reason = _relative(str(e), entry.where)
        return item
    item.manifest = manifest
    if manifest.step is not None:
        item.step = manifest.step
    for f in manifest.files.values():
        if f.name in entry.not_plain:
            item.reason = f"data file {f.name!r} is {entry.not_plain[f.name]}, not a regular file"
            return item
        if f.name not in entry.files:
            item.reason = f"data file {f.name} is missing"
            return item
        item.reason = size_reason(f.name, entry.files[f.name], f.size)
        if item.reason:
            return item
    item.status = COMMITTED
    return item


def _relative(message: str, where: str) -> str:
    """An error's first line, with the checkpoint's own path or URL left out (it is in the
    table)."""
    line = message.splitlines()[0] if message else ""
    for prefix in (where + os.sep, where + "/"):
        line = line.replace(prefix, "")
    return line
