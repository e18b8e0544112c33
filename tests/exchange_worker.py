"""Run under mpiexec -n 4 or as 4 torch.distributed gloo ranks by
tests/test_exchange_multiproc.py: Communicator.exchange, then on simulated nodes
protect_across, node 1's directory wiped by its leader, and repair_across.

usage: exchange_worker.py {mpi,torch} ROOT CASE...   (CASE: SCHEME=NODE,NODE,NODE,NODE;
the test laid out ROOT/<i>/<node>/ with each node's share files, listed in files.json)
Prints one ``RESULT <json>`` line per rank.
"""
import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np


def payload(src, dst, n):
    return (np.arange(n, dtype=np.uint32) * 7 + src * 31 + dst).astype(np.uint8).tobytes()


def digest(data):
    return hashlib.sha256(bytes(data)).hexdigest()


def main():
    backend, root, cases = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    if backend == "torch":
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method="env://")
    else:
        from mpi4py import MPI  # noqa: F401  (detection: mpi4py imported -> MPI)
    from uckpt.comm import get_communicator
    from uckpt.levels.exchange import node_map, protect_across
    from uckpt.levels.rebuild_across import repair_across
    from uckpt.levels.scheme import parse_redundancy
    from uckpt.levels.share_io import directory_reader

    c = get_communicator(None, timeout=60)
    r, n = c.rank, c.size
    ring = c.exchange({(r + 1) % n: payload(r, 0, (3 << 20) + r)}, [(r - 1) % n])
    every = c.exchange({d: payload(r, d, 10 * d) for d in range(n)}, range(n))
    pair = []
    if r in (1, 3):
        for k in range(2):
            pair.append(digest(c.exchange({4 - r: payload(r, k, 5 + k)}, [4 - r])[4 - r]))
    c.barrier()
    out = {"rank": r, "ring": {str(s): digest(b) for s, b in ring.items()},
           "every": {str(s): digest(b) for s, b in every.items()}, "pair": pair, "cases": []}
    for i, case in enumerate(cases):
        spec, _, layout = case.partition("=")
        nodes = layout.split(",")
        names, ranks = node_map(nodes)
        node = names.index(nodes[r])
        d = root / str(i) / nodes[r]
        files = json.loads((d / "files.json").read_text()) if ranks[node][0] == r else ()
        records = protect_across(c, nodes, parse_redundancy(spec), files, directory_reader(d),
                                 lambda name, d=d: open(d / name, "wb"), step=3, block=1 << 16)
        if r == ranks[1][0]:  # node 1 is lost: its leader wipes its node-local directory
            for p in d.iterdir():
                if p.name != "files.json":
                    p.unlink()
        c.barrier()
        done = repair_across(c, nodes, records, directory_reader(d),
                             lambda name, d=d: open(d / name, "wb"), block=1 << 16)
        out["cases"].append([records.members(), sorted(done.shares), sorted(done.pieces)])
    # a source that never sends: the receiver's exchange times out naming it
    if backend == "torch":
        from uckpt.comm.torch import TorchCommunicator
        short = TorchCommunicator(dist.new_group(backend="gloo"), timeout=2)  # (gloo closes
        # a pair whose receive timed out: a group of its own keeps the default one whole)
    else:
        from uckpt.comm.mpi import MPICommunicator
        short = MPICommunicator(None, timeout=2)
    if r == 0:
        try:
            short.exchange({}, [3])
        except Exception as e:  # noqa: BLE001 - reported to the test
            out["missing"] = [type(e).__name__, getattr(e, "missing", None), str(e)]
    c.barrier()
    print("\nRESULT " + json.dumps(out), flush=True)
    sys.stdout.flush()
    os._exit(0)  # the short communicator is broken (a receive left posted): no teardown


if __name__ == "__main__":
    main()
