"""A compressed checkpoint written by 4 ranks (mpiexec -n 4) loads on 1, 2 and 3 ranks:
the same resharding as raw checkpoints (tests/test_distributed.py), each rank decoding
only the chunks its slices need. Every run has a hard timeout (tests/multiproc.py)."""
from pathlib import Path

import pytest

import uckpt
from uckpt.format import FORMAT_VERSION
from multiproc import HAVE_MPI, HAVE_TORCH, run_mpi, run_torch

WORKER = Path(__file__).with_name("dist_worker.py")
# one pytest-xdist worker runs the whole module: its module-scoped launch ran once per
# worker otherwise (see docs/testing.md)
pytestmark = [pytest.mark.xdist_group("compress_distributed"),
              pytest.mark.skipif(not HAVE_MPI, reason="mpi4py/mpiexec missing"),
              pytest.mark.skipif(not HAVE_TORCH, reason="torch missing")]


def run(backend, n, *args):
    launch = run_mpi if backend == "mpi" else run_torch
    return launch(n, WORKER, backend, *map(str, args), timeout=120)


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    directory = tmp_path_factory.mktemp("dist") / "by4"
    r = run("mpi", 4, "save", directory, "zstd").check()
    assert sorted(r.results) == [0, 1, 2, 3]
    return directory


def test_four_ranks_write_compressed_files(packed):
    m = uckpt.manifest(packed)
    assert m.world_size == 4 and m.format_version == FORMAT_VERSION
    assert sorted(m.files) == [f"data-{r:05d}.bin" for r in range(4)]
    codecs = {c.codec for a in m.arrays.values() for c in a.chunks}
    assert ("bytegroup", "zstd") in codecs
    # every file's size is what its compressed chunks take, and less than raw
    for name, f in m.files.items():
        ends = [c.offset + c.length for a in m.arrays.values() for c in a.chunks if c.file == name]
        assert f.size == max(ends, default=0) == (packed / name).stat().st_size
    assert sum(f.size for f in m.files.values()) < m.nbytes
    uckpt.verify(packed)


@pytest.mark.parametrize("loaders,backend,split", [(1, "mpi", "cols"), (2, "torch", "rows"),
                                                   (3, "mpi", "cols")])
def test_compressed_checkpoint_reshards(packed, loaders, backend, split):
    r = run(backend, loaders, "load", packed, split).check()
    assert sorted(r.results) == list(range(loaders))
    for res in r.results.values():
        assert res["model"] and res["optimizer"] and res["zero"], res
        assert res["step"] == 7


def test_compressed_durable_tier_by_four_ranks(tmp_path):
    """Async saves by 4 ranks to a raw fast tier, each rank compressing its own files while
    copying them to the durable tier; after the fast tier is lost, every rank restores
    from the compressed copy."""
    r = run("mpi", 4, "tiers", tmp_path, "zstd").check()
    assert sorted(r.results) == [0, 1, 2, 3]
    for rank, res in r.results.items():
        assert res["durable"] == [2, 3] and res["restored"] == 3 and res["step"] == 3, res
        assert res["model"] and res["zero"] and res["rank_state"] == 100 + rank, res
    m = uckpt.verify(tmp_path / "durable" / "step_00000003")
    assert m.world_size == 4 and len(m.files) == 4
    assert ("bytegroup", "zstd") in {c.codec for a in m.arrays.values() for c in a.chunks}
    for name, f in m.files.items():
        assert f.size == (tmp_path / "durable" / "step_00000003" / name).stat().st_size
