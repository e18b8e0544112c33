"""Loading on every rank at once: each rank reads what it needs, and a failure on one
rank is raised on all (``uckpt.load``, ``CheckpointManager.restore``)."""
from __future__ import annotations

import logging
from typing import Any, Dict, NamedTuple, Optional, Tuple

from ..comm import get_communicator
from ..errors import CorruptCheckpointError, DistributedError, ManifestError, MemoryLimitError
from ..runtime.gcpause import pausing
from ..runtime.nodes import node_name
from .cooperative import Cooperation, CooperativeReader, mode_of
from .peer_chunks import with_peer_chunks
from .reader import CheckpointReader
from .cast import Cast
from .report import LoadReport
from .restore import load_tree, restore_into
from .selection import Patterns


def load_from(open_, state, strict: bool, comm, what: str,
              max_bytes: Optional[int] = None, peers: bool = False, *, cast: Cast = None,
              report: Optional[LoadReport] = None,
              select: Optional[Patterns] = None, cooperative: Any = None,
              node: Optional[str] = None) -> Dict[str, Any]:
    """:func:`load` from the source ``open_()`` returns (opened by every rank itself, so
    that a failure to open is told to the other ranks). ``peers``: ``open_()`` is a
    node-local copy; the chunks a rank reads from files its node lacks are first fetched
    from ranks whose copies hold them (:mod:`uckpt.loading.peer_chunks`). ``cast``: the
    dtype policy (:mod:`uckpt.loading.cast`); ``report``: filled with the keys a
    ``strict=False`` load skipped on this rank and the bytes it read
    (:mod:`uckpt.loading.report`); ``select``: the leaves to load
    (:mod:`uckpt.loading.selection`), None: all. ``cooperative``: ``"auto"``, ``"node"``,
    ``"job"`` or False, None: ``knobs.cooperative_load``: chunks several ranks read are
    read once per node or job and sent to the others (:mod:`uckpt.loading.cooperative`);
    ``node``: this rank's node name (None: :func:`uckpt.runtime.nodes.node_name`)."""
    c = get_communicator(comm)
    load = Load(strict, cast, report, what, select)
    mode = mode_of(cooperative)  # (an OptionsError before any exchange, on every rank)
    if c.size == 1:
        return _load_local(open_, state, load, (0, 1), max_bytes)
    if peers:
        open_ = with_peer_chunks(open_, state, strict, c, what, cast, select)
    coop = None if mode is None else Cooperation(c, mode, node_name(node), what)
    out: Dict[str, Any] = {}

    def job() -> None:
        out["tree"] = _load_local(open_, state, load, (c.rank, c.size), max_bytes, coop)

    if coop is None:
        c.gather_outcomes(job, what)
    else:
        coop.run(job)
    return out["tree"]


log = logging.getLogger("uckpt.loading.collective")


def damage_behind(open_, comm, what: str) -> Optional[BaseException]:
    """Verify the checkpoint ``open_()`` opens on every rank (collective; streaming, in
    bounded memory): the UckptError of damage it finds (the first rank's), or None when
    it is intact. A refusal to parse its manifest for memory counts as damage."""
    def job() -> None:
        with CheckpointReader(open_()) as reader:
            reader.verify()

    try:
        get_communicator(comm).gather_outcomes(job, what)
    except (MemoryLimitError, CorruptCheckpointError, ManifestError) as e:
        return e
    except DistributedError as e:
        if not e.failed_with(MemoryLimitError, CorruptCheckpointError, ManifestError):
            raise
        return e
    return None


class Load(NamedTuple):
    """How a load treats what does not match: keys (``strict``, ``report``), dtypes
    (``cast``); and which leaves it loads (``select``, None: all)."""

    strict: bool
    cast: Cast
    report: Optional[LoadReport]
    what: str
    select: Optional[Patterns] = None


@pausing
def _load_local(open_, state, load: Load, rank: Tuple[int, int], max_bytes: Optional[int],
                coop: Optional[Cooperation] = None) -> Dict[str, Any]:
    """Load as ``rank`` = (rank, world size): the manifest's parts read on demand, only
    those that cover what this rank loads; with ``coop``, reads shared across ranks."""
    source = open_()
    with (CheckpointReader(source, max_bytes=max_bytes, rank=rank) if coop is None else
          CooperativeReader(coop, source, max_bytes=max_bytes, rank=rank)) as reader:
        report = load.report if load.report is not None else LoadReport()
        if state is None:
            tree = load_tree(reader, load.cast, load.select)
        else:
            tree = restore_into(reader, state, strict=load.strict, rank=rank[0],
                                cast=load.cast, report=report, select=load.select)
            report.log(load.what)
        report.bytes_read = reader.bytes_read
        report.bytes_received = getattr(reader, "received", 0)
        log.info("%s: rank %d of %d read %d bytes from storage%s", load.what, rank[0],
                 rank[1], report.bytes_read, f", received {report.bytes_received} from other "
                 "ranks" if coop is not None else "")
        return tree
