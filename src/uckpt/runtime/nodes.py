"""Which ranks share a node: each rank's node name, all-gathered once.

A rank's node name is, in order: the name given (``CheckpointManager(node=...)``), the
environment variable ``UCKPT_NODE``, the host name. Setting ``UCKPT_NODE`` per rank lets
tests on one machine simulate several nodes.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from ..errors import OptionsError

#: the variable that names this process's node (else the host name)
ENV = "UCKPT_NODE"
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,254}$")


def node_name(given: Optional[str] = None) -> str:
    """This process's node name: ``given``, else ``$UCKPT_NODE``, else the host name;
    OptionsError where it is not one path component (letters, digits, ``_ - .``)."""
    import socket  # here, on first use: it imports selectors

    name, source = ((given, "node=") if given is not None
                    else (os.environ[ENV], ENV) if os.environ.get(ENV)
                    else (socket.gethostname(), "the host name"))
    if not isinstance(name, str) or not _NAME.match(name):
        raise OptionsError(f"the node name {name!r} (from {source}) is not usable in a path",
                           hint=f"set {ENV} (or node=) to letters, digits, '_', '-' and "
                                "'.' (not first), e.g. node0")
    return name


@dataclass(frozen=True)
class Nodes:
    """The node of every rank (``of_rank``, indexed by rank) as seen from ``rank``.
    Nodes are ordered by their lowest rank."""

    of_rank: Tuple[str, ...]
    rank: int = 0

    @classmethod
    def gather(cls, comm: Any, name: str) -> "Nodes":
        """Collective over ``comm`` (one all-gather of ``name``; none for one rank)."""
        names = comm.all_gather(name) if comm.size > 1 else [name]
        return cls(tuple(names), comm.rank)

    @property
    def name(self) -> str:
        """This rank's node."""
        return self.of_rank[self.rank]

    @property
    def order(self) -> Tuple[str, ...]:
        """The nodes, by their lowest rank."""
        return tuple(dict.fromkeys(self.of_rank))

    @property
    def index(self) -> int:
        """This rank's node's place in :attr:`order`."""
        return self.order.index(self.name)

    def ranks(self) -> Dict[str, Tuple[int, ...]]:
        """The ranks of each node, in :attr:`order`."""
        out: Dict[str, Tuple[int, ...]] = {n: () for n in self.order}
        for r, n in enumerate(self.of_rank):
            out[n] += (r,)
        return out

    @property
    def leaders(self) -> Tuple[int, ...]:
        """The lowest rank of each node, in :attr:`order`."""
        return tuple(ranks[0] for ranks in self.ranks().values())
