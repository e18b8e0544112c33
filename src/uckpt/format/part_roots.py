"""Extension ``part-roots`` (docs/format.md section 13.2): a split checkpoint's
``merkle_root`` finished from one root per chunk table.

The parser checks the declaration and ``"part-roots:roots"`` (:func:`parse`), then
``merkle_root`` against the root's rows and the part roots (:func:`check_merkle`), and
each part's rows against its root as the part is read (:func:`check_part`); ``verify``
recomputes ``merkle_root`` from the hashes of the bytes (:func:`recompute`).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..codecs import hashing
from ..errors import CorruptCheckpointError
from .checks import Checker
from .model import Chunk
from .rows import Rows, Table

NAME = "part-roots"
#: the extension's root member: one part root per entry of ``parts``
ROOTS = "part-roots:roots"


def parse(p: Checker, doc: Dict[str, Any], extensions: Dict[str, bool],
          nparts: int) -> Optional[Tuple[bytes, ...]]:
    """The part roots of root ``doc`` (16 bytes each, in the order of ``parts``), or None
    when the extension is not declared."""
    if NAME not in extensions:
        return None
    loc = f"extensions[{NAME!r}]"
    if not extensions[NAME]:
        p.fail(loc, f"extension {NAME!r} redefines merkle_root, so it is declared "
                    "{\"required\": true}, not false")
    if nparts == 0:
        p.fail(loc, f"extension {NAME!r} is declared, but the checkpoint has no parts")
    if ROOTS not in doc:
        p.fail("<top>", f"extension {NAME!r} is declared, but {ROOTS!r} is missing")
    obj = p.need(doc[ROOTS], ROOTS, list, "a list of part roots, one per part")
    if len(obj) != nparts:
        p.fail(ROOTS, f"{len(obj)} roots for {nparts} parts")
    return tuple(hashing.parse_hash(p.hash_text(r, f"{ROOTS}[{k}]")) for k, r in enumerate(obj))


def table_root(ai: np.ndarray, table: Table) -> bytes:
    """The root of a decoded chunk table (the array index of each row, the rows)."""
    n = len(ai)
    at, nd = table.box_at.tolist(), table.nd.tolist()
    box = table.box.tolist()
    base = 4 * n
    d = table.digests
    rows = [(i, box[b:b + k], box[b + k:b + 2 * k], d[base + 16 * r:base + 16 * r + 16])
            for r, (i, b, k) in enumerate(zip(ai.tolist(), at, nd))]
    return hashing.rows_root(rows)


def check_merkle(p: Checker, merkle: str, root_table: Tuple[np.ndarray, Table],
                 roots: Sequence[bytes]) -> None:
    """Refuse a ``merkle_root`` other than the root's rows and the part roots give."""
    want = hashing.format_hash(hashing.split_root(table_root(*root_table), roots))
    if want != merkle:
        p.fail("merkle_root", f"{merkle} is not the root that the root's chunks and "
                              f"{ROOTS!r} give ({want}): the root manifest is inconsistent")


def check_part(where: str, file: str, root: bytes, ai: np.ndarray, table: Table) -> None:
    """Refuse part ``file`` (``where`` names it) if its rows do not give ``root``."""
    got = table_root(ai, table)
    if got != root:
        raise CorruptCheckpointError(
            f"{where}: the part's rows give the root {hashing.format_hash(got)}, but the "
            f"root manifest's {ROOTS!r} lists {hashing.format_hash(root)}: a part sealed "
            "by another save, or a writer's fault", path=file,
            hint="use another checkpoint (CheckpointManager.restore falls back to the "
                 "previous step by itself)")


def recompute(arrays: Sequence[Tuple[str, Sequence[Chunk]]], nparts: int,
              digest: Callable[[str, Tuple[int, ...]], bytes]) -> bytes:
    """``merkle_root`` from every array's rows (path and chunks of a parsed 1.0 manifest,
    in the order of the array table) and ``digest(path, start)``, each row's content hash
    recomputed from its bytes."""
    tables: List[List[hashing.Row]] = [[] for _ in range(nparts + 1)]  # the root's, then parts
    for i, (path, chunks) in enumerate(arrays):
        if not isinstance(chunks, Rows):
            raise TypeError(f"array {path!r}: its chunks are not rows of parsed chunk tables")
        for table, ks in chunks.segments():
            rows = tables[table.part + 1]
            for c in table.chunks(ks):
                rows.append((i, c.start, c.shape, digest(path, c.start)))
    return hashing.split_root(hashing.rows_root(tables[0]),
                              [hashing.rows_root(t) for t in tables[1:]])
