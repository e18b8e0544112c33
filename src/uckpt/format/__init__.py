"""The on-disk format, version 5; versions 1 to 5 are read (specified in docs/format.md)."""
from .manifest import (CODECS, FORMAT_NAME, FORMAT_VERSION, MANIFEST_NAME, READ_VERSIONS,
                       ArrayEntry, Chunk, FileEntry, Manifest)


def data_file_name(rank: int) -> str:
    """Name of the data file written by ``rank``."""
    return f"data-{rank:05d}.bin"


__all__ = ["CODECS", "FORMAT_NAME", "FORMAT_VERSION", "MANIFEST_NAME", "READ_VERSIONS",
           "ArrayEntry", "Chunk", "FileEntry", "Manifest", "data_file_name"]
