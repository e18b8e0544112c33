"""The pre-release manifests (integer ``format_version`` 1 to 6), read into the 1.0 model.

Versions 1 to 6 were written only by development builds (docs/format-legacy.md).
:func:`parse` checks one as strictly as it always was (unknown fields, wrong types,
numbers beyond the format's limits, chunks outside their file or array or overlapping,
file names that leave the directory: all errors naming the field) and returns the same
:class:`~uckpt.format.model.Manifest` the 1.0 parser does, codec names turned into
pipelines. Version 5's ``grid`` listings are :mod:`.grid`, version 6's ``table`` is
:mod:`.table`.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple, Union

from ... import dtypes
from ...codecs.checksum import FORM as _CHECKSUM
from ...codecs.checksum import parse_checksum
from ...errors import FormatVersionError, UnsafePathError
from .. import integrity
from ..checks import HASH as _HASH, Checker, plain_name
from ..model import ArrayEntry, Chunk, FileEntry, Manifest, make_chunk
from ..values import MAX_DIMS, MAX_INT
from ..values import key as _key, show as _show
from . import grid, table

READ_VERSIONS = (1, 2, 3, 4, 5, 6)
#: the codec names of versions 3 to 6, and the pipeline each is in format 1.0
PIPELINE_OF = {"raw": (), "zstd": ("zstd",), "zstd+bytegroup": ("bytegroup", "zstd")}
CODECS = tuple(PIPELINE_OF)
CODECS_OF = {1: ("raw",), 2: ("raw",), 3: CODECS, 4: CODECS, 5: CODECS, 6: CODECS}
#: a compressed chunk decodes to at most this many bytes per stored byte (section 6.3)
MAX_RATIO = 32768

_TOP_FIELDS = ("format", "format_version", "generator", "created", "world_size", "step",
               "metadata", "files", "tree", "arrays")
_TOP_FIELDS_V2 = _TOP_FIELDS + (integrity.FIELD,)
_TOP_FIELDS_V4 = _TOP_FIELDS + ("bases", "merkle_root", integrity.FIELD)
_CHUNK_FIELDS = ("file", "offset", "length", "start", "shape", "codec", "checksum")
_CHUNK_FIELDS_V4 = _CHUNK_FIELDS + ("hash",)

_CHUNK_KEYS = frozenset(_CHUNK_FIELDS)
_CHUNK_KEYS_V4 = frozenset(_CHUNK_FIELDS_V4)
_CHUNK_KEYS_BASE = _CHUNK_KEYS_V4 | {"base"}

class _Loc:
    """``arrays['p'].chunks[i]``, formatted only when an error needs it."""

    def __init__(self, array_loc: str, index: int) -> None:
        self.array_loc, self.index = array_loc, index

    def __str__(self) -> str:
        return f"{self.array_loc}.chunks[{self.index}]"

    def __add__(self, other: str) -> str:
        return str(self) + other


_ARRAY_KEYS = frozenset(("dtype", "shape", "chunks"))
_ARRAY_KEYS_V4 = _ARRAY_KEYS | {"root"}
_GRID_ARRAY_FIELDS = ("dtype", "shape", "grid", "root")


def _fast_array_head(entry: Any, v4: bool) -> Optional[Tuple[str, Tuple[int, ...], str]]:
    """``(dtype, shape, root)`` of an array entry (root "" before version 4), if its fields,
    dtype, shape and root are all valid; None sends it to the field-by-field checks (which
    name the problem)."""
    if type(entry) is not dict or entry.keys() != (_ARRAY_KEYS_V4 if v4 else _ARRAY_KEYS):
        return None
    dtype, shape = entry["dtype"], entry["shape"]
    root = entry["root"] if v4 else ""
    if type(dtype) is not str or dtype not in dtypes.NAMES or type(shape) is not list \
            or len(shape) > MAX_DIMS or type(entry["chunks"]) is not list:
        return None
    if v4 and (type(root) is not str or not _HASH.fullmatch(root)):
        return None
    for n in shape:
        if type(n) is not int or n < 0 or n > MAX_INT:
            return None
    return dtype, tuple(shape), root


def _fast_chunk(obj: Any, itemsize: int, shape: Tuple[int, ...], files: Dict[str, FileEntry],
                codecs: Tuple[str, ...], v4: bool,
                bases: Dict[str, Dict[str, int]]) -> Optional[Chunk]:
    """The chunk, if every rule holds; None sends it to the field-by-field checks. Every
    number is then within int64: the file's size and the array's shape were checked."""
    if type(obj) is not dict:
        return None
    keys = obj.keys()
    base = None
    sizes: Optional[Dict[str, int]] = None  # a base's files (set where ``base`` is)
    if keys != (_CHUNK_KEYS_V4 if v4 else _CHUNK_KEYS):
        if not v4 or keys != _CHUNK_KEYS_BASE:
            return None
        base = obj["base"]  # a reference to a base's file (version 4)
        sizes = bases.get(base) if type(base) is str else None
        if sizes is None:
            return None
    content = obj["hash"] if v4 else ""
    if v4 and (type(content) is not str or not _HASH.fullmatch(content)):
        return None
    name, offset, length = obj["file"], obj["offset"], obj["length"]
    start, cshape, checksum = obj["start"], obj["shape"], obj["checksum"]
    if type(name) is not str:
        return None
    size = files[name].size if base is None and name in files else \
        sizes.get(name) if sizes is not None else None
    if (size is None or type(offset) is not int or type(length) is not int or offset < 0
            or length < 0 or offset + length > size or obj["codec"] not in codecs
            or type(start) is not list or type(cshape) is not list
            or len(start) != len(shape) or len(cshape) != len(shape)
            or type(checksum) is not str or not _CHECKSUM.fullmatch(checksum)):
        return None
    n = itemsize
    for s, c, full in zip(start, cshape, shape):
        if type(s) is not int or type(c) is not int or s < 0 or c < 0 or s + c > full:
            return None
        n *= c
    if obj["codec"] == "raw":
        if length != n:
            return None
    elif not 0 < n <= MAX_RATIO * length:  # compressed (docs/format.md section 6.3)
        return None
    return make_chunk(name, offset, length, tuple(start), tuple(cshape),
                      PIPELINE_OF[obj["codec"]], checksum, content, base)


def _fast_array(entry: Any, files: Dict[str, FileEntry], codecs: Tuple[str, ...], v4: bool,
                bases: Dict[str, Dict[str, int]]
                ) -> Optional[Tuple[str, Tuple[int, ...], Tuple[Chunk, ...], str]]:
    """``(dtype, shape, chunks, root)`` of a chunk-listed array entry, if every rule but
    the tiling of several chunks holds; None sends it to the field-by-field checks."""
    head = _fast_array_head(entry, v4)
    if head is None:
        return None
    dtype, shape, root = head
    itemsize = size = dtypes.itemsize(dtype)
    for n in shape:
        size *= n if n > 1 else 1
    if size > MAX_INT:
        return None
    chunks = []
    for obj in entry["chunks"]:
        chunk = _fast_chunk(obj, itemsize, shape, files, codecs, v4, bases)
        if chunk is None:
            return None
        chunks.append(chunk)
    return dtype, shape, tuple(chunks), root


def _one_whole_chunk(chunks: Sequence[Chunk], shape: Tuple[int, ...]) -> bool:
    """Whether ``chunks`` is one chunk of the whole array (it covers it: no tiling check)."""
    return len(chunks) == 1 and chunks[0].shape == shape and not any(chunks[0].start)


def _entry(path: str, dtype: str, shape: Tuple[int, ...], chunks: Sequence[Chunk],
           root: str) -> ArrayEntry:
    return ArrayEntry(path, dtype, shape, chunks, root)


def _row_entry(path: str, dtype: str, shape: Tuple[int, ...], chunk: Chunk) -> ArrayEntry:
    """The entry of a checked table row (no recorded root: ``ArrayEntry.recorded_root``)."""
    return _entry(path, dtype, shape, (chunk,), "")


def parse(doc: Any, checksum: Optional[str], data: bytes, where: str) -> Manifest:
    """The manifest of legacy document ``doc`` (``checksum``: what the file's checksum
    member recorded, already verified, or None when the file does not end in one)."""
    return _Parser(where).manifest(doc, checksum, data)


class _Parser(Checker):
    """Strict validation of versions 1 to 6; every error names the field as a JSON path."""

    def __init__(self, where: str) -> None:
        super().__init__(where)
        self.version = 6
        self.codecs: Tuple[str, ...] = CODECS  # those of the manifest's version, once known

    def manifest(self, doc: Dict[str, Any], checksum: Optional[str], data: bytes) -> Manifest:
        """``checksum``: what the file's checksum member recorded (already verified), or
        None when the file does not end in one."""
        version = doc["format_version"]
        if version not in READ_VERSIONS:
            newer = version > READ_VERSIONS[-1]
            raise FormatVersionError(
                f"{self.where}: format_version {_show(version)} is not supported (this uckpt "
                f"reads format \"1.0\" and the pre-release versions "
                f"{', '.join(map(str, READ_VERSIONS))})", path=self.where,
                hint="a later format is a string such as \"1.0\"; an integer above 6 was "
                     "never written by uckpt" if newer else "this version was never released")
        if version >= 2:
            if checksum is None:
                raise integrity.missing(self.where, data)
            last = next(reversed(doc), None)
            if last != integrity.FIELD or doc[last] != checksum:
                self.fail(integrity.FIELD, "must be the last member of the top-level object "
                                           "and hold the checksum that ends the file")
        self.version = version
        self.fields(doc, "<top>", _TOP_FIELDS_V4 if version >= 4 else
                    _TOP_FIELDS_V2 if version >= 2 else _TOP_FIELDS,
                    ("table",) if version >= 6 else ())
        self.codecs = CODECS_OF[version]
        world, step = self.head(doc)
        files = self.files(doc["files"], world)
        bases = self.bases(doc["bases"]) if version >= 4 else {}
        merkle = self.hash_text(doc["merkle_root"], "merkle_root") if version >= 4 else ""
        arrays = self.arrays(doc["arrays"], files, bases)
        if "table" in doc:
            table.decode(self, doc["table"], arrays, files, bases, make_chunk, _row_entry,
                         MAX_RATIO)
            del doc["table"]  # (its JSON lists and text, decoded: freed before the tree's check)
        if bases:
            self.bases_used(bases, {(c.base, c.file) for a in arrays.values()
                                    for c in a.chunks if c.base})
        tree = doc["tree"]
        self.tree(tree, arrays)
        return Manifest(world_size=world, tree=tree, arrays=arrays, files=files, step=step,
                        metadata=doc["metadata"], generator=doc["generator"],
                        created=doc["created"], format_version=version,
                        checksum=checksum if version >= 2 else None, bases=bases,
                        merkle_root=merkle)

    def arrays(self, obj: Any, files: Dict[str, FileEntry],
               bases: Dict[str, Dict[str, int]]) -> Dict[str, ArrayEntry]:
        self.need(obj, "arrays", dict, "an object of path -> array entry")
        out: Dict[str, ArrayEntry] = {}
        v4 = self.version >= 4
        grids = self.version >= 5
        for path, entry in obj.items():
            fast = None if grids and type(entry) is dict and "grid" in entry else \
                _fast_array(entry, files, self.codecs, v4, bases)
            if fast is not None:
                dtype, shape, chunks, root = fast
                if not _one_whole_chunk(chunks, shape):
                    self.coverage(chunks, shape, f"arrays[{_key(path)}].chunks")
                out[path] = _entry(path, dtype, shape, chunks, root)
            else:
                out[path] = self.checked_array(path, entry, files, bases)
        return out

    def checked_array(self, path: str, entry: Any, files: Dict[str, FileEntry],
                      bases: Dict[str, Dict[str, int]]) -> ArrayEntry:
        """An array entry checked field by field (a grid, or a problem to name)."""
        loc = f"arrays[{_key(path)}]"
        v4 = self.version >= 4
        if self.version >= 5 and type(entry) is dict and "grid" in entry:
            return self.grid_array(path, entry, loc, files, bases)
        head = _fast_array_head(entry, v4)
        if head is not None:
            dtype, shape, root = head
        else:
            self.need(entry, loc, dict, "an object")
            if "grid" in entry:  # (version 5 went to grid_array)
                self.fail(loc + ".grid", f"a grid listing is a field of format version 5; "
                                         f"this manifest is version {self.version}")
            self.fields(entry, loc, ("dtype", "shape", "chunks", "root") if v4 else
                        ("dtype", "shape", "chunks"))
            root = self.hash_text(entry["root"], loc + ".root") if v4 else ""
            dtype, shape = self.dtype_shape(entry, loc)
        itemsize = self.array_size(dtype, shape, loc + ".shape")
        chunks = tuple(_fast_chunk(c, itemsize, shape, files, self.codecs, v4, bases) or
                       self.checked_chunk(c, _Loc(loc, i), dtype, shape, files, bases)
                       for i, c in enumerate(self.need(entry["chunks"], loc + ".chunks", list,
                                                       "a list of chunks")))
        if not _one_whole_chunk(chunks, shape):
            self.coverage(chunks, shape, loc + ".chunks")
        return ArrayEntry(path, dtype, shape, chunks, root)

    def grid_array(self, path: str, entry: Dict[str, Any], loc: str, files: Dict[str, FileEntry],
                   bases: Dict[str, Dict[str, int]]) -> ArrayEntry:
        """Version 5: an array listed by its ``grid`` (docs/format.md section 15)."""
        if "chunks" in entry:
            self.fail(loc, "an array entry has 'chunks' or 'grid', not both")
        self.fields(entry, loc, _GRID_ARRAY_FIELDS)
        root = self.hash_text(entry["root"], loc + ".root")
        dtype, shape = self.dtype_shape(entry, loc)
        itemsize = self.array_size(dtype, shape, loc + ".shape")
        chunks = grid.decode(self, entry["grid"], loc, itemsize, shape, files, bases, make_chunk,
                             MAX_RATIO)
        return ArrayEntry(path, dtype, shape, chunks, root)

    def checked_chunk(self, obj: Any, loc: Union[str, _Loc], dtype: str, shape: Tuple[int, ...],
                      files: Dict[str, FileEntry], bases: Dict[str, Dict[str, int]]) -> Chunk:
        """Field-by-field validation: names the first problem (the slow path)."""
        v4 = self.version >= 4
        self.need(obj, loc, dict, "an object")
        self.fields(obj, loc, _CHUNK_FIELDS_V4 if v4 else _CHUNK_FIELDS, ("base",) if v4 else ())
        base = None
        sizes = {n: f.size for n, f in files.items()}
        listed = "'files'"
        if "base" in obj:
            base = self.need(obj["base"], loc + ".base", str, "a base checkpoint name")
            if base not in bases:
                self.fail(loc + ".base", f"base {_key(base)} is not listed in 'bases'")
            sizes, listed = bases[base], f"'bases'[{_key(base)}]"
        name = self.need(obj["file"], loc + ".file", str, "a file name")
        if name not in sizes:
            if not plain_name(name):
                self.fail(loc + ".file", f"file name {_key(name)} leaves the checkpoint "
                                         "directory", UnsafePathError)
            self.fail(loc + ".file", f"file {_key(name)} is not listed in {listed}")
        offset = self.nat(obj["offset"], loc + ".offset")
        length = self.nat(obj["length"], loc + ".length")
        if offset + length > sizes[name]:
            self.fail(loc, f"bytes {offset}..{offset + length} lie outside {name!r} "
                           f"({sizes[name]} bytes)")
        start = self.shape(obj["start"], loc + ".start")
        cshape = self.shape(obj["shape"], loc + ".shape")
        if len(start) != len(shape) or len(cshape) != len(shape):
            self.fail(loc, f"start/shape must have {len(shape)} dimensions like the array")
        for d, (s, n, full) in enumerate(zip(start, cshape, shape)):
            if s + n > full:
                self.fail(loc, f"dimension {d}: {s}+{n} exceeds the array's extent {full}")
        codec = obj["codec"]
        if codec not in self.codecs:
            leaf = loc.array_loc if isinstance(loc, _Loc) else loc
            newer = " (a newer format version's; upgrade uckpt)" if codec not in CODECS else ""
            self.fail(loc + ".codec", f"unknown codec {_show(codec)} for leaf {leaf}"
                                      f"{newer} (known here: {', '.join(self.codecs)})")
        expected = dtypes.itemsize(dtype)
        for n in cshape:
            expected *= n
        if codec == "raw" and length != expected:
            self.fail(loc + ".length", f"{length} bytes, but a raw {dtype} chunk of shape "
                                       f"{list(cshape)} holds {expected}")
        if codec != "raw" and not 0 < expected <= MAX_RATIO * length:
            self.fail(loc + ".length", f"a {codec} chunk of {length} bytes cannot hold the "
                                       f"{expected} bytes of a {dtype} box of shape "
                                       f"{list(cshape)} (a compressed chunk has elements and "
                                       f"at most {MAX_RATIO} raw bytes per stored byte)")
        checksum = self.need(obj["checksum"], loc + ".checksum", str, "a checksum string")
        try:
            parse_checksum(checksum)
        except ValueError as e:
            self.fail(loc + ".checksum", str(e))
        content = self.hash_text(obj["hash"], loc + ".hash") if v4 else ""
        return Chunk(name, offset, length, start, cshape, PIPELINE_OF[codec], checksum, content,
                     base)
