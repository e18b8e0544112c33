"""A save by several ranks: each rank writes its own manifest part; the root from small records.

Called by :func:`uckpt.saving.collective.finish_collective` for a save that refers to no base
(docs/format.md section 15; an incremental save gathers every chunk, as the baseline
of the next one needs them). In the write step each rank, after its data file:

* encodes the rows of the chunks it wrote of sharded and per-rank arrays as its part
  (``manifest.part-NNNNN.json``, NNNNN its rank) and writes it into the sink like its
  data file (:func:`write_own_part`);
* tells the others only a small record (:func:`own_record`): its part's entry with the
  part's root (extension ``part-roots``, section 13.2: 16 bytes, not one hash per
  chunk) and the rows of the chunks it wrote of replicated arrays (every rank loads
  those: they go into the root's chunk table, so that no load needs every part).

The committer of each replica builds the root from those records, the array table and
the tree (:func:`encode_root_of`), without walking the plan: ``merkle_root`` from the
root's rows and the part roots. It declares extensions ``part-ranks`` (section 13.1),
so that a rank that loads finds its own part, and ``part-roots``. Node-local storage
(several replicas): each replica's directory needs every part its root lists, so the
ranks exchange their parts' bytes (one more all-gather, only then) and each committer
writes the parts of the ranks of other replicas (:func:`write_foreign_parts`).
"""
from __future__ import annotations

import logging
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

import numpy as np

from ..codecs import hashing
from .commit import GENERATOR, created_now
from ..format.encode import encode_part, encode_root
from ..format.part_roots import NAME as PART_ROOTS, ROOTS
from ..format.model import ArrayEntry, Chunk, FileEntry, Manifest, Pipeline
from .plan import ArrayMeta, SavePlan, WriteItem

log = logging.getLogger("uckpt.saving.own_parts")

#: the pipelines of a compressed save, in the root's order (section 5)
_ALL_PIPELINES: Tuple[Pipeline, ...] = ((), ("zstd",), ("bytegroup", "zstd"))


def part_file(rank: int) -> str:
    """The name of the part of ``rank``."""
    return f"manifest.part-{rank:05d}.json"


def pipelines(compressed: bool) -> Dict[Pipeline, int]:
    """The root's ``codecs`` (pipeline -> index), fixed before any rank writes, so that
    every rank encodes its part against the same list."""
    return {p: k for k, p in enumerate(_ALL_PIPELINES if compressed else ((),))}


def replicated_paths(flat: Any) -> Set[str]:
    """The arrays every rank holds whole: this rank's plain array leaves (the plan checked
    them equal on every rank), not its :class:`~uckpt.Shard` or ``PerRank`` ones (the rule
    of :func:`uckpt.saving.global_plan.local_metadata`; a cached plan keeps no lists of them)."""
    mine = tuple("/".join(parts) + "/" for parts in flat.per_rank)
    return {p for p in flat.arrays if p not in flat.placements and not p.startswith(mine)}


def write_own_part(sink: Any, rank: int, items: Sequence[WriteItem], chunks: Sequence[Chunk],
                   metas: Dict[str, ArrayMeta], replicated: Set[str],
                   used: Dict[Pipeline, int]) -> Tuple[Optional[Dict[str, Any]], bytes]:
    """Write the part of ``rank`` (the rows of ``chunks``, one per item of ``items``,
    of arrays not in ``replicated``) through ``sink``; return its root entry, with
    ``"root"``: the part's root (section 13.2, text; :func:`encode_root_of` moves it to
    ``"part-roots:roots"``), and its bytes; ``(None, b"")`` when it has no rows (no part)."""
    index = _index(metas)
    rows = [(index[it.path], c) for it, c in zip(items, chunks) if it.path not in replicated]
    if not rows:
        return None, b""
    data, entry = encode_part(rows, used)
    name = part_file(rank)
    sink.write_pieces(name, len(data), [(0, np.frombuffer(data, np.uint8))])
    root = hashing.rows_root([(i, c.start, c.shape, hashing.parse_hash(c.hash)) for i, c in rows])
    return {"file": name, **entry, "root": hashing.format_hash(root)}, data


def own_record(items: Sequence[WriteItem], chunks: Sequence[Chunk], replicated: Set[str],
               part: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """What a rank tells the others of what it wrote (JSON-able): its part's entry and
    root (:func:`write_own_part`), and the rows of its chunks of replicated arrays
    ``(path, start, shape, offset, length, codec, checksum, hash)``: its own share of the
    plan, and not a byte per chunk of its part."""
    root_rows = [(it.path, c.start, c.shape, c.offset, c.length, c.codec, c.checksum, c.hash)
                 for it, c in zip(items, chunks) if it.path in replicated]
    return {"part": part, "rows": root_rows}


def encode_root_of(head: Manifest, records: Sequence[Dict[str, Any]],
                   used: Dict[Pipeline, int],
                   extra: Optional[Dict[str, Any]] = None) -> bytes:
    """The root manifest of ``head`` (tree, array table, files, step, metadata) from the
    ranks' records (:func:`own_record`, in rank order): O(ranks) records and the rows of
    the replicated arrays, not the plan's items. ``extra``: further extensions, name ->
    ``(required, {member: value})`` (e.g. ``redundancy``, docs/format.md 13.3)."""
    index = _index(head.arrays)
    file_of = {f.rank: f.name for f in head.files.values()}
    root_rows: List[Tuple[int, Chunk]] = []
    for rank, record in enumerate(records):
        for path, start, shape, offset, length, codec, checksum, content in record["rows"]:
            root_rows.append((index[path], Chunk(file_of[rank], offset, length, tuple(start),
                                                 tuple(shape), tuple(codec), checksum,
                                                 content)))
    table = [(i, c.start, c.shape, hashing.parse_hash(c.hash)) for i, c in root_rows]
    parts = [r["part"] for r in records if r["part"] is not None]
    entries = [{k: v for k, v in p.items() if k != "root"} for p in parts]
    if not entries:  # every row in the root: the Merkle root of section 11.3
        leaves: Dict[str, List[Tuple[Tuple[int, ...], Tuple[int, ...], bytes]]] = {
            p: [] for p in head.arrays}
        paths = list(head.arrays)
        for i, start, shape, digest in table:
            leaves[paths[i]].append((start, shape, digest))
        roots = {p: hashing.array_root(a.dtype, a.shape, leaves[p])
                 for p, a in head.arrays.items()}
        return encode_root(head, used, root_rows, [],
                           hashing.format_hash(hashing.checkpoint_root(roots)), extra)
    ranks = [rank for rank, r in enumerate(records) if r["part"] is not None]
    part_roots = [p["root"] for p in parts]
    top = hashing.split_root(hashing.rows_root(table), hashing.parse_hashes(part_roots))
    extensions = {"part-ranks": (False, {"part-ranks:ranks": ranks}),
                  PART_ROOTS: (True, {ROOTS: part_roots}), **(extra or {})}
    return encode_root(head, used, root_rows, entries, hashing.format_hash(top), extensions)


def write_foreign_parts(sink: Any, parts: Sequence[Optional[str]], replicas: Sequence[Any],
                        rank: int) -> None:
    """Write, through ``sink`` (the replica of ``rank``), the parts (their text, by rank;
    None: no part) of the ranks of other replicas."""
    for r, text in enumerate(parts):
        if text is not None and replicas[r] != replicas[rank]:
            data = text.encode("utf-8")
            sink.write_pieces(part_file(r), len(data), [(0, np.frombuffer(data, np.uint8))])


def head_manifest(tree: Dict[str, Any], metas: Dict[str, ArrayMeta], plan: SavePlan,
                  sizes: Sequence[int], step: Optional[int], metadata: Dict[str, Any]
                  ) -> Manifest:
    """The manifest's root-level content (arrays without chunks), as the committer knows
    it once the ranks' data files' sizes are known (what it encodes the root of)."""
    arrays = {p: ArrayEntry(p, m.dtype, tuple(m.shape), ()) for p, m in metas.items()}
    files = {f: FileEntry(f, r, sizes[r]) for r, (f, _) in enumerate(plan.file_sizes)}
    return Manifest(world_size=plan.world_size, tree=tree, arrays=arrays, files=files,
                    step=step, metadata=metadata, generator=GENERATOR, created=created_now())


def _index(arrays: Mapping[str, Any]) -> Dict[str, int]:
    """Each array's index in the root's array table (the order of the plan's arrays)."""
    return {p: i for i, p in enumerate(arrays)}
