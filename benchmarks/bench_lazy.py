"""Partial reads: ``uckpt.open`` + one array, a 100-row slice of it, ``uckpt.load(...,
select=...)`` and a full ``uckpt.load`` of a checkpoint of N float32 arrays of 128 MiB,
page cache warm; bytes read counted by a POSIX blob store whose reads all go through
``read_into`` (as ``tests/test_lazy_open.py`` counts them).

    .venv/bin/python benchmarks/bench_lazy.py                 # 8 arrays (1 GiB), best of 3
    .venv/bin/python benchmarks/bench_lazy.py --arrays 16 --runs 5

The uckpt measured is the one on ``PYTHONPATH`` if any, else this checkout's.
"""
from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

try:  # the uckpt on PYTHONPATH (to measure another tree), else this checkout's
    import uckpt
except ImportError:
    sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "src")]
    import uckpt
from uckpt.storage.blob.base import BlobReader
from uckpt.storage.blob.posix import PosixStore
from uckpt.storage.checkpoint import BlobCheckpointStore


class CountingStore(PosixStore):
    """The POSIX blob store, counting the bytes read (every range through read_into)."""

    def __init__(self, root):
        super().__init__(root)
        self.read = collections.Counter()

    def read_into(self, key, offset, buf):
        n = super().read_into(key, offset, buf)
        self.read[key] += n
        return n

    def open_reader(self, key):
        return BlobReader(self, key)

    open_medium_reader = open_reader


def bytes_read(root: Path, read) -> int:
    blob = CountingStore(root)
    with uckpt.open(BlobCheckpointStore(blob, "", str(root)).source("ck")) as ck:
        read(ck)
    return sum(blob.read.values())


def best(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arrays", type=int, default=8, help="arrays of 128 MiB (default 8)")
    p.add_argument("--runs", type=int, default=3, help="runs of each read; the best is shown")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        uckpt.save(root / "ck", {f"layer{i}": np.full((1 << 15, 1 << 10), i, np.float32)
                                 for i in range(args.arrays)})
        key = f"layer{args.arrays // 2}"

        def one(ck):
            return ck[key]

        def rows(ck):
            return ck.slice(key)[1000:1100]

        def opened(read):
            def run():
                with uckpt.open(root / "ck") as ck:
                    read(ck)
            return run

        print(f"{args.arrays} arrays of 128 MiB; manifest "
              f"{(root / 'ck' / 'manifest.json').stat().st_size} bytes")
        for name, read in (("open + ck[key]", one), ("open + 100-row slice", rows)):
            print(f"{name}: {bytes_read(root, read)} bytes read, "
                  f"{best(opened(read), args.runs):.3f} s")
        selected = best(lambda: uckpt.load(root / "ck", select=key), args.runs)
        print(f"load select=key: {selected:.3f} s")
        print(f"load all: {best(lambda: uckpt.load(root / 'ck'), args.runs):.3f} s")


if __name__ == "__main__":
    main()
