"""Redundancy across nodes: a tier's ``redundancy=`` spelling, and where each node's
redundancy is kept (docs/format.md section 13.3; docs/levels.md).

Nodes are numbered ``0 .. n-1`` (the order of their lowest ranks). Each node holds one
*piece* of redundancy:

* ``partner``: node ``j`` holds a copy of the share of node ``j - 1`` (mod ``n``);
* ``xor:G``: the nodes form groups of ``G`` consecutive nodes (a remainder of at least
  two nodes is a smaller last group, a remainder of one joins the last group); within a
  group of ``g`` members, each member's share is cut into ``g - 1`` segments of ``s``
  bytes (``s = ceil(longest share / (g - 1))``, zero-padded) and the member at position
  ``p`` holds the XOR of segment ``(p - q - 1) mod g`` of every other member ``q``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Optional, Tuple, Union

from ..errors import RedundancyConfigError

_XOR = re.compile(r"xor:([0-9]{1,4})")
_RS = re.compile(r"rs:([0-9]{1,4})\+([0-9]{1,4})")
_HINT = 'use redundancy="partner", redundancy="xor:G" with G >= 2 nodes per group, or None'


@dataclass(frozen=True)
class Redundancy:
    """A parsed redundancy scheme: ``kind`` ``"partner"`` or ``"xor"``; ``group`` the
    nodes per XOR group (2 for partner)."""

    kind: str
    group: int = 2

    def __str__(self) -> str:
        return "partner" if self.kind == "partner" else f"xor:{self.group}"


def parse_redundancy(spec: Union[None, str, Redundancy]) -> Optional[Redundancy]:
    """The scheme a tier's ``redundancy=`` names; None for none. Raises
    :class:`~uckpt.errors.RedundancyConfigError` for anything else."""
    if spec is None or isinstance(spec, Redundancy):
        return spec
    if not isinstance(spec, str):
        raise RedundancyConfigError(
            f"redundancy= takes a string, got {type(spec).__name__} {spec!r}", hint=_HINT)
    if spec == "partner":
        return Redundancy("partner")
    m = _XOR.fullmatch(spec)
    if m:
        g = int(m.group(1))
        if g < 2:
            raise RedundancyConfigError(
                f"redundancy={spec!r}: an XOR group needs at least 2 nodes, got {g}",
                hint=_HINT)
        return Redundancy("xor", g)
    if _RS.fullmatch(spec) or spec.startswith("rs:"):
        raise RedundancyConfigError(
            f"redundancy={spec!r}: Reed-Solomon codes are not built into this uckpt "
            "(docs/architecture.md says why)",
            hint='"xor:G" survives one lost node per group of G; "partner" one lost node '
                 'of each pair of neighbours')
    raise RedundancyConfigError(f"redundancy={spec!r} is not a redundancy scheme", hint=_HINT)


def xor_groups(nodes: int, group: int) -> List[List[int]]:
    """The XOR groups of ``nodes`` nodes for groups of ``group``: consecutive node
    numbers; a remainder of one node joins the last group."""
    _at_least_two(nodes, f"xor:{group}")
    out = [list(range(i, min(i + group, nodes))) for i in range(0, nodes, group)]
    if len(out) > 1 and len(out[-1]) == 1:
        out[-2].extend(out.pop())
    return out


def _at_least_two(nodes: int, scheme: str) -> None:
    if nodes < 2:
        raise RedundancyConfigError(
            f"redundancy={scheme!r} keeps each node's redundancy on other nodes, but the job "
            f"has {nodes} node(s)",
            hint="run on at least 2 nodes (UCKPT_NODE names a rank's node), or give this "
                 "tier no redundancy")


def group_of(scheme: Redundancy, nodes: int, node: int) -> List[int]:
    """The nodes whose pieces and shares depend on each other with ``node``'s: its XOR
    group; for partner, all nodes (a ring)."""
    if scheme.kind == "partner":
        _at_least_two(nodes, str(scheme))
        return list(range(nodes))
    return next(g for g in xor_groups(nodes, scheme.group) if node in g)


def sources(scheme: Redundancy, nodes: int, node: int) -> List[Tuple[int, int]]:
    """What ``node``'s piece is made of: ``(source node, segment index)`` pairs, in the
    order of docs/format.md 13.3 (partner: one pair, segment 0 standing for the whole
    share; xor: the other members of the group by position)."""
    if scheme.kind == "partner":
        _at_least_two(nodes, str(scheme))
        return [((node - 1) % nodes, 0)]
    members = group_of(scheme, nodes, node)
    g, p = len(members), members.index(node)
    return [(m, (p - q - 1) % g) for q, m in enumerate(members) if q != p]


def holder(scheme: Redundancy, nodes: int, node: int, segment: int) -> int:
    """The node whose piece holds ``segment`` of ``node``'s share (partner: segment 0)."""
    if scheme.kind == "partner":
        _at_least_two(nodes, str(scheme))
        return (node + 1) % nodes
    members = group_of(scheme, nodes, node)
    return members[(members.index(node) + segment + 1) % len(members)]


def segments(scheme: Redundancy, nodes: int, node: int) -> int:
    """How many segments ``node``'s share is cut into (partner: 1, the whole share)."""
    return 1 if scheme.kind == "partner" else len(group_of(scheme, nodes, node)) - 1


def segment_size(scheme: Redundancy, nodes: int, node: int, lengths: List[int]) -> int:
    """The bytes per segment of ``node``'s group, given every node's share length
    (partner: the node's own length)."""
    if scheme.kind == "partner":
        return lengths[node]
    members = group_of(scheme, nodes, node)
    longest = max(lengths[m] for m in members)
    return -(-longest // (len(members) - 1))


def piece_size(scheme: Redundancy, nodes: int, node: int, lengths: List[int]) -> int:
    """The size of ``node``'s piece: partner, its left neighbour's share; xor, a segment."""
    if scheme.kind == "partner":
        return lengths[(node - 1) % nodes]
    return segment_size(scheme, nodes, node, lengths)
