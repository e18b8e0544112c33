"""What shapes the bytes a save writes, passed as a value: :class:`SaveOptions`.

``uckpt.save(..., options=SaveOptions(...))``, ``CheckpointManager(...,
save_options=...)``, ``uckpt.consolidate`` and ``uckpt.convert`` (to a uckpt target)
take one; the save path hands its fields down as parameters, so two saves in one
process with different options do not interfere. Process-wide tuning that never
changes the bytes written (threads, buffer sizes) stays in :mod:`uckpt.knobs`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Union

from .codecs.pipeline import Compression, compression_of
from .errors import OptionsError

#: the defaults of :class:`SaveOptions` (what a save without options writes)
DEFAULT_CHUNK_BYTES = 64 << 20
DEFAULT_INCREMENTAL_CHUNK_BYTES = 1 << 20
DEFAULT_ALIGNMENT = 64


@dataclass(frozen=True)
class SaveOptions:
    """The layout of a checkpoint on storage; checked when made
    (:class:`~uckpt.errors.OptionsError`, a ``ValueError``, naming the field).

    chunk_bytes
        an array of at least twice this many bytes is cut along its first axis into
        chunks of about this size (several ranks: smaller ones where that spreads the
        writes, never below 1 MiB unless this is smaller).
    incremental_chunk_bytes
        the chunk size of incremental saves (``base=``, ``incremental=True``), so that an
        update of a few rows rewrites only the chunks holding them.
    alignment
        every array's first chunk starts at a multiple of this many bytes of its data
        file (a power of two).
    compression, compression_level
        as ``uckpt.save``'s keywords: None (or ``"none"``) stores chunks raw;
        ``"zstd"`` compresses them (docs/format.md section 5); a bad name or level
        raises :class:`~uckpt.errors.CompressionError`.
    """

    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    incremental_chunk_bytes: int = DEFAULT_INCREMENTAL_CHUNK_BYTES
    alignment: int = DEFAULT_ALIGNMENT
    compression: Union[str, Compression, None] = None
    compression_level: Optional[int] = None

    def __post_init__(self) -> None:
        for name in ("chunk_bytes", "incremental_chunk_bytes", "alignment"):
            check_count(self, name, getattr(self, name))
        if self.alignment & (self.alignment - 1):
            raise OptionsError(
                f"SaveOptions.alignment must be a power of two, got {self.alignment}",
                hint="use 64 (the default), 4096 (a page) or another power of two")
        compression_of(self.compression, self.compression_level)  # CompressionError if bad

    @property
    def codec(self) -> Optional[Compression]:
        """The :class:`~uckpt.codecs.pipeline.Compression` of the chunks (None: stored raw)."""
        return compression_of(self.compression, self.compression_level)

    def compressed(self, codec: Optional[Compression]) -> "SaveOptions":
        """These options with chunks compressed by ``codec`` (None: raw) instead."""
        return dataclasses.replace(self, compression=codec, compression_level=None)


def check_count(owner: object, name: str, value: object) -> None:
    """Refuse ``owner``'s field ``name`` unless it is an int of at least 1."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise OptionsError(f"{type(owner).__name__}.{name} must be a positive int, got "
                           f"{value!r}", hint=f"give {name} as an int of at least 1")


def save_options(options: Optional[SaveOptions],
                 compression: Union[str, Compression, None] = None,
                 compression_level: Optional[int] = None,
                 what: str = "uckpt.save") -> SaveOptions:
    """The options of a call that takes ``options=`` and the shorthand keywords
    ``compression=`` / ``compression_level=``: either, not both."""
    if options is None:
        return SaveOptions(compression=compression, compression_level=compression_level)
    if not isinstance(options, SaveOptions):
        raise OptionsError(f"{what}: options must be a uckpt.SaveOptions, got "
                           f"{type(options).__name__}",
                           hint="pass uckpt.SaveOptions(chunk_bytes=..., alignment=...)")
    if compression is not None or compression_level is not None:
        raise OptionsError(f"{what}: compression given both as a keyword and in "
                           "SaveOptions", hint="give compression= and compression_level= "
                           "inside SaveOptions(...) only")
    return options


#: a save without options
DEFAULT = SaveOptions()
