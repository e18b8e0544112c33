"""Incremental saves by 4 MPI ranks, restored by 2 (real processes, hard timeouts)."""
from pathlib import Path

import pytest

import uckpt
from multiproc import HAVE_MPI, run_mpi

WORKER = Path(__file__).with_name("incremental_worker.py")


@pytest.mark.skipif(not HAVE_MPI, reason="mpi4py/mpiexec missing")
def test_four_ranks_save_incrementally_and_two_restore(tmp_path):
    r = run_mpi(4, WORKER, "save", tmp_path, timeout=180).check()
    assert all(res["steps"] == [1, 2, 3, 4] for res in r.results.values())
    full, inc = (uckpt.manifest(tmp_path / f"step_{s:08d}") for s in (1, 2))
    assert full.world_size == inc.world_size == 4 and not full.bases
    assert list(inc.bases) == ["step_00000001"]
    written = sum(f.size for f in inc.files.values())
    assert written < sum(f.size for f in full.files.values()) / 10  # a few chunks only
    sharded = inc.arrays["sharded"].chunks
    assert sum(c.base is None for c in sharded) == 1  # the one rank's chunk that changed
    for s in range(1, 5):
        uckpt.verify(tmp_path / f"step_{s:08d}")
    r = run_mpi(2, WORKER, "load", tmp_path, timeout=180).check()
    assert all(res["step"] == 4 and res["sharded"] for res in r.results.values()), r.results
