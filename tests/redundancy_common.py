"""Shares of simulated nodes in directories, and the spec's pieces computed whole (plain
NumPy, straight from docs/format.md 13.3) to check the streaming code against."""
from pathlib import Path

import numpy as np

from uckpt.levels.scheme import xor_groups
from uckpt.levels.share_io import directory_reader


def make_nodes(tmp_path: Path, sizes, seed=0):
    """One directory per node (``sizes[i]``: the sizes of node i's files), random bytes;
    returns (dirs, node shares for :func:`uckpt.levels.protect.protect`)."""
    rng = np.random.default_rng(seed)
    dirs, nodes, rank = [], [], 0
    for i, files in enumerate(sizes):
        d = tmp_path / f"node{i}"
        d.mkdir()
        names = []
        for size in files:
            name = f"data-{rank:05d}.bin"
            (d / name).write_bytes(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
            names.append(name)
            rank += 1
        dirs.append(d)
        nodes.append((f"n{i}", list(range(rank - len(files), rank)), names))
    return dirs, nodes


def readers(dirs):
    return [directory_reader(d) for d in dirs]


def opener(dirs):
    return lambda node, name: open(dirs[node] / name, "wb")


def spec_pieces(kind, g, shares):
    """Every node's piece from the whole shares (bytes), as the spec words it."""
    n = len(shares)
    if kind == "partner":
        return [shares[(j - 1) % n] for j in range(n)]
    out = [b""] * n
    for members in xor_groups(n, g):
        size = len(members)
        s = -(-max(len(shares[m]) for m in members) // (size - 1))
        padded = {m: np.frombuffer(shares[m].ljust((size - 1) * s, b"\0"), np.uint8)
                  for m in members}
        for p, j in enumerate(members):
            acc = np.zeros(s, np.uint8)
            for q, m in enumerate(members):
                if q != p:
                    k = (p - q - 1) % size
                    acc ^= padded[m][k * s:(k + 1) * s]
            out[j] = acc.tobytes()
    return out
