"""``cast=`` on 2 real ranks (mpiexec -n 2): float32 rows saved sharded, loaded as
bfloat16 columns (and a replicated bias), bit for bit what a single process's cast
gives; refused on every rank without ``cast=``."""
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import uckpt
from multiproc import HAVE_MPI, run_mpi

WORKER = Path(__file__).with_name("cast_worker.py")
BF16 = np.dtype(ml_dtypes.bfloat16)
pytestmark = [pytest.mark.xdist_group("distributed"),
              pytest.mark.skipif(not HAVE_MPI, reason="mpi4py/mpiexec missing")]


def test_two_ranks_cast_sharded_float32_into_bfloat16_as_one_process_does(tmp_path):
    r = run_mpi(2, WORKER, tmp_path / "c", timeout=120).check()
    assert sorted(r.results) == [0, 1]
    one = uckpt.load(tmp_path / "c", cast={"*": "bfloat16"})  # a single process's cast
    assert one["w"].dtype == BF16 and one["w"].shape == (12, 10)
    for res in r.results.values():
        lo, hi = res["cols"]
        assert bytes.fromhex(res["w"]) == one["w"][:, lo:hi].tobytes()
        assert bytes.fromhex(res["b"]) == one["b"].tobytes()
        assert "the checkpoint holds float32, the destination is bfloat16" in res["refused"]
        assert "cast=" in res["refused"]
    assert not np.array_equal(one["w"].astype(np.float32),
                              uckpt.load(tmp_path / "c")["w"])  # (it did narrow)
