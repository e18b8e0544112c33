"""Horovod (PyTorch, hvd.DistributedOptimizer) under mpiexec -n 4: every rank saves its
part, and a resumed run continues bit for bit on every rank."""
import os
from pathlib import Path

import pytest

pytest.importorskip("horovod.torch", reason="Horovod is not installed: bash scripts/install_horovod.sh")

import uckpt  # noqa: E402
from multiproc import run_mpi  # noqa: E402

WORKER = Path(__file__).with_name("horovod_train.py")


def test_horovod_save_by_all_ranks_and_bitwise_resume(tmp_path):
    root = tmp_path / "ckpt"
    full = run_mpi(4, WORKER, "full", root, timeout=240).check()
    assert sorted(full.results) == [0, 1, 2, 3]
    m = uckpt.manifest(root / "step_00000005")
    assert m.world_size == 4
    sizes = [os.path.getsize(root / "step_00000005" / f) for f in sorted(m.files)]
    assert all(s > 0 for s in sizes), sizes  # every rank wrote a part, not rank 0 alone
    resumed = run_mpi(4, WORKER, "resume", root, timeout=240).check()
    for rank in range(4):
        a, b = full.results[rank], resumed.results[rank]
        assert a["params_equal"] and b["params_equal"]
        tail = {s: v for s, v in a["losses"].items() if int(s) > 5}
        assert len(tail) == 6 and b["losses"] == tail, (rank, a["losses"], b["losses"])
