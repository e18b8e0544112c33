"""The save of a node-local level with redundancy across nodes (docs/levels.md): after
every rank wrote its data file into its node's copy of the checkpoint and before any
node commits, :class:`Protector` makes every node's piece over the save's communicator
(:func:`~uckpt.levels.exchange.protect_across`, so in the background of an async save)
and returns the records (docs/format.md 13.3) that go into the root manifest every
node commits: a committed copy vouches that every node held its share and piece."""
from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..comm.base import Communicator
from ..errors import RedundancyConfigError
from ..runtime.nodes import Nodes
from .exchange import protect_across
from .records import NAME
from .scheme import Redundancy
from .share_io import Reader

log = logging.getLogger("uckpt.levels.save_level")


def source_reader(source: Any) -> Reader:
    """A :data:`~uckpt.levels.share_io.Reader` of the files of a
    :class:`~uckpt.storage.base.CheckpointSource` (missing: ``FileNotFoundError``)."""

    def read(name: str, offset: int, n: int) -> bytes:
        buf = bytearray(n)
        got = source.read_into(name, buf, offset) if n else 0
        return bytes(memoryview(buf)[:got])  # (one copy; buf[:got] would make two)

    return read


def shares(nodes: Nodes, files: Dict[str, Any]) -> List[List[str]]:
    """Each node's share: the data files of its ranks, by rank (``files``: name -> an
    entry with ``rank``, as a manifest's ``files``)."""
    by_rank: Dict[int, List[str]] = {}
    for name, entry in sorted(files.items(), key=lambda kv: (kv[1].rank, kv[0])):
        by_rank.setdefault(entry.rank, []).append(name)
    return [[f for r in ranks for f in by_rank.get(r, [])] for ranks in nodes.ranks().values()]


class Protector:
    """The ``protect`` hook of a save to a tier with ``scheme`` (see
    :class:`~uckpt.saving.collective.PreparedSave`): every node's piece, made over the
    save's communicator; the extension's members for the root manifest."""

    def __init__(self, scheme: Redundancy, nodes: Nodes, tier: str) -> None:
        self.scheme, self.nodes, self.tier = scheme, nodes, tier
        self._told = False

    def __call__(self, sink: Any, manifest: Callable[[], Any], comm: Communicator,
                 replicas: Optional[Sequence[str]]
                 ) -> Optional[Dict[str, Tuple[bool, Dict[str, Any]]]]:
        """``replicas``: the copy each rank wrote into, where there are several."""
        if replicas is None:
            if not self._told and comm.rank == 0:
                self._told = True
                log.info("tier %r has redundancy=%r, but every node sees one copy of it (a "
                         "shared directory): it is saved without redundancy across nodes",
                         self.tier, str(self.scheme))
            return None
        copies = _groups(replicas)
        if copies != [list(r) for r in self.nodes.ranks().values()]:
            raise RedundancyConfigError(
                f"tier {self.tier!r}: the ranks share copies of the tier as {copies}, but "
                f"their nodes as {[list(r) for r in self.nodes.ranks().values()]}",
                hint="give each node a root of its own ({node} in the tier's path) and "
                     "every rank of one node the same UCKPT_NODE")
        leader = comm.rank in self.nodes.leaders
        files: Sequence[str] = shares(self.nodes, manifest().files)[self.nodes.index] \
            if leader else ()
        source = sink.written(None)
        records = protect_across(comm, self.nodes.of_rank, self.scheme, files,
                                 source_reader(source), sink.open_writer)
        return {NAME: (False, records.members())}


def _groups(replicas: Sequence[str]) -> List[List[int]]:
    """The ranks of each replica, ordered by their lowest rank."""
    out: Dict[str, List[int]] = {}
    for r, rep in enumerate(replicas):
        out.setdefault(rep, []).append(r)
    return list(out.values())
