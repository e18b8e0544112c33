"""A dtype cast on real ranks, run under ``mpiexec -n 2`` by tests/test_cast_distributed.py.

usage: cast_worker.py DIR
Each rank saves its rows of a float32 array (sharded) and a replicated float32 bias, then
loads columns of the array and the bias into bfloat16 destinations with ``cast=``; it
prints ``RESULT <json>`` with the bytes it loaded (hex) for the test to compare with a
single-process cast.
"""
import json
import sys

import ml_dtypes
import numpy as np

import uckpt
from uckpt.comm import get_communicator

SHAPE = (12, 10)
BF16 = np.dtype(ml_dtypes.bfloat16)


def full():
    return np.random.default_rng(5).standard_normal(SHAPE).astype(np.float32) * 1000


def main(directory):
    from mpi4py import MPI  # noqa: F401  (detection: mpi4py imported -> MPI)

    c = get_communicator(None, timeout=60)
    n, r = c.size, c.rank
    rows = slice(r * SHAPE[0] // n, (r + 1) * SHAPE[0] // n)
    bias = np.linspace(-3, 3, 7, dtype=np.float32) / 7
    uckpt.save(directory, {"w": uckpt.Shard(full()[rows].copy(), SHAPE, (rows.start, 0)),
                           "b": bias}, comm=c)
    cols = slice(r * SHAPE[1] // n, (r + 1) * SHAPE[1] // n)
    w = np.zeros((SHAPE[0], cols.stop - cols.start), BF16)
    b = np.zeros(7, BF16)
    refused = None
    try:  # without cast=: refused on every rank, naming the leaf and both dtypes
        uckpt.load(directory, {"w": uckpt.Shard(w, SHAPE, (0, cols.start)), "b": b}, comm=c)
    except uckpt.errors.UckptError as e:
        refused = str(e)
    uckpt.load(directory, {"w": uckpt.Shard(w, SHAPE, (0, cols.start)), "b": b}, comm=c,
               cast={"*": "bfloat16"})
    print("\nRESULT " + json.dumps({"rank": r, "cols": [cols.start, cols.stop],
                                    "w": w.tobytes().hex(), "b": b.tobytes().hex(),
                                    "refused": refused}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
