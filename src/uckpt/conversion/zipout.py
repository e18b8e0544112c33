"""Writing zip archives (NPZ, torch.save) member by member, with stored (uncompressed),
64-byte aligned data, so readers can map members in place (as torch.save does); or, when
asked (``deflate``), deflated members as ``np.savez_compressed`` writes them."""
from __future__ import annotations

import struct
import zipfile
from typing import Callable, Optional

import numpy as np

from .interchange import contiguous
from .progress import Progress

ALIGN = 64
_PIECE = 16 << 20  # bytes written per call, so progress moves within a large array
_ZIP64_LOCAL_EXTRA = 20  # zipfile appends this to a local header written with force_zip64


class ZipOut:
    def __init__(self, path, deflate: bool = False) -> None:
        self.deflate = deflate
        self.zf = zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True)

    def close(self) -> None:
        self.zf.close()

    def _info(self, name: str, size: int) -> zipfile.ZipInfo:
        info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
        info.compress_type = zipfile.ZIP_STORED
        info.file_size = size
        info.external_attr = 0o644 << 16
        if self.deflate:
            info.compress_type = zipfile.ZIP_DEFLATED
            return info
        start = self.zf.fp.tell() + 30 + len(name.encode("utf-8")) + _ZIP64_LOCAL_EXTRA + 4
        pad = -start % ALIGN
        info.extra = b"FB" + struct.pack("<H", pad) + b"Z" * pad  # padding, as torch.save does
        return info

    def add_bytes(self, name: str, data: bytes) -> None:
        with self.zf.open(self._info(name, len(data)), "w", force_zip64=True) as f:
            f.write(data)

    def add_array(self, name: str, arr: np.ndarray, progress: Optional[Progress] = None,
                  header: bytes = b"") -> None:
        """A member holding ``header`` then the array's C-order bytes."""
        data = memoryview(contiguous(arr).reshape(-1).view(np.uint8))
        with self.zf.open(self._info(name, len(header) + len(data)), "w",
                          force_zip64=True) as f:
            f.write(header)
            write_pieces(f.write, data, progress)


def write_pieces(write: Callable[[memoryview], object], data: memoryview,
                 progress: Optional[Progress]) -> None:
    for start in range(0, len(data), _PIECE):
        piece = data[start:start + _PIECE]
        write(piece)
        if progress is not None:
            progress.advance(len(piece))
