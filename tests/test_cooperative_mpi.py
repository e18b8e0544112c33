"""Reads shared across ranks on real processes: ``mpiexec -n 4`` runs
benchmarks/bench_coop.py's worker, which saves a replicated state, loads it with
cooperative reads off, per node and per job (checking every rank's arrays bit for bit
against the saved state: the worker exits non-zero otherwise), then damages one byte of a
data file and loads again.

The smaller case is 40 MB, one launch; the other is issue 29's acceptance case (400 MB:
about 400 MB read in all with cooperative reads, 1.6 GB without). Both are listed slow.
"""
from pathlib import Path

import pytest

from multiproc import HAVE_MPI, run_mpi

pytestmark = [pytest.mark.xdist_group("distributed"),
              pytest.mark.skipif(not HAVE_MPI, reason="mpi4py/mpiexec missing")]

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_coop.py"


def launch(root, mb, damage):
    args = ["--worker", root, "--mb", mb, "--repeat", 1] + (["--damage"] if damage else [])
    r = run_mpi(4, SCRIPT, *args, timeout=600).check()
    assert sorted(r.results) == [0, 1, 2, 3]
    return r.results


def check_bytes(results, total):
    """Bytes read from storage by the 4 ranks: the state once with cooperative reads
    (plus at most the manifest parts), four times without."""
    for mode, times in (("node", 1), ("job", 1), ("off", 4)):
        read = sum(res["modes"][mode][0][1] for res in results.values())
        got = sum(res["modes"][mode][0][2] for res in results.values())
        assert times * total <= read <= times * total * 1.01, (mode, read, total)
        assert got == (3 * total if times == 1 else 0), (mode, got, total)


def test_four_ranks_read_a_replicated_state_once_and_agree_on_damage(tmp_path):
    results = launch(tmp_path, 40, damage=True)
    total = results[0]["data_bytes"]
    assert total >= 40 << 20
    check_bytes(results, total)
    for res in results.values():
        damaged = res["damaged"]
        assert damaged["raised"] == "DistributedError" and damaged["checksum"], damaged
        assert "failed on 1 of 4 rank(s)" in damaged["msg"]
        assert "data-00001.bin" in damaged["msg"] and "checksum mismatch in leaf" in damaged["msg"]


def test_acceptance_400_mb(tmp_path):
    results = launch(tmp_path, 400, damage=False)
    check_bytes(results, results[0]["data_bytes"])
