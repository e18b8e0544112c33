"""uckpt.comm with Horovod (horovod.torch on MPI) on 4 real processes under mpiexec.

Horovod is built by scripts/install_horovod.sh, which scripts/setup.sh runs unless
UCKPT_NO_HOROVOD=1. These tests skip only when horovod is not installed at all; a
horovod that is installed but fails to import (e.g. built without torch) is an error.
"""
import sys
from pathlib import Path

import pytest

from multiproc import assert_rank_2_failure_reported, run_mpi
from uckpt.comm import get_communicator

hvd = pytest.importorskip(
    "horovod.torch", reason="horovod is not installed (bash scripts/install_horovod.sh; "
                            "scripts/setup.sh installs it unless UCKPT_NO_HOROVOD=1)")

WORKER = Path(__file__).with_name("horovod_worker.py")
N = 4
HAVE_MPIEXEC = Path(sys.executable).with_name("mpiexec").exists()


def test_get_communicator_before_hvd_init_is_a_clear_error():
    assert not hvd.is_initialized()  # nothing initializes Horovod in the pytest process
    with pytest.raises(ValueError, match=r"^horovod\.torch is not initialized: call hvd\.init\(\) first$"):
        get_communicator(hvd)


@pytest.mark.skipif(not HAVE_MPIEXEC, reason="no mpiexec next to the venv's python (pip install mpich)")
@pytest.mark.parametrize("order", ["hvd_first", "mpi4py_first"])
def test_horovod_communicator_on_4_ranks(order):
    r = run_mpi(N, WORKER, order, 30, timeout=180).check()
    assert sorted(r.results) == list(range(N)), r.stdout[-4000:]
    gathered = [{"rank": i, "s": "é" * i} for i in range(N)]
    for rank, res in r.results.items():
        assert res["before_init"] == "horovod.torch is not initialized: call hvd.init() first"
        assert res["cls"] == "MPICommunicator" and res["mpi_enabled"] is True
        assert res["size"] == N
        assert res["hvd"] == res["world"] == [rank, N]  # Horovod's world is MPI COMM_WORLD
        assert res["gathered"] == gathered
        assert res["b0"] == {"step": 7, "who": 0}
        assert res["b1"] == ["from", 1]
        # hvd.broadcast_parameters / broadcast_optimizer_state made every rank equal rank 0
        assert res["model"] == [r.results[0]["model"][0]] * N
        assert res["model"][0][1] == pytest.approx(0.1)
        assert res["allreduce"] == sum(range(N))
        assert_rank_2_failure_reported(res, rank, N)
