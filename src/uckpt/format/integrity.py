"""The manifest checksum (docs/format.md, section 3.4).

A manifest (format 1.0, and the pre-release versions 2 to 6) carries the CRC-32C of
its own bytes as the last member of its top-level object, in one fixed form at the very
end of the file::

    ...,"manifest_checksum":"crc32c:1a2b3c4d"}\\n

The checksum covers every byte before the value's opening quote (everything up
to and including ``"manifest_checksum":``); the 19 bytes after it are fixed but
for the 8 hex digits, which must equal the CRC. So a damaged byte anywhere
in the file is caught: before the value by the CRC (which catches every change
of up to 32 consecutive bits), in the digits by the comparison, and in the
fixed bytes because the file then no longer ends in the checksum member.
"""
from __future__ import annotations

import re
from typing import Optional

from ..codecs.checksum import of as _crc_text
from ..errors import ManifestChecksumError

FIELD = "manifest_checksum"
KEY = b'"' + FIELD.encode("ascii") + b'":'
#: bytes after the covered part: '"crc32c:' + 8 hex digits + '"}' + a line feed
TAIL_BYTES = 19
_TAIL = re.compile(rb'"(crc32c:[0-9a-f]{8})"\}\n')


def seal(open_object: bytes, separator: bytes = b",") -> bytes:
    """The manifest ``open_object`` (its top-level object without the closing ``}``)
    completed with its checksum member; ``separator`` goes before the member's key."""
    covered = open_object + separator + KEY
    return covered + b'"' + _crc_text(covered).encode("ascii") + b'"}\n'


def stored_checksum(data: bytes) -> Optional[str]:
    """The checksum text (``crc32c:...``) if ``data`` ends in the checksum member, else None."""
    if len(data) < TAIL_BYTES + len(KEY):
        return None
    m = _TAIL.fullmatch(data, len(data) - TAIL_BYTES)
    if m is None or data[len(data) - TAIL_BYTES - len(KEY):len(data) - TAIL_BYTES] != KEY:
        return None
    return m.group(1).decode("ascii")


def check(data: bytes, where: str) -> Optional[str]:
    """Verify the checksum member at the end of ``data``; return its text, or None when
    the file does not end in one. Raises :class:`ManifestChecksumError` on a mismatch."""
    stored = stored_checksum(data)
    if stored is None:
        return None
    computed = _crc_text(memoryview(data)[:len(data) - TAIL_BYTES])
    if computed != stored:
        raise ManifestChecksumError(
            f"{where}: the manifest is damaged: its bytes have checksum {computed}, but it "
            f"records {stored}", path=where, stored=stored, computed=computed,
            hint="the file changed after it was written (a bad disk, a partial copy or an "
                 "edit); use another checkpoint (CheckpointManager.restore falls back to the "
                 "previous step by itself)")
    return stored


def missing(where: str, data: bytes) -> ManifestChecksumError:
    """The error for a version-2 manifest that does not end in its checksum member."""
    tail = data[-40:].decode("utf-8", "backslashreplace")
    return ManifestChecksumError(
        f"{where}: a manifest of format version 2 or later must end with its checksum member "
        f"'\"manifest_checksum\":\"crc32c:<8 hex digits>\"}}' and a line feed, but this one "
        f"ends with {tail!r}", path=where, stored=None, computed=None,
        hint="the file was damaged or edited after it was written; use another checkpoint")
