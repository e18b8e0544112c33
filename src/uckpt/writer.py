"""Write one rank's data file from a plan: checksum and write chunks in parallel."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, List, Mapping

import numpy as np

from . import dtypes, knobs
from .checksum import crc32c, format_checksum
from .format import Chunk
from .fsutil import preallocate, pwrite_all
from .parallel import parallel_map
from .plan import WriteItem


def box_bytes(arr: np.ndarray, start, shape) -> np.ndarray:
    """The C-order little-endian bytes of a box of ``arr``, as a flat uint8 array."""
    if tuple(shape) != arr.shape:
        arr = arr[tuple(slice(s, s + n) for s, n in zip(start, shape))]
    arr = np.ascontiguousarray(dtypes.as_little_endian(arr))
    return arr.reshape(-1).view(np.uint8)


def write_data_file(directory: Path, file: str, size: int, items: List[WriteItem],
                    arrays: Mapping[str, np.ndarray]) -> Dict[WriteItem, Chunk]:
    """Create ``directory/file``, write every item at its offset, fsync; return the chunks."""
    path = directory / file
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        preallocate(fd, size)

        def one(item: WriteItem) -> Chunk:
            data = box_bytes(arrays[item.path], item.start, item.shape)
            assert data.nbytes == item.length, (item, data.nbytes)
            checksum = format_checksum(crc32c(data))
            pwrite_all(fd, data, item.offset)
            return Chunk(file, item.offset, item.length, item.start, item.shape, "raw", checksum)

        chunks = parallel_map(one, items, knobs.io_threads, "uckpt-write")
        if os.fstat(fd).st_size != size:
            os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)
    return dict(zip(items, chunks))
