"""Communicator.exchange and protect_across on real processes: mpiexec -n 4 and four
torch.distributed gloo ranks (tests/exchange_worker.py). Raw buffers of several MiB
travel unpickled; the pieces made across processes are the spec's, and a node whose
directory its leader wiped is rebuilt over the communicator bit for bit."""
import hashlib
import json

import pytest

from multiproc import HAVE_MPI, HAVE_TORCH, run_mpi, run_torch
from redundancy_common import make_nodes, spec_pieces
from test_redundancy_exchange import payload
from uckpt.levels.exchange import node_map
from uckpt.levels.records import parse_records

WORKER = __import__("pathlib").Path(__file__).with_name("exchange_worker.py")
CASES = ["xor:3=a,a,b,c", "partner=n0,n1,n2,n3", "xor:4=n0,n1,n2,n3"]
SIZES = [[2000, 77], [70001], [0, 5]]


def digest(data):
    return hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("backend", [
    pytest.param("mpi", marks=pytest.mark.skipif(not HAVE_MPI, reason="mpi4py/mpiexec missing")),
    pytest.param("torch", marks=pytest.mark.skipif(not HAVE_TORCH, reason="torch missing"))])
def test_exchange_and_protect_across_processes(tmp_path, backend):
    layouts = []
    for i, case in enumerate(CASES):
        names, ranks = node_map(case.partition("=")[2].split(","))
        base = tmp_path / str(i)
        base.mkdir()
        dirs, shares = make_nodes(base, (SIZES + [[3], [40000]])[:len(names)], seed=i)
        for d, name, (_, _, files) in zip(dirs, names, shares):
            (d / "files.json").write_text(json.dumps(files))
            d.rename(base / name)
        dirs = [base / name for name in names]
        layouts.append((dirs, [s[2] for s in shares],
                        [{p.name: p.read_bytes() for p in d.iterdir() if p.name != "files.json"}
                         for d in dirs]))
    run = (run_mpi if backend == "mpi" else run_torch)(4, WORKER, backend, tmp_path, *CASES,
                                                       timeout=120).check()
    assert sorted(run.results) == [0, 1, 2, 3]
    for r, res in run.results.items():
        assert res["ring"] == {str((r - 1) % 4): digest(payload((r - 1) % 4, 0, (3 << 20) +
                                                                (r - 1) % 4))}
        assert res["every"] == {str(s): digest(payload(s, r, 10 * r)) for s in range(4)}
        assert res["pair"] == ([digest(payload(4 - r, k, 5 + k)) for k in range(2)]
                               if r in (1, 3) else [])
        assert res["cases"] == run.results[0]["cases"]
        if r == 0:
            name, missing, msg = res["missing"]
            assert (name, missing) == ("CollectiveTimeoutError", [3]), msg
            assert "collective 'exchange' timed out after 2 s: rank(s) 3 did not answer" in msg
    for case, (members, shares, pieces), (dirs, files, before) in zip(
            CASES, run.results[0]["cases"], layouts):
        assert (shares, pieces) == ([1], [1]), case  # node 1, wiped, rebuilt over the comm
        records = parse_records({"extensions": {"redundancy": {"required": False}}, "step": 3,
                                 **members})
        kind, g = records.scheme.kind, records.scheme.group
        assert [{p.name: p.read_bytes() for p in d.iterdir() if p.name.startswith("data")}
                for d in dirs] == before, case
        whole = [b"".join((d / f).read_bytes() for f in fs) for d, fs in zip(dirs, files)]
        assert [(d / n.piece.name).read_bytes() for d, n in zip(dirs, records.nodes)] == \
            spec_pieces(kind, g, whole), case
