"""Write one rank's data file from a plan, into a :class:`~uckpt.storage.base.CheckpointSink`.

The chunks of the file and their checksums are computed here; the sink stores them
(local directories with the system calls of :mod:`uckpt.storage.blob.posix_io`;
object stores as a multipart upload). From a snapshot, the
staging arena already is the file's image and goes to storage with O_DIRECT. Otherwise
one thread writes the chunks in file order with vectored writes (a file's
writes serialise on its inode lock anyway), while another computes their
checksums over the same memory: the two overlap, so a save costs about what
writing the bytes costs.

With a :class:`~uckpt.codecs.pipeline.Compression`, chunks are first encoded on
``knobs.compress_threads`` threads (Zstandard releases the GIL; on the background
threads of an asynchronous save), each checksummed as stored, and laid out anew:
the plan's offsets are those of the raw bytes, the file's those of the stored ones.
Encoded chunks are made ahead of the writing and streamed to the sink, which (locally)
copies each into a page-aligned buffer written with O_DIRECT: encoding and writing
overlap, the page cache costs no CPU, and the encoders reuse their memory
(:mod:`uckpt.saving.encode_memory`) instead of faulting in new pages for every chunk.

Every chunk also gets its content hash (XXH3-128 of its raw bytes, :mod:`uckpt.codecs.hashing`),
computed on the same threads as its checksum or its encoding.
"""
from __future__ import annotations

import math
import threading
from typing import Dict, List, Mapping, Optional

import numpy as np

from ..codecs import pipeline as codecs, hashing
from .. import dtypes, knobs
from ..codecs.checksum import crc32c, format_checksum
from .encode_memory import EncodeMemory
from ..format import Chunk
from ..options import DEFAULT_ALIGNMENT
from ..runtime.parallel import ordered_map, parallel_map
from .plan import WriteItem


def box_bytes(arr: np.ndarray, start, shape) -> np.ndarray:
    """The C-order little-endian bytes of a box of ``arr``, as a flat uint8 array."""
    if tuple(shape) != arr.shape:
        arr = arr[tuple(slice(s, s + n) for s, n in zip(start, shape))]
    arr = np.ascontiguousarray(dtypes.as_little_endian(arr))
    return arr.reshape(-1).view(np.uint8)


def _local(start, array_start):
    return start if array_start is None else tuple(s - o for s, o in zip(start, array_start))


def file_end(chunks) -> int:
    """The size of a data file holding ``chunks`` (Chunks): the end of the last one."""
    return max((c.offset + c.length for c in chunks), default=0)


def chunk_data(items: List[WriteItem], arrays: Mapping[str, np.ndarray],
               file_image: "np.ndarray | None" = None,
               starts: "Mapping[str, tuple] | None" = None) -> List[np.ndarray]:
    """The raw bytes of each item (flat uint8 views where possible): slices of ``file_image``
    (a staging arena laid out by the plan), or boxes of ``arrays``. ``starts`` gives, for
    arrays that are a box of a larger one, where the box starts (items' boxes are
    global, the arrays local)."""
    starts = starts or {}
    if file_image is not None:
        data = [file_image[it.offset:it.offset + it.length] for it in items]
    else:
        data = [box_bytes(arrays[it.path], _local(it.start, starts.get(it.path)), it.shape)
                for it in items]
    for it, d in zip(items, data):
        assert d.nbytes == it.length, (it, d.nbytes)
    return data


def write_checksummed(sink, file: str, size: int, placed: List[tuple],
                      file_image: "np.ndarray | None" = None,
                      hashes: "List[bytes] | None" = None) -> List[Chunk]:
    """Write ``placed`` ``(item, offset in the file, bytes)``, sorted by offset, as data
    file ``file`` of ``sink`` (from ``file_image`` in one piece when given: it is the file);
    return a chunk per item, in order. Checksums (and content hashes, unless ``hashes``
    are given) are computed on another thread over the same memory while it is written."""
    sums: List[int] = [0] * len(placed)
    digests: List[bytes] = list(hashes) if hashes is not None else [b""] * len(placed)
    errors: List[BaseException] = []

    def checksum_all() -> None:
        try:
            for i, (_, _, d) in enumerate(placed):
                if hashes is None:
                    sums[i], digests[i] = hashing.crc_and_digest(d)
                else:
                    sums[i] = crc32c(d)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    summer = threading.Thread(target=checksum_all, name="uckpt-crc", daemon=True)
    summer.start()
    try:
        if file_image is not None:
            sink.write_image(file, file_image, size)
        else:
            sink.write_pieces(file, size, [(off, d) for _, off, d in placed])
    finally:
        summer.join()
    if errors:
        raise errors[0]
    return [Chunk(file, off, it.length, it.start, it.shape, (), format_checksum(s),
                  hashing.format_hash(h))
            for (it, off, _), s, h in zip(placed, sums, digests)]


def write_data_file(sink, file: str, size: int, items: List[WriteItem],
                    arrays: Mapping[str, np.ndarray], file_image: "np.ndarray | None" = None,
                    starts: "Mapping[str, tuple] | None" = None,
                    compression: "Optional[codecs.Compression]" = None,
                    alignment: int = DEFAULT_ALIGNMENT) -> Dict[WriteItem, Chunk]:
    """Write data file ``file`` into ``sink`` (a CheckpointSink): every item at its
    offset, durably; return the chunks (the file's size is :func:`file_end` of them).

    ``file_image``, when given, is the whole file's bytes (a staging arena laid out
    by the plan): it is written in one piece and the items are checksummed from it.
    ``starts`` gives, for arrays that are a box of a larger one, where the box
    starts: items' boxes are global, the arrays local. With ``compression``, chunks are
    encoded first and the file laid out by their stored sizes (``size`` is then unused;
    each array starting at a multiple of ``alignment``).
    """
    items = sorted(items, key=lambda it: it.offset)
    data = chunk_data(items, arrays, file_image, starts)
    if compression is not None:
        return write_encoded(sink, file, [(it.path, it, it.length) for it in items],
                             lambda k, memory: encode_chunk(compression, data[k], items[k],
                                                            memory=memory), alignment)
    chunks = write_checksummed(sink, file, size, [(it, it.offset, d) for it, d in zip(items, data)],
                               file_image)
    return dict(zip(items, chunks))


def write_read_chunks(sink, file: str, items: List[WriteItem], read,
                      compression: "Optional[codecs.Compression]" = None,
                      alignment: int = DEFAULT_ALIGNMENT) -> Dict[WriteItem, Chunk]:
    """Write data file ``file`` of ``items`` as :func:`write_data_file` does, each item's
    raw bytes (flat uint8) from ``read(item)``, called only when the item is encoded (a
    few items ahead of the writing, :func:`write_encoded`), never for all at once."""
    items = sorted(items, key=lambda it: it.offset)
    return write_encoded(sink, file, [(it.path, it, it.length) for it in items],
                         lambda k, memory: encode_chunk(compression, read(items[k]), items[k],
                                                        memory=memory), alignment)


def encode_chunk(compression: "Optional[codecs.Compression]", raw: np.ndarray, box,
                 content: Optional[str] = None, memory: Optional[EncodeMemory] = None) -> tuple:
    """``(codec, stored bytes, checksum, content hash)`` of one chunk's raw bytes (flat
    uint8; ``box`` has its ``shape``): compressed with ``compression`` (None: stored raw),
    the content hash of the raw bytes computed here unless given (``content``), in
    ``memory`` when given (:func:`write_encoded`'s). A large chunk is itself compressed
    on Zstandard's own threads (without ``memory``: from ``knobs.compress_split_bytes``;
    with it, from its ``split_bytes``)."""
    if compression is None:
        if content is None:
            value, digest = hashing.crc_and_digest(raw)
            return codecs.RAW, raw, format_checksum(value), hashing.format_hash(digest)
        return codecs.RAW, raw, format_checksum(crc32c(raw)), content
    if content is None:
        content = hashing.of(raw)
    itemsize = raw.nbytes // max(1, math.prod(box.shape))
    split = knobs.compress_split_bytes if memory is None else memory.split_bytes
    threads = knobs.compress_threads if split is not None and raw.nbytes >= split else 0
    codec, stored = codecs.encode(compression, raw, itemsize, threads, memory)
    return codec, stored, format_checksum(crc32c(stored)), content


def encode_chunks(raw_chunks, compression: "Optional[codecs.Compression]") -> List[tuple]:
    """:func:`encode_chunk` of every ``(path, box, raw bytes)`` of ``raw_chunks``, on
    ``knobs.compress_threads`` threads."""
    return parallel_map(lambda raw_chunk: encode_chunk(compression, raw_chunk[2], raw_chunk[1]),
                        raw_chunks, knobs.compress_threads, "uckpt-compress")


def write_encoded(sink, file: str, raw_chunks, encode, alignment: int = DEFAULT_ALIGNMENT) -> Dict:
    """Write data file ``file`` of ``raw_chunks`` (``(path, key, raw size)`` in file order;
    ``key`` has the box's ``start`` and ``shape``, or is ``(path, index, Chunk)``), the
    stored bytes of chunk ``k`` being ``encode(k, memory) -> (codec, stored, checksum,
    content hash)`` (see :func:`encode_chunk`; ``memory`` an
    :class:`~uckpt.saving.encode_memory.EncodeMemory` to encode in); returns ``{key: Chunk}``.

    Chunks are encoded on ``knobs.compress_threads`` threads ahead of the writing
    (:func:`~uckpt.runtime.parallel.ordered_map`: a few chunks, or more while they total at most
    ``knobs.compress_ahead_bytes``) and handed to the sink as a stream: each array
    starts at a multiple of ``alignment``, its chunks follow without gaps. A sink
    that writes streams (local directories) holds only those few chunks at once; one
    that copies each chunk before taking the next lets their buffers be reused. A chunk
    is compressed on Zstandard's threads too only where it is so large a share of the
    file (more than 1 / ``knobs.compress_threads``) that the threads would wait for it:
    splitting a frame costs CPU time."""
    chunks: Dict = {}
    threads = knobs.compress_threads
    sizes = [nbytes for _, _, nbytes in raw_chunks]
    split = max(knobs.compress_split_bytes, sum(sizes) // threads + 1)
    memory = EncodeMemory(pool=sink.copies_stream_pieces, split_bytes=split)

    def stream():
        end, last = 0, None
        encoded = ordered_map(lambda k: encode(k, memory), range(len(raw_chunks)), threads,
                              2 * threads, "uckpt-compress", sizes, knobs.compress_ahead_bytes)
        for (path, key, _), (codec, stored, checksum, content) in zip(raw_chunks, encoded):
            if path != last:
                end, last = -(-end // alignment) * alignment, path
            box, data = _box(key), _as_uint8(stored)
            chunks[key] = Chunk(file, end, data.nbytes, tuple(box.start), tuple(box.shape),
                                codec, checksum, content)
            yield end, data
            end += data.nbytes
            memory.give(stored)  # the sink copied it (or does not pool: ignored)

    sink.write_stream(file, stream())
    return chunks


def _as_uint8(data) -> np.ndarray:
    return np.frombuffer(data, dtype=np.uint8) if isinstance(data, bytes) else data


def _box(key):
    """What has the box's ``start`` and ``shape`` in a chunk's key."""
    return key[2] if isinstance(key, tuple) else key
