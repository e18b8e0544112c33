"""The in-memory model of a checkpoint's manifest, whatever version it was read from.

A :class:`Manifest` lists its arrays (:class:`ArrayEntry`), each tiled by chunks
(:class:`Chunk`: a box of the array stored in a data file, through a codec pipeline),
its data files (:class:`FileEntry`) and, for a format-1.0 root read on its own, the
parts (:class:`PartEntry`) that hold the rest of its chunks. Pure data: :mod:`.encode`
writes a manifest as format 1.0 and :mod:`.manifest` reads 1.0 and the pre-release
versions (``uckpt.format.encode_manifest`` / ``parse_manifest``), so the model imports
neither.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .. import dtypes
from ..codecs import hashing

#: a codec pipeline: the codec names applied in order when writing (``()``: raw)
Pipeline = Tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Chunk:
    """A box of an array (``start`` and ``shape`` in the global index space) stored in ``file``."""

    file: str
    offset: int
    length: int
    start: Tuple[int, ...]
    shape: Tuple[int, ...]
    #: the codec pipeline its raw bytes went through (``()``: stored raw)
    codec: Pipeline
    checksum: str
    #: the content hash of the raw bytes ("" when read from a version before 4)
    hash: str = ""
    #: the earlier checkpoint whose data file ``file`` holds the bytes, or None
    base: Optional[str] = None

    @property
    def compressed(self) -> bool:
        return bool(self.codec)


@dataclass(frozen=True, slots=True)
class ArrayEntry:
    path: str
    dtype: str
    shape: Tuple[int, ...]
    #: a tuple; read from a version-5 grid listing, a sequence equal to the tuple, whose
    #: chunks are made from compact columns each time they are read
    chunks: Sequence[Chunk]
    #: the Merkle root a version-4/5 manifest recorded ("" otherwise: computed,
    #: :meth:`recorded_root`)
    root: str = ""

    @property
    def nbytes(self) -> int:
        return dtypes.nbytes(self.dtype, self.shape)

    def recorded_root(self) -> str:
        """The Merkle root the manifest states: ``root``, or the one of its chunks' hashes
        (format 1.0 states only those)."""
        return self.root or hashing.format_hash(self.merkle_root())

    def merkle_root(self, digests: Optional[Sequence[bytes]] = None) -> bytes:
        """The array's Merkle root from its chunks' hashes, or from ``digests`` (one per
        chunk, in order: hashes recomputed from the bytes)."""
        if digests is None:
            digests = hashing.parse_hashes([c.hash for c in self.chunks])
        root: bytes = hashing.array_root(
            self.dtype, self.shape, [(c.start, c.shape, d) for c, d in zip(self.chunks, digests)])
        return root


@dataclass(frozen=True, slots=True)
class FileEntry:
    name: str
    rank: int
    size: int


@dataclass(frozen=True, slots=True)
class PartEntry:
    """A part file of a format-1.0 root: its name, exact size and CRC-32C, and the runs
    ``(first, count)`` of array indices it has chunks of."""

    file: str
    size: int
    checksum: str
    arrays: Tuple[Tuple[int, int], ...]


@dataclass
class Manifest:
    world_size: int
    tree: Dict[str, Any]
    arrays: Dict[str, ArrayEntry]
    files: Dict[str, FileEntry]
    step: Optional[int] = None
    metadata: Dict[str, Any] = field(default_factory=dict)
    generator: str = ""
    created: str = ""
    #: the version it was read as: "1.0", or a pre-release integer (1 to 6); a manifest
    #: is always written as 1.0
    format_version: Any = "1.0"
    #: the checksum the manifest file recorded (and matched); None for version 1
    checksum: Optional[str] = None
    #: earlier checkpoints whose data files chunks refer to: name -> file -> size
    bases: Dict[str, Dict[str, int]] = field(default_factory=dict)
    #: the checkpoint's Merkle root the manifest recorded ("" before version 4)
    merkle_root: str = ""
    #: the parts a format-1.0 root listed (read: ``parts_pending`` until attached)
    parts: List[PartEntry] = field(default_factory=list)
    #: indices into ``parts`` of the parts not yet read (:meth:`attach_part`)
    parts_pending: List[int] = field(default_factory=list)
    #: the rank whose rows each part lists (extension ``part-ranks``), None if not declared
    part_ranks: Optional[Tuple[int, ...]] = None
    #: each part's root (extension ``part-roots``, 16 bytes each), None if not declared
    part_roots: Optional[Tuple[bytes, ...]] = None
    #: the state :meth:`attach_part` needs (the 1.0 parser's), None once all are attached
    _pending: Any = field(default=None, repr=False, compare=False)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())

    def unhashed(self) -> Optional[str]:
        """The path of an array with a chunk without a content hash (one read from a
        manifest older than version 4), or None."""
        return next((a.path for a in self.arrays.values() for c in a.chunks if not c.hash), None)

    def attach_part(self, index: int, data: bytes) -> None:
        """Check part ``index``'s bytes (size, checksum, content) and add its chunks; once
        the last pending part is attached, check that every array is tiled."""
        if index not in self.parts_pending:
            raise ValueError(f"part {index} is not pending")
        self._pending.attach(self, index, data)

    def check_part(self, index: int, data: bytes) -> Tuple[Any, Any]:
        """Check pending part ``index``'s bytes as :meth:`attach_part` does and return its
        rows, ``(array index of each row, rows.Table)``, without attaching them (a reader
        that goes through the parts one at a time holds one part's rows at a time)."""
        if index not in self.parts_pending:
            raise ValueError(f"part {index} is not pending")
        rows: Tuple[Any, Any] = self._pending.check_part(self, index, data)
        return rows

    def rows_read(self) -> List[Tuple[Any, Any]]:
        """While parts are pending, the rows of the root and of the parts attached so far,
        each ``(array index of each row, rows.Table)``; ``[]`` once none is pending."""
        return [] if self._pending is None else list(self._pending.tables)



def _slot_setters(cls: type) -> Tuple[Any, ...]:
    """The slot descriptors' setters of ``cls``'s fields, in order (they set a field of a
    frozen instance without its ``__setattr__``)."""
    return tuple(getattr(cls, f.name).__set__ for f in dataclasses.fields(cls))


_CHUNK_SET = _slot_setters(Chunk)
_ENTRY_SET = _slot_setters(ArrayEntry)
_new_object = object.__new__


def make_chunk(file: str, offset: int, length: int, start: Tuple[int, ...],
               shape: Tuple[int, ...], codec: Pipeline, checksum: str, hash: str,
               base: Optional[str]) -> Chunk:
    """A checked Chunk, without the frozen ``__init__`` (which sets each field through
    ``object.__setattr__``: a third of the time a manifest of many small arrays takes to
    read)."""
    obj: Chunk = _new_object(Chunk)
    f, o, n, st, sh, c, ck, h, b = _CHUNK_SET
    f(obj, file), o(obj, offset), n(obj, length), st(obj, start), sh(obj, shape)
    c(obj, codec), ck(obj, checksum), h(obj, hash), b(obj, base)
    return obj


def make_entry(path: str, dtype: str, shape: Tuple[int, ...], chunks: Sequence[Chunk],
               root: str = "") -> ArrayEntry:
    """A checked ArrayEntry (as :func:`make_chunk`)."""
    obj: ArrayEntry = _new_object(ArrayEntry)
    p, d, s, c, r = _ENTRY_SET
    p(obj, path), d(obj, dtype), s(obj, shape), c(obj, chunks), r(obj, root)
    return obj
