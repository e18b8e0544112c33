"""The on-disk format 1.0, and the pre-release versions 1 to 6 read (docs/format.md)."""
from .encode import encode as encode_manifest_files
from .encode import encode_manifest, part_name
from .manifest import (FORMAT_NAME, FORMAT_VERSION, MANIFEST_NAME, READ_VERSIONS,
                       ArrayEntry, Chunk, FileEntry, Manifest, PartEntry, parse_manifest)


def data_file_name(rank: int) -> str:
    """Name of the data file written by ``rank``."""
    return f"data-{rank:05d}.bin"


__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "MANIFEST_NAME", "READ_VERSIONS",
           "ArrayEntry", "Chunk", "FileEntry", "Manifest", "PartEntry", "data_file_name",
           "part_name", "encode_manifest", "encode_manifest_files", "parse_manifest"]
