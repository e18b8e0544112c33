"""The restore of a node-local level with redundancy across nodes (docs/levels.md): a
checkpoint committed on some nodes' copies only (a node lost or wiped, or killed before
its commit), or whose share or piece is damaged on some node, is rebuilt over the job's
communicator (:func:`~uckpt.levels.rebuild_across.repair_across`) from the records of
its manifest (docs/format.md 13.3), so that every node holds its copy again.

A node without a committed copy gets one: the manifest and the part files from the
lowest node that has it (small: sent over the communicator), its share and piece
rebuilt into a new temporary copy, committed only once every file matches its record.
A node with a copy gets its damaged files replaced, each checked against its record.
"""
from __future__ import annotations

import base64
import json
import logging
from typing import IO, Any, Callable, Dict, List, Optional

from ..comm.base import Communicator
from ..loading.reader import read_manifest
from ..runtime.nodes import Nodes
from ..levels.rebuild_across import repair_across
from ..levels.records import parse_records
from ..levels.repair import Repaired
from ..levels.save_level import source_reader
from ..levels.share_io import Reader

log = logging.getLogger("uckpt.manager.restore_level")


def _copy_of(store: Any, name: str) -> Optional[Dict[str, Any]]:
    """This node's committed copy: its manifest's bytes and its part files (base64), or
    None where the node has none."""
    if not store.has(name):
        return None
    with store.source(name) as source:
        manifest = read_manifest(source)  # checked whole before any node uses it
        root = source.manifest_bytes()
        read = source_reader(source)
        parts = {p.file: base64.b64encode(read(p.file, 0, p.size)).decode()
                 for p in manifest.parts}
    return {"root": base64.b64encode(root).decode(), "parts": parts}


def rebuild(comm: Communicator, nodes: Nodes, store: Any, name: str, tier: str
            ) -> Optional[Repaired]:
    """Collective: check checkpoint ``name`` of the node-local ``store`` on every node
    and rebuild what is lost or damaged from its redundancy; what was rebuilt (on every
    rank), or None where no node's copy declares redundancy. Raises
    :class:`~uckpt.errors.ShareLostError` (every rank) where a lost share's redundancy is
    lost too; nothing is committed then."""
    leader = comm.rank in nodes.leaders
    have = comm.gather_outcomes(lambda: leader and store.has(name),
                                f"looking for {name} on tier {tier!r}")
    donors = [r for r in nodes.leaders if have[r]]
    if not donors:
        return None
    got = comm.gather_outcomes(lambda: _copy_of(store, name) if comm.rank == donors[0]
                               else None, f"sending the manifest of {name}")[donors[0]]
    root = base64.b64decode(got["root"])
    records = parse_records(json.loads(root), f"{name}/manifest.json")
    if records is None:
        return None
    opened: Dict[str, Any] = {}

    def new_copy() -> None:  # a node without a committed copy: a new one, parts first
        if leader and not have[comm.rank]:
            sink = opened["sink"] = store.sink(name)
            for file, text in got["parts"].items():
                with sink.open_writer(file) as out:
                    out.write(base64.b64decode(text))

    try:
        comm.gather_outcomes(new_copy, f"opening the new copies of {name}")
        sink = opened.get("sink")
        read, open_file = _files(store, name, sink) if leader else (_none, _nowhere)
        repaired = repair_across(comm, nodes.of_rank, records, read, open_file)

        def commit() -> None:
            if sink is not None:
                sink.commit(root)

        comm.gather_outcomes(commit, f"committing the rebuilt copies of {name}")
    except BaseException:
        if "sink" in opened:
            opened["sink"].abort()
        raise
    first = dict(zip(nodes.order, nodes.leaders))
    lost = [records.describe(i) for i, n in enumerate(records.nodes)
            if n.name not in first or not have[first[n.name]]]

    def listed(found: Dict[int, str]) -> str:
        return "; ".join(f"{records.describe(i)} ({what})" for i, what in sorted(found.items()))
    log.info("step %s on tier %r: rebuilt from %s in %.3f s: %sshares rebuilt: %s%s",
             records.step, tier, records.scheme, repaired.seconds,
             f"lost the copy of {', '.join(lost)}; " if lost else "",
             listed(repaired.shares) or "none",
             f"; pieces made again: {listed(repaired.pieces)}" if repaired.pieces else "")
    return repaired


def _files(store: Any, name: str, sink: Any
           ) -> "tuple[Reader, Callable[[str], IO[bytes]]]":
    """How this node's leader reads and writes its copy: a new one (``sink``), or its
    committed one (damaged files replaced whole)."""
    if sink is not None:
        return source_reader(sink.written(None)), sink.open_writer

    def read(file: str, offset: int, n: int) -> bytes:  # a file replaced is read anew
        with store.source(name) as source:
            return source_reader(source)(file, offset, n)

    return read, lambda file: store.rewriter(name, file)


def _none(name: str, offset: int, n: int) -> bytes:
    raise FileNotFoundError(name)  # (only a node's leader reads)


def _nowhere(name: str) -> IO[bytes]:
    raise RuntimeError(f"{name}: only a node's leader writes")


__all__: List[str] = ["rebuild"]
