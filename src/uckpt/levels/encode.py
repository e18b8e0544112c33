"""Encode and rebuild, pure and streaming (docs/format.md 13.3): a node's piece from the
shares it protects, and a lost node's share from the others' shares and pieces, in
blocks of at most ``block`` bytes (a few blocks in memory, never a whole share)."""
from __future__ import annotations

from typing import Iterator, List, Mapping

import numpy as np

from .scheme import Redundancy, holder, segment_size, segments, sources
from .share_io import BLOCK, ShareView, spans


def _xor_into(acc: np.ndarray, data: bytes) -> None:
    np.bitwise_xor(acc, np.frombuffer(data, dtype=np.uint8), out=acc)


def piece_blocks(scheme: Redundancy, lengths: List[int], node: int,
                 shares: Mapping[int, ShareView], block: int = BLOCK) -> Iterator[bytes]:
    """The bytes of ``node``'s piece, in blocks, from the shares of the nodes it protects
    (``shares``: node -> its share; only those :func:`~uckpt.levels.scheme.sources` names
    are read). ``lengths``: every node's share length."""
    n = len(lengths)
    if scheme.kind == "partner":
        (src, _), = sources(scheme, n, node)
        for off, k in spans(lengths[src], block):
            yield shares[src].read(off, k)
        return
    s = segment_size(scheme, n, node, lengths)
    for off, k in spans(s, block):
        acc = np.zeros(k, dtype=np.uint8)
        for src, seg in sources(scheme, n, node):
            _xor_into(acc, shares[src].read(seg * s + off, k))
        yield acc.tobytes()


def share_blocks(scheme: Redundancy, lengths: List[int], lost: int,
                 shares: Mapping[int, ShareView], pieces: Mapping[int, ShareView],
                 block: int = BLOCK) -> Iterator[bytes]:
    """The bytes of node ``lost``'s share (``lengths[lost]`` of them), in blocks, rebuilt
    from the pieces that hold its segments (``pieces``: node -> its piece, as a view of one
    file) and, for xor, the other shares those pieces cover. Nothing is checked here:
    callers check what they read against its records first (:mod:`uckpt.levels.repair`)."""
    n, length = len(lengths), lengths[lost]
    if scheme.kind == "partner":
        piece = pieces[holder(scheme, n, lost, 0)]
        for off, k in spans(length, block):
            yield piece.read(off, k)
        return
    s = segment_size(scheme, n, lost, lengths)
    for seg in range(segments(scheme, n, lost)):
        j = holder(scheme, n, lost, seg)
        for off in range(0, s, block):
            k = min(block, s - off, length - seg * s - off)
            if k <= 0:
                return
            acc = np.frombuffer(pieces[j].read(off, k), dtype=np.uint8).copy()
            for src, src_seg in sources(scheme, n, j):
                if src != lost:
                    _xor_into(acc, shares[src].read(src_seg * s + off, k))
            yield acc.tobytes()
