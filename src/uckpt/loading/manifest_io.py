"""A checkpoint's manifest through storage: the root and its parts (format 1.0).

:func:`read` parses a checkpoint's root manifest and reads the parts it lists through
the same :class:`~uckpt.storage.base.CheckpointSource` as its data files (each checked
to hold exactly its listed size before it is read whole); :func:`commit` writes the parts
through a :class:`~uckpt.storage.base.CheckpointSink` like data files, then commits the
root (the commit rule: the root manifest last).
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

import numpy as np

from ..errors import CorruptCheckpointError
from ..format import MANIFEST_NAME, Manifest, PartEntry
from ..format import encode_manifest_files, parse_manifest


def where_of(source: Any) -> str:
    """The manifest's path or URL in ``source``, for messages."""
    return str(source.where).rstrip("/") + "/" + MANIFEST_NAME


def read(source: Any, data: Optional[bytes] = None) -> Manifest:
    """The manifest of ``source`` (``data``: its root's bytes, if already read), parts
    read and attached."""
    if data is None:
        data = source.manifest_bytes()
    return parse_manifest(data, where=where_of(source),
                          read_part=lambda entry: part_bytes(source, entry))


def read_root(source: Any) -> Manifest:
    """The root manifest of ``source``, its parts left pending (attached on demand:
    :func:`uckpt.format.cover.attach_covering`)."""
    return parse_manifest(source.manifest_bytes(), where=where_of(source))


def part_bytes(source: Any, entry: PartEntry) -> bytes:
    """Part file ``entry.file`` of ``source``, read whole once its size is the listed one."""
    where = source.file_where(entry.file)
    try:
        size = source.open_file(entry.file, what="manifest part")
    except FileNotFoundError:  # (damage of a committed checkpoint, not one that is gone)
        raise CorruptCheckpointError(
            f"{where}: the manifest part listed in the root manifest is missing", path=where,
            hint="use another checkpoint (CheckpointManager.restore falls back to the "
                 "previous step by itself)") from None
    return _whole(where, size, entry.size, lambda buf: source.read_into(entry.file, buf, 0))


def _whole(where: str, size: int, listed: int, fill: Callable[[bytearray], int]) -> bytes:
    """A part of ``size`` bytes (its root lists ``listed``) read by ``fill(buffer) -> bytes
    read``; a size other than the listed one, before or while reading (the file shrank),
    is damage."""
    if size != listed:
        raise _wrong_size(where, size, listed)
    buf = bytearray(size)
    n = fill(buf) if size else 0
    if n != size:
        raise _wrong_size(where, n, listed)
    return bytes(buf)


def _wrong_size(where: str, actual: int, listed: int) -> CorruptCheckpointError:
    return CorruptCheckpointError(
        f"{where}: manifest part of {actual} bytes, but the root manifest lists {listed}: a "
        "torn or damaged part, or one of another save", path=where,
        hint="use another checkpoint (CheckpointManager.restore falls back to the previous "
             "step by itself)")


def write_parts(sink: Any, parts: List[Tuple[str, bytes]]) -> None:
    """Write the part files through ``sink``, durably (before the root is committed)."""
    for name, data in parts:
        sink.write_pieces(name, len(data), [(0, np.frombuffer(data, np.uint8))])


def commit(sink: Any, manifest: Manifest, overwrite: bool = False) -> bytes:
    """Write ``manifest``'s parts, then commit its root; return the root's bytes."""
    root, parts = encode_manifest_files(manifest)
    write_parts(sink, parts)
    sink.commit(root, overwrite)
    return root
