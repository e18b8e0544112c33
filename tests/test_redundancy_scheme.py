"""A tier's ``redundancy=`` (issue 28 item 2): parsed and checked at construction, and
where each node's redundancy is kept (docs/format.md 13.3)."""
import pytest

import uckpt
from uckpt.errors import RedundancyConfigError
from uckpt.levels.scheme import (Redundancy, holder, parse_redundancy, piece_size, sources,
                                 xor_groups)


def test_spellings(tmp_path):
    assert uckpt.Tier(tmp_path).redundancy is None
    assert uckpt.Tier(tmp_path, redundancy="partner").redundancy_scheme == Redundancy("partner")
    tier = uckpt.Tier(tmp_path, redundancy="xor:4")
    assert (tier.redundancy, tier.redundancy_scheme) == ("xor:4", Redundancy("xor", 4))


@pytest.mark.parametrize("spec, words", [
    ("xor:1", "at least 2 nodes, got 1"), ("xor:0", "at least 2 nodes, got 0"),
    ("xor", "is not a redundancy scheme"), ("xor:-2", "is not a redundancy scheme"),
    ("Partner", "is not a redundancy scheme"), ("", "is not a redundancy scheme"),
    ("rs:4+2", "Reed-Solomon codes are not built"), ("rs:x", "Reed-Solomon codes are not built"),
    (2, "takes a string, got int"),
])
def test_bad_spellings_refused_at_construction(tmp_path, spec, words):
    with pytest.raises(RedundancyConfigError, match=words) as e:
        uckpt.Tier(tmp_path, redundancy=spec)
    assert isinstance(e.value, ValueError) and '"xor:' in e.value.hint


def test_xor_groups_and_remainders():
    assert xor_groups(8, 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert xor_groups(6, 4) == [[0, 1, 2, 3], [4, 5]]          # a remainder of 2: its own group
    assert xor_groups(5, 4) == [[0, 1, 2, 3, 4]]               # a remainder of 1 joins the last
    assert xor_groups(3, 4) == [[0, 1, 2]]                     # fewer nodes than G: one group
    with pytest.raises(RedundancyConfigError, match="has 1 node"):
        xor_groups(1, 4)
    with pytest.raises(RedundancyConfigError, match="has 1 node"):
        sources(Redundancy("partner"), 1, 0)


@pytest.mark.parametrize("nodes, g", [(2, 2), (4, 4), (5, 4), (6, 4), (7, 3)])
def test_every_segment_in_exactly_one_piece(nodes, g):
    """SCR's rotation: each segment of each share goes into exactly one other node's
    piece, and :func:`holder` names that node."""
    scheme = Redundancy("xor", g)
    seen = {}
    for j in range(nodes):
        for src, seg in sources(scheme, nodes, j):
            assert src != j and (src, seg) not in seen
            seen[src, seg] = j
    for group in xor_groups(nodes, g):
        for n in group:
            assert {seg for (src, seg) in seen if src == n} == set(range(len(group) - 1))
    assert all(holder(scheme, nodes, n, seg) == j for (n, seg), j in seen.items())


def test_partner_ring_and_piece_sizes():
    scheme = parse_redundancy("partner")
    assert [sources(scheme, 3, j) for j in range(3)] == [[(2, 0)], [(0, 0)], [(1, 0)]]
    assert [holder(scheme, 3, n, 0) for n in range(3)] == [1, 2, 0]
    assert [piece_size(scheme, 3, j, [10, 20, 30]) for j in range(3)] == [30, 10, 20]
    xor = parse_redundancy("xor:3")
    assert [piece_size(xor, 3, j, [10, 21, 3]) for j in range(3)] == [11, 11, 11]
