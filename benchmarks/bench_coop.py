"""Reads shared across ranks: 4 MPI ranks load one replicated state, cooperative off, per
node and per job, in one run.

    python benchmarks/bench_coop.py                    # 400 MB, 3 rounds of each mode
    python benchmarks/bench_coop.py --mb 40 --repeat 1

One ``mpiexec -n 4`` launch (``--worker``): the ranks save a replicated state of ``--mb``
MB (8 float32 arrays; written once in all, a share by each rank), then load it into arrays
they hold, ``--repeat`` times in each mode (``cooperative=False``, ``"node"``, ``"job"``;
the four ranks are one node), each load timed from a barrier to the slowest rank's end.
Reported per mode: the median seconds, the bytes read from storage by all ranks
(``LoadReport.bytes_read``) and received from other ranks. Every load is checked bit for
bit (SHA-256 of every rank's arrays against the saved state's); a mismatch fails the run.
The loads read from the page cache (the state was just written). ``--damage`` (the test's
case, tests/test_cooperative_mpi.py) then flips one byte of a data file and loads again:
every rank must raise DistributedError from a ChecksumMismatchError.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODES = {"off": False, "node": "node", "job": "job"}
ARRAYS = 8


def digest(state: dict) -> str:
    h = hashlib.sha256()
    for name in sorted(state):
        h.update(state[name].tobytes())
    return h.hexdigest()


def worker(root: Path, mb: int, repeat: int, damage: bool) -> None:
    import numpy as np
    from mpi4py import MPI  # noqa: F401  (detection: mpi4py imported -> MPI)

    import uckpt
    from uckpt.comm import get_communicator
    from uckpt.errors import ChecksumMismatchError, DistributedError

    comm = get_communicator(None, timeout=300)
    rows = mb * (1 << 20) // (ARRAYS * 4 * 1024)
    rng = np.random.default_rng(0)  # the same state on every rank: replicated
    state = {f"layer{i}": rng.standard_normal((rows, 1024), dtype=np.float32)
             for i in range(ARRAYS)}
    uckpt.save(root / "c", state, comm=comm)
    want = digest(state)
    dst = {k: np.empty_like(v) for k, v in state.items()}
    del state
    out: dict = {"rank": comm.rank, "modes": {}}
    for mode, value in MODES.items():
        runs = []
        for _ in range(repeat):
            for v in dst.values():
                v.fill(0)
            report = uckpt.LoadReport()
            comm.barrier()
            start = time.perf_counter()
            uckpt.load(root / "c", dst, comm=comm, cooperative=value, report=report)
            seconds = max(comm.all_gather(time.perf_counter() - start))
            if digest(dst) != want:
                raise SystemExit(f"rank {comm.rank}: the {mode} load is not bit for bit")
            runs.append([seconds, report.bytes_read, report.bytes_received])
        out["modes"][mode] = runs
    if damage:
        comm.barrier()
        if comm.rank == 0:
            data = root / "c" / "data-00001.bin"
            raw = bytearray(data.read_bytes())
            raw[len(raw) // 2] ^= 0x08
            data.write_bytes(bytes(raw))
        comm.barrier()
        try:
            uckpt.load(root / "c", dst, comm=comm, cooperative="node")
            out["damaged"] = {"raised": None}
        except DistributedError as e:
            out["damaged"] = {"raised": type(e).__name__, "msg": str(e),
                              "checksum": e.failed_with(ChecksumMismatchError)}
    out["data_bytes"] = sum(c.length for e in uckpt.manifest(root / "c").arrays.values()
                            for c in e.chunks)
    print("RESULT " + json.dumps(out), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mb", type=int, default=400, help="size of the replicated state")
    p.add_argument("--repeat", type=int, default=3, help="loads per mode")
    p.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--damage", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        worker(a.worker, a.mb, a.repeat, a.damage)
        return
    mpiexec = Path(sys.executable).with_name("mpiexec")
    with tempfile.TemporaryDirectory(prefix="bench-coop-") as root:
        load_before = os.getloadavg()
        cmd = [str(mpiexec), "-n", "4", sys.executable, __file__, "--worker", root,
               "--mb", str(a.mb), "--repeat", str(a.repeat)]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        load_after = os.getloadavg()
    if run.returncode != 0:
        raise SystemExit(f"the ranks failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
    results = [json.loads(piece.splitlines()[0]) for piece in run.stdout.split("RESULT ")[1:]]
    total = results[0]["data_bytes"]
    print(f"4 ranks, replicated state of {total / 1e6:.0f} MB, {a.repeat} load(s) per mode; "
          f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after")
    print(f"{'cooperative':>11} {'median s':>9} {'read MB (all ranks)':>20} {'x state':>8} "
          f"{'received MB':>12}")
    for mode in MODES:
        seconds = statistics.median(r[0] for r in results[0]["modes"][mode])
        read = sum(res["modes"][mode][-1][1] for res in results)
        got = sum(res["modes"][mode][-1][2] for res in results)
        print(f"{mode:>11} {seconds:>9.3f} {read / 1e6:>20.1f} {read / total:>8.2f} "
              f"{got / 1e6:>12.1f}")


if __name__ == "__main__":
    main()
