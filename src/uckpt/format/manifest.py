"""Reading a manifest file: checks shared by every version, then the version's parser.

:func:`parse` checks the manifest checksum (the last member, docs/format.md section 3.4)
before anything else, refuses a file whose parse may need more memory than this process
has, and dispatches on ``format_version``: the string ``"1.0"`` to :mod:`.v1`, an
integer (a pre-release version 1 to 6) to :mod:`.legacy`, anything else refused.
The model it returns is :mod:`.model`; the writer is :mod:`.encode`.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from ..runtime import memory
from ..errors import FormatVersionError, ManifestError, MemoryLimitError
from . import chunk_table, integrity, legacy, v1
from .encode import FORMAT_NAME, FORMAT_VERSION
from .model import ArrayEntry, Chunk, FileEntry, Manifest, PartEntry
from .strict_json import loads as strict_json_loads
from .values import show as _show

MANIFEST_NAME = "manifest.json"
#: the pre-release versions read (through :mod:`.legacy`)
READ_VERSIONS = legacy.READ_VERSIONS
#: a compressed chunk decodes to at most this many bytes per stored byte (section 5)
MAX_RATIO = chunk_table.MAX_RATIO


def parse(data: bytes, where: str = MANIFEST_NAME) -> Manifest:
    """Check and read a root manifest of format 1.0 (its parts left pending) or of a
    pre-release version (raises ManifestError)."""
    checksum = integrity.check(data, where)  # first: damage is told as damage
    memory.check_manifest(data, where)
    try:
        try:
            doc = strict_json_loads(data)
        except ValueError as e:  # UnicodeDecodeError is one
            raise ManifestError(f"{where} is not valid UTF-8 JSON: {e}", path=where) from None
        return _dispatch(doc, checksum, data, where)
    except MemoryLimitError:
        raise  # (refused before allocating: a chunk table too large to decode)
    except MemoryError:
        raise MemoryLimitError(
            f"{where}: out of memory parsing a manifest of {len(data)} bytes", path=where,
            hint="read it in a process allowed more memory (ulimit -v, the cgroup's "
                 "memory.max)") from None


def parse_manifest(data: bytes, where: str = MANIFEST_NAME,
                   read_part: Optional[Callable[[PartEntry], bytes]] = None) -> Manifest:
    """Check and read a manifest of any version this uckpt reads (raises ManifestError).
    A 1.0 root's parts are read with ``read_part(entry) -> bytes`` and attached; without
    it they stay pending (:meth:`Manifest.attach_part`)."""
    manifest = parse(data, where)
    if read_part is not None:
        for k in list(manifest.parts_pending):
            manifest.attach_part(k, read_part(manifest.parts[k]))
    return manifest


def _dispatch(doc: Any, checksum: Any, data: bytes, where: str) -> Manifest:
    if not isinstance(doc, dict):
        raise ManifestError(f"{where}: <top>: expected a JSON object, got {_show(doc)}",
                            path=where, field="<top>")
    if doc.get("format") != FORMAT_NAME:
        raise ManifestError(f"{where}: format: expected {FORMAT_NAME!r}, got "
                            f"{_show(doc.get('format'))}", path=where, field="format")
    version = doc.get("format_version")
    if isinstance(version, int) and not isinstance(version, bool):
        return legacy.parse(doc, checksum, data, where)
    if not isinstance(version, str):
        raise ManifestError(f"{where}: format_version: expected the string \"1.0\" (or a "
                            f"pre-release integer), got {_show(version)}", path=where,
                            field="format_version")
    refused = v1.version_error(where, version)
    if refused is not None:
        raise refused
    if checksum is None:
        raise integrity.missing(where, data)
    last = next(reversed(doc), None)
    if last != integrity.FIELD or doc[last] != checksum:
        raise ManifestError(f"{where}: {integrity.FIELD}: must be the last member of the "
                            "top-level object and hold the checksum that ends the file",
                            path=where, field=integrity.FIELD)
    return v1.parse_root(doc, checksum, where)


__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "MANIFEST_NAME", "MAX_RATIO", "READ_VERSIONS",
           "ArrayEntry", "Chunk", "FileEntry", "FormatVersionError", "Manifest", "PartEntry",
           "parse", "parse_manifest"]
