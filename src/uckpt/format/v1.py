"""The parser of format 1.0 (docs/format.md): a root manifest, then its parts.

:func:`parse_root` checks the root (its members, the array table, the codec pipelines,
its own chunk table, the part entries and the tree) and returns a
:class:`~.model.Manifest` whose parts are pending; :meth:`Manifest.attach_part` checks a
part's size, checksum and chunk table and adds its chunks; once none is pending, every
array is checked to be tiled exactly by its chunks across the root and all parts.
"""
from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .. import dtypes
from ..runtime import memory
from ..codecs.checksum import FORM as _CHECKSUM
from ..codecs.checksum import of as _crc_text
from ..errors import (CorruptCheckpointError, FormatVersionError, ManifestError,
                      MemoryLimitError, UnsupportedExtensionError)
from . import chunk_table, part_roots
from .checks import Checker
from .encode import FORMAT_VERSION, PART_FORMAT
from .model import FileEntry, Manifest, PartEntry, Pipeline, make_entry
from .rows import Rows, Table
from .strict_json import loads as strict_json_loads
from .values import MAX_DIMS, MAX_INT
from .values import key as _key, show as _show

ROOT_FIELDS = ("format", "format_version", "extensions", "generator", "created", "world_size",
               "step", "metadata", "files", "bases", "tree", "arrays", "codecs", "chunks",
               "parts", "merkle_root", "manifest_checksum")
PART_FIELDS = ("format", "format_version", "chunks")
#: the codec pipelines of format 1.0
PIPELINES: Tuple[Pipeline, ...] = ((), ("zstd",), ("bytegroup", "zstd"))
#: extensions this uckpt implements (docs/format.md section 13)
EXTENSIONS: frozenset[str] = frozenset({"part-ranks", part_roots.NAME})
#: the member of extension ``part-ranks`` (section 13.1)
PART_RANKS = "part-ranks:ranks"
MAX_PART_BYTES = 1 << 30  # like the root manifest
_EXTENSION = re.compile(r"[a-z][a-z0-9-]{0,63}")


_DTYPES = {name: name for name in dtypes.NAMES}  # (the format's own strings: one per dtype)
_ITEMSIZE = {name: dtypes.itemsize(name) for name in dtypes.NAMES}


def _fast_shape(obj: Any, itemsize: int) -> Optional[Tuple[int, ...]]:
    """The shape, if it is a list of at most 64 integers 0..2**63-1 whose array's byte size
    (each 0 counted as 1) fits 2**63-1; else None."""
    if type(obj) is not list or len(obj) > MAX_DIMS:
        return None
    size = itemsize
    for n in obj:
        if type(n) is not int or n < 0 or n > MAX_INT:
            return None
        size *= n if n > 1 else 1
    return tuple(obj) if size <= MAX_INT else None


def parse_root(doc: Any, checksum: str, where: str) -> Manifest:
    """The manifest of 1.0 root ``doc`` (its checksum member already verified)."""
    return _Root(where).manifest(doc, checksum)


class _Root(Checker):
    def manifest(self, doc: Dict[str, Any], checksum: str) -> Manifest:
        extensions = self.extensions(doc.get("extensions"))
        self.members(doc, extensions)
        world, step = self.head(doc)
        files = self.files(doc["files"], world)
        bases = self.bases(doc["bases"])
        merkle = self.hash_text(doc["merkle_root"], "merkle_root")
        paths, names, shapes = self.array_table(doc["arrays"])
        codecs = self.codecs(doc["codecs"])
        meta = chunk_table.arrays_of(paths, shapes, [_ITEMSIZE[d] for d in names])
        state = _State(self, meta, names, codecs, files, bases)
        state.add(*chunk_table.decode(self, doc["chunks"], "chunks", meta, codecs, files, bases))
        del doc["chunks"]  # (decoded: freed before the tree's check)
        parts = self.parts(doc["parts"], len(paths), files)
        ranks = self.part_ranks(doc, extensions, len(parts), world)
        roots = part_roots.parse(self, doc, extensions, len(parts))
        if roots is not None:
            part_roots.check_merkle(self, merkle, state.tables[0], roots)
        m = Manifest(world_size=world, tree=doc["tree"], arrays={}, files=files, step=step,
                     metadata=doc["metadata"], generator=doc["generator"],
                     created=doc["created"], format_version=FORMAT_VERSION, checksum=checksum,
                     bases=bases, merkle_root=merkle, parts=parts,
                     parts_pending=list(range(len(parts))), part_ranks=ranks, part_roots=roots,
                     _pending=state)
        if parts:  # (the arrays without chunks until every part is attached)
            m.arrays = {p: make_entry(p, d, s, ()) for p, d, s in zip(paths, names, shapes)}
        else:
            state.finish(m)
        self.tree(doc["tree"], m.arrays)
        return m

    def extensions(self, obj: Any) -> Dict[str, bool]:
        self.need(obj, "extensions", dict, "an object of extension name -> {required}")
        out: Dict[str, bool] = {}
        for name, entry in obj.items():
            loc = f"extensions[{_key(name)}]"
            if not _EXTENSION.fullmatch(name):
                self.fail(loc, "an extension name is 1 to 64 characters: a lowercase letter, "
                               "then lowercase letters, digits and '-'")
            self.need(entry, loc, dict, "an object {\"required\": true or false}")
            self.fields(entry, loc, ("required",))
            out[name] = self.need(entry["required"], loc + ".required", bool, "true or false")
            if out[name] and name not in EXTENSIONS:
                raise UnsupportedExtensionError(
                    f"{self.where}: {loc}: the checkpoint requires extension {name!r}, which "
                    "this uckpt does not implement", path=self.where, field=loc,
                    hint="upgrade uckpt to a version that implements it")
        return out

    def members(self, doc: Dict[str, Any], extensions: Dict[str, bool]) -> None:
        missing = [k for k in ROOT_FIELDS if k not in doc]
        if missing:
            self.fail("<top>", f"missing field(s) {', '.join(missing)}")
        unknown = [k for k in doc if k not in ROOT_FIELDS and
                   k.partition(":")[0] not in extensions]
        if unknown:
            self.fail("<top>", f"unknown field(s) {', '.join(map(_key, unknown[:10]))} (an "
                               "extension's members are '<extension>:<field>' of a declared "
                               "extension)")

    def array_table(self, obj: Any) -> Tuple[List[str], List[str], List[Tuple[int, ...]]]:
        at = "arrays"
        self.need(obj, at, dict, "an array table {paths, dtypes, shapes}")
        self.fields(obj, at, ("paths", "dtypes", "shapes"))
        paths = self.need(obj["paths"], at + ".paths", list, "a list of array paths")
        names = self.need(obj["dtypes"], at + ".dtypes", list, "a list of dtype names")
        shapes = self.need(obj["shapes"], at + ".shapes", list, "a list of shapes")
        for member, values in (("dtypes", names), ("shapes", shapes)):
            if len(values) != len(paths):
                self.fail(f"{at}.{member}", f"{len(values)} items for {len(paths)} paths")
        bad = next((k for k, p in enumerate(paths) if type(p) is not str), None)
        if bad is not None:
            self.fail(f"{at}.paths[{bad}]", f"expected an array path (a string), got "
                                            f"{_show(paths[bad])}")
        if len(set(paths)) != len(paths):
            seen: set[str] = set()
            for k, p in enumerate(paths):
                if p in seen:
                    self.fail(f"{at}.paths[{k}]", f"array {p!r:.80} is listed twice")
                seen.add(p)
        out_names = [_DTYPES.get(d) if type(d) is str else None for d in names]
        out_shapes: List[Tuple[int, ...]] = []
        for k, (d, s) in enumerate(zip(out_names, shapes)):
            shape = _fast_shape(s, _ITEMSIZE.get(d, 0)) if d is not None else None
            if shape is None:  # a problem: found and named field by field
                out_names[k] = d = self.dtype(names[k], f"{at}.dtypes[{k}]")
                shape = self.shape(s, f"{at}.shapes[{k}]")
                self.array_size(d, shape, f"{at}.shapes[{k}] (array {paths[k]!r:.80})")
            out_shapes.append(shape)
        return paths, out_names, out_shapes  # type: ignore[return-value]

    def codecs(self, obj: Any) -> List[Pipeline]:
        self.need(obj, "codecs", list, "a list of codec pipelines")
        if not obj:
            self.fail("codecs", "lists at least one pipeline")
        out: List[Pipeline] = []
        for k, p in enumerate(obj):
            loc = f"codecs[{k}]"
            self.need(p, loc, list, "a list of codec names")
            for j, name in enumerate(p):
                if name not in ("bytegroup", "zstd"):
                    self.fail(f"{loc}[{j}]", f"unknown codec {_show(name)} (format 1.0 has "
                                             "'bytegroup' and 'zstd')")
            pipeline = tuple(p)
            if pipeline not in PIPELINES:
                self.fail(loc, f"pipeline {p} is not one of format 1.0's: [], ['zstd'], "
                               "['bytegroup', 'zstd']")
            if pipeline in out:
                self.fail(loc, "this pipeline is listed twice")
            out.append(pipeline)
        return out

    def parts(self, obj: Any, narrays: int, files: Dict[str, FileEntry]) -> List[PartEntry]:
        self.need(obj, "parts", list, "a list of part entries")
        out: List[PartEntry] = []
        for k, entry in enumerate(obj):
            loc = f"parts[{k}]"
            self.need(entry, loc, dict, "a part entry {file, size, checksum, arrays}")
            self.fields(entry, loc, ("file", "size", "checksum", "arrays"))
            name = self.need(entry["file"], loc + ".file", str, "a file name")
            self.plain_name(name, loc + ".file", "file name")
            if name in files or name == "manifest.json" or any(p.file == name for p in out):
                self.fail(loc + ".file", f"{name!r} is a data file, the manifest or another "
                                         "part: a part has a file of its own")
            size = self.nat(entry["size"], loc + ".size")
            if size > MAX_PART_BYTES:
                self.fail(loc + ".size", f"{size} bytes; a part is at most {MAX_PART_BYTES}")
            checksum = self.need(entry["checksum"], loc + ".checksum", str, "a checksum")
            if not _CHECKSUM.fullmatch(checksum):
                self.fail(loc + ".checksum", f"expected 'crc32c:' + 8 lowercase hex digits, "
                                             f"got {_show(checksum)}")
            out.append(PartEntry(name, size, checksum,
                                 self.runs(entry["arrays"], loc + ".arrays", narrays)))
        return out

    def part_ranks(self, doc: Dict[str, Any], extensions: Dict[str, bool], nparts: int,
                   world: int) -> Optional[Tuple[int, ...]]:
        """The rank of each part (extension ``part-ranks``, section 13.1), or None."""
        if "part-ranks" not in extensions:
            return None
        if PART_RANKS not in doc:
            self.fail("<top>", f"extension 'part-ranks' is declared, but {PART_RANKS!r} is "
                               "missing")
        obj = self.need(doc[PART_RANKS], PART_RANKS, list, "a list of ranks, one per part")
        if len(obj) != nparts:
            self.fail(PART_RANKS, f"{len(obj)} ranks for {nparts} parts")
        ranks = tuple(self.nat(r, f"{PART_RANKS}[{k}]") for k, r in enumerate(obj))
        bad = next((k for k, r in enumerate(ranks) if r >= world), None)
        if bad is not None:
            self.fail(f"{PART_RANKS}[{bad}]", f"rank {ranks[bad]} of a world of {world}")
        if len(set(ranks)) != len(ranks):
            self.fail(PART_RANKS, "a rank is listed twice: each rank has at most one part")
        return ranks

    def runs(self, obj: Any, loc: str, narrays: int) -> Tuple[Tuple[int, int], ...]:
        self.need(obj, loc, list, "a list of [first, count] runs")
        out: List[Tuple[int, int]] = []
        end = -1
        for j, run in enumerate(obj):
            here = f"{loc}[{j}]"
            if type(run) is not list or len(run) != 2:
                self.fail(here, f"expected a run [first, count], got {_show(run)}")
            first, count = self.nat(run[0], here + "[0]"), self.nat(run[1], here + "[1]")
            if count < 1 or first + count > narrays:
                self.fail(here, f"the run [{first}, {count}] is empty or reaches beyond the "
                                f"{narrays} arrays")
            if first <= end:
                self.fail(here, "runs are sorted, and neither overlap nor touch")
            end = first + count
            out.append((first, count))
        return tuple(out)


class _State:
    """The chunks found so far (root and attached parts), per array index."""

    def __init__(self, p: Checker, meta: chunk_table.Arrays, names: List[str],
                 codecs: List[Pipeline], files: Dict[str, FileEntry],
                 bases: Dict[str, Dict[str, int]]) -> None:
        self.p, self.meta, self.names, self.codecs = p, meta, names, codecs
        self.files, self.bases = files, bases
        self.tables: List[Tuple[np.ndarray, Table]] = []  # (array index of each row, rows)
        self._grouped: List[Tuple[np.ndarray, List[int]]] = []  # per table: _by_array

    def rows_so_far(self, i: int) -> Rows:
        """The rows of array ``i`` in the root and the parts attached so far (for a reader
        that reads only some parts: docs/format.md section 7)."""
        narrays = len(self.meta.paths)
        while len(self._grouped) < len(self.tables):
            self._grouped.append(_by_array(self.tables[len(self._grouped)][0], narrays))
        chunks = Rows(None, None, 0, 0)
        for (_, t), (order, b) in reversed(list(zip(self.tables, self._grouped))):
            if b[i] < b[i + 1]:
                chunks = Rows(t, order, b[i], b[i + 1], chunks if len(chunks) else None)
        return chunks

    def add(self, ai: np.ndarray, table: Table) -> None:
        self.tables.append((ai, table))

    def attach(self, m: Manifest, k: int, data: bytes) -> None:
        self.add(*self.check_part(m, k, data))
        m.parts_pending.remove(k)
        if not m.parts_pending:
            self.finish(m)

    def check_part(self, m: Manifest, k: int, data: bytes) -> Tuple[np.ndarray, Table]:
        """Check part ``k``'s bytes (size, checksum, members, chunk table, runs) and return
        its rows (the array index of each row, the rows), keeping nothing."""
        entry = m.parts[k]
        where = f"{self.p.where}: parts[{k}] ({entry.file})"
        if len(data) != entry.size or _crc_text(data) != entry.checksum:
            raise CorruptCheckpointError(
                f"{where}: the part holds {len(data)} bytes of checksum {_crc_text(data)}, "
                f"but the root lists {entry.size} bytes of checksum {entry.checksum}: a "
                "part of another save, or a damaged or torn one", path=entry.file,
                hint="use another checkpoint (CheckpointManager.restore falls back to the "
                     "previous step by itself)")
        p = Checker(f"{self.p.where}: parts[{k}] ({entry.file})")
        memory.check_manifest(data, p.where)
        try:
            doc = strict_json_loads(data)
        except ValueError as e:
            p.fail("<top>", f"not valid UTF-8 JSON: {e}")
        except MemoryError:
            raise MemoryLimitError(f"{p.where}: out of memory parsing a part of {len(data)} "
                                   "bytes", path=entry.file,
                                   hint="read it in a process allowed more memory") from None
        p.need(doc, "<top>", dict, "a JSON object")
        p.fields(doc, "<top>", PART_FIELDS)
        if doc["format"] != PART_FORMAT:
            p.fail("format", f"expected {PART_FORMAT!r}, got {_show(doc['format'])}")
        if doc["format_version"] != FORMAT_VERSION:
            p.fail("format_version", f"expected {FORMAT_VERSION!r} (the root's), got "
                                     f"{_show(doc['format_version'])}")
        ai, table = chunk_table.decode(p, doc["chunks"], "chunks", self.meta, self.codecs,
                                       self.files, self.bases)
        table.part = k
        inside = np.zeros(len(self.meta.paths), bool)
        for first, count in entry.arrays:
            inside[first:first + count] = True
        bad = np.flatnonzero(~inside[ai])
        if bad.size:
            r = int(bad[0])
            p.fail("chunks", f"row {r} (array {int(ai[r])}, {self.meta.paths[int(ai[r])]!r:.80}) "
                             "is of an array outside the part's runs in the root")
        present = np.zeros(len(self.meta.paths), bool)
        present[ai] = True
        missing = np.flatnonzero(inside & ~present)
        if missing.size:
            i = int(missing[0])
            p.fail("chunks", f"array {i} ({self.meta.paths[i]!r:.80}) is in the part's runs "
                             "in the root, but the part has no row of it")
        if m.part_roots is not None:
            part_roots.check_part(where, entry.file, m.part_roots[k], ai, table)
        return ai, table

    def finish(self, m: Manifest) -> None:
        """Check every array's tiling and the bases' use; set the arrays' chunks (each a
        :class:`~.rows.Rows` over its rows in the tables)."""
        p, used = self.p, set[Tuple[Optional[str], str]]()
        narrays = len(self.meta.paths)
        groups: List[Tuple[Table, np.ndarray, List[int]]] = []  # per table: its rows by array
        self._grouped.clear()
        while self.tables:  # (each table's array column freed once grouped)
            groups.insert(0, (self.tables[-1][1], *_by_array(self.tables.pop()[0], narrays)))
        if len(groups) == 1:  # (the common case: one table, no parts)
            t, order, b = groups[0]
            whole = _whole_arrays(t, order, b)
            arrays = m.arrays
            for i, (path, dtype, shape, lo, hi, one) in enumerate(zip(
                    self.meta.paths, self.names, self.meta.shapes, b, b[1:], whole)):
                chunks = Rows(t, order, lo, hi) if hi > lo else Rows(None, None, 0, 0)
                if not one:
                    p.tiling(*chunks.corners(len(shape)), shape,
                             f"chunks: array {i} ({path!r:.80})")
                arrays[path] = make_entry(path, dtype, shape, chunks)
        else:
            for i, (path, dtype, shape) in enumerate(zip(self.meta.paths, self.names,
                                                         self.meta.shapes)):
                chunks = Rows(None, None, 0, 0)
                for t, order, b in reversed(groups):
                    if b[i] < b[i + 1]:
                        chunks = Rows(t, order, b[i], b[i + 1], chunks if len(chunks) else None)
                if not chunks.whole():
                    p.tiling(*chunks.corners(len(shape)), shape,
                             f"chunks: array {i} ({path!r:.80})")
                m.arrays[path] = make_entry(path, dtype, shape, chunks)
        for table, _, _ in groups:
            used.update(table.bases_used())
        p.bases_used(self.bases, used)
        m._pending = None


def _whole_arrays(t: Table, order: np.ndarray, starts: List[int]) -> List[bool]:
    """Per array (its rows ``order[starts[i]:starts[i + 1]]`` of table ``t``): is it one
    chunk whose box is the whole array (as :meth:`~.rows.Rows.whole`)?"""
    b = np.asarray(starts, np.int64)
    one = np.diff(b) == 1
    if not len(order):
        return [False] * len(one)
    first = order[np.minimum(b[:-1], len(order) - 1)]  # (an array without rows: any row)
    out: List[bool] = (one & t.whole[first]).tolist()
    return out


def _by_array(ai: np.ndarray, narrays: int) -> Tuple[np.ndarray, List[int]]:
    """The rows of array column ``ai`` sorted by array (stable), and where each array's
    rows start in that order (``narrays`` + 1 positions)."""
    order = np.argsort(ai, kind="stable")
    starts = np.searchsorted(ai[order], np.arange(narrays + 1)).tolist()
    if len(order) < 1 << 32:  # (half the bytes, kept as long as the manifest)
        order = order.astype(np.uint32)
    return order, starts


def version_error(where: str, version: Any) -> Optional[FormatVersionError]:
    """The error for a ``format_version`` string other than "1.0" (None for "1.0")."""
    if version == FORMAT_VERSION:
        return None
    return FormatVersionError(
        f"{where}: format_version {_show(version)} is not supported (this uckpt reads format "
        f"{FORMAT_VERSION} and the pre-release versions 1 to 6)", path=where,
        hint="upgrade uckpt to read it")


__all__ = ["ManifestError", "parse_root", "version_error"]
