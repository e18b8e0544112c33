"""uckpt.comm on real processes: mpiexec -n 4 and 4 torch.distributed gloo ranks."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from multiproc import HAVE_MPI, HAVE_TORCH, assert_rank_2_failure_reported, run_mpi, run_torch
from uckpt.comm import (CollectiveTimeoutError, Communicator, DistributedError, SingleProcess,
                        get_communicator)
from uckpt.errors import UckptError

WORKER = Path(__file__).with_name("comm_worker.py")
N = 4
RUNNERS = {"mpi": run_mpi, "torch": run_torch}

# find_spec, not import: an imported mpi4py would make get_communicator() pick MPI here.


BACKENDS = [pytest.param("mpi", marks=pytest.mark.skipif(not HAVE_MPI, reason="mpi4py/mpiexec missing")),
            pytest.param("torch", marks=pytest.mark.skipif(not HAVE_TORCH, reason="torch missing"))]


@pytest.mark.parametrize("backend", BACKENDS)
def test_collectives(backend):
    r = RUNNERS[backend](N, WORKER, backend, "basic", 20, timeout=60).check()
    assert sorted(r.results) == list(range(N))
    expected = [{"rank": i, "data": list(range(i)), "s": "é" * i} for i in range(N)]
    for rank, res in r.results.items():
        assert res["size"] == N
        assert res["cls"] == {"mpi": "MPICommunicator", "torch": "TorchCommunicator"}[backend]
        assert res["gathered"] == expected
        assert res["b0"] == {"step": 7, "who": 0}
        assert res["b1"] == ["from", 1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_failure_on_rank_2_is_raised_on_every_rank(backend):
    r = RUNNERS[backend](N, WORKER, backend, "fail2", 20, timeout=60).check()
    assert sorted(r.results) == list(range(N))
    for rank, res in r.results.items():
        assert_rank_2_failure_reported(res, rank, N)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gather_to_a_root_and_agree_by_reduction(backend):
    """gather (root 1 only), all_reduce_minmax, gather_outcomes_to (root 3 only),
    agree_outcomes and scatter (from root 2), natively; a failure on rank 2 raises the
    same error on every rank."""
    r = RUNNERS[backend](N, WORKER, backend, "to_root", 20, timeout=60).check()
    assert sorted(r.results) == list(range(N))
    for rank, res in r.results.items():
        assert res["gathered"] == ([{"rank": i, "s": "é" * i} for i in range(N)]
                                   if rank == 1 else None)
        assert res["minmax"] == [[0, -(N - 1), 7, 0], [N - 1, 0, 7, 2 ** 62]]
        assert res["outcomes"] == ([10 * i for i in range(N)] if rank == 3 else None)
        assert res["agreed"] == [[0, 5], [N - 1, 5]]
        assert res["scattered"] == {"to": rank, "s": "é" * rank}
        for name in ("to_failed", "agree_failed"):
            failed = res[name]
            assert failed["raised"] == "DistributedError", (name, failed)
            assert f"save failed on 1 of {N} rank(s): 2" in failed["msg"]
            assert "rank 2: ValueError: disk full on rank two" in failed["msg"]
            assert failed["failures"] == {"2": "ValueError: disk full on rank two"}
            assert failed["cause"] == ("ValueError" if rank == 2 else None)
        assert res["after"] == list(range(N))


@pytest.mark.skipif(not HAVE_MPI, reason="mpi4py/mpiexec missing")
@pytest.mark.parametrize("scenario,victim", [("hang3_gather", 3), ("hang3", 3), ("hang0_gather", 0)])
def test_mpi_stuck_rank_times_out_naming_it(scenario, victim):
    t = 2.0
    # No .check(): once the survivors exit without MPI_Finalize, mpiexec may kill the
    # stuck rank (exit code 9); what matters is what every survivor reported.
    r = run_mpi(N, WORKER, "mpi", scenario, t, timeout=40)
    survivors = [i for i in range(N) if i != victim]
    assert sorted(r.results) == survivors
    op = "all_gather" if scenario.endswith("_gather") else "barrier"
    for res in r.results.values():
        assert res["raised"] == "CollectiveTimeoutError", res
        assert res["missing"] == [victim]
        assert f"collective '{op}' timed out after 2 s: rank(s) {victim} did not answer" in res["msg"]
        assert res["elapsed"] < t + max(1.0, 0.1 * t) + 1.0  # timeout + grace, not a hang


@pytest.mark.skipif(not HAVE_MPI, reason="mpi4py/mpiexec missing")
def test_mpi_stuck_rank_times_out_in_a_reduction():
    """MPI's own Iallreduce, polled against the deadline: no hang; it cannot name the
    missing rank."""
    t = 2.0
    r = run_mpi(N, WORKER, "mpi", "hang3_reduce", t, timeout=40)
    assert sorted(r.results) == [0, 1, 2]
    for res in r.results.values():
        assert res["raised"] == "CollectiveTimeoutError", res
        assert "collective 'all_reduce_minmax' timed out after 2 s: the ranks that did not " \
               "answer are unknown" in res["msg"]
        assert res["elapsed"] < t + 1.0  # the timeout, not a hang


@pytest.mark.skipif(not HAVE_MPI, reason="mpi4py/mpiexec missing")
def test_mpi_rank_killed_ends_the_job_without_hanging():
    # MPICH tears the job down when a rank is SIGKILLed: nobody hangs.
    r = run_mpi(N, WORKER, "mpi", "die3", 20, timeout=30)
    assert r.returncodes[0] != 0
    assert r.wall < 20


@pytest.mark.skipif(not HAVE_TORCH, reason="torch missing")
@pytest.mark.parametrize("scenario", ["die3", "die3_gather", "hang3", "hang3_gather"])
def test_torch_dead_or_stuck_rank_raises_on_survivors(scenario):
    """The communicator's timeout, not the process group's (a minute, which bounds its
    rendezvous too: comm_worker.STARTUP), bounds every collective."""
    t = 3.0
    r = run_torch(N, WORKER, "torch", scenario, t, timeout=90)
    assert sorted(r.results) == [0, 1, 2], (r.returncodes, r.stderr[-3000:])
    for rank, res in r.results.items():
        assert res["raised"] in ("CollectiveTimeoutError", "CommunicationError"), res
        assert res["elapsed"] < t + 2
    if scenario == "hang3_gather":  # nobody fails at once: the timeout, in all_gather
        for res in r.results.values():
            assert res["raised"] == "CollectiveTimeoutError", res
            assert "collective 'all_gather' timed out after 3 s" in res["msg"], res
    elif scenario != "die3_gather":  # monitored barrier: rank 0 names the missing rank
        assert r.results[0]["raised"] == "CollectiveTimeoutError"
        assert r.results[0]["missing"] == [3]
        assert "rank(s) 3 did not answer" in r.results[0]["msg"]


@pytest.mark.skipif(not HAVE_TORCH, reason="torch missing")
def test_torch_calls_return_once_gloo_lets_go_of_their_tensors():
    """A finished gloo work still holds its tensors for a moment on gloo's thread; where
    that thread drops the last reference, it takes the GIL to free the Python object, and
    a process exiting right then aborts ("terminate called without an active exception").
    Every call returns only once gloo has let go: 500 calls of each rank, none held."""
    r = run_torch(N, WORKER, "torch", "let_go", 60, timeout=120).check()
    assert sorted(r.results) == list(range(N))
    for res in r.results.values():
        assert (res["held"], res["calls"]) == (0, 500), res


def test_single_process():
    c = SingleProcess()
    assert isinstance(c, SingleProcess) and (c.rank, c.size) == (0, 1)
    c.barrier()
    assert c.all_gather({"a": (1, 2)}) == [{"a": [1, 2]}]
    assert c.broadcast({"x": 1}) == {"x": 1}
    assert c.failures(None) == []
    c.check(None)
    with pytest.raises(DistributedError, match=r"rank 0: OSError: boom") as ei:
        c.check(OSError("boom"), what="save")
    assert ei.value.failures == {0: "OSError: boom"}
    assert isinstance(ei.value, UckptError) and isinstance(ei.value, RuntimeError)
    assert c.gather({"a": (1,)}) == [{"a": [1]}]
    assert c.all_reduce_minmax([3, -4]) == ([3, -4], [3, -4])
    assert c.gather_outcomes_to(lambda: 5) == [5]
    assert c.agree_outcomes(lambda: [6], 1) == ([6], [6])
    assert c.scatter([{"a": (7,)}]) == {"a": [7]}
    with pytest.raises(ValueError, match=r"one object per rank \(1\), got 2"):
        c.scatter([1, 2])
    with pytest.raises(OSError, match="boom"):  # one process: the error itself
        c.gather_outcomes_to(lambda: (_ for _ in ()).throw(OSError("boom")))
    with pytest.raises(ValueError, match="root must be 0 in a single process, got 1"):
        c.gather(1, root=1)
    with pytest.raises(TypeError, match=r"ints in \[-2\*\*63 \+ 1, 2\*\*63 - 1\], got 2\.5"):
        c.all_reduce_minmax([2.5])
    assert isinstance(ei.value.__cause__, OSError)
    with pytest.raises(TypeError, match="JSON-able"):
        c.all_gather(object())
    with pytest.raises(ValueError, match="root"):
        c.broadcast(1, root=1)


def test_communicator_instance_is_returned_as_is():
    c = SingleProcess()
    assert get_communicator(c) is c


@pytest.mark.parametrize("bad", [42, "mpi", object(), json])
def test_bad_comm_argument(bad):
    with pytest.raises(TypeError, match=type(bad).__qualname__):
        get_communicator(bad)


def test_timeout_error_types():
    e = CollectiveTimeoutError("barrier", 5, missing=[3, 1])
    assert isinstance(e, TimeoutError) and isinstance(e, DistributedError)
    assert e.missing == [1, 3] and "rank(s) 1, 3 did not answer" in str(e)
    assert issubclass(Communicator, object)


def test_detection_without_launcher_and_no_framework_import():
    code = ("import sys, json, uckpt, uckpt.comm as c; k = type(c.get_communicator()).__name__; "
            "print(json.dumps([k, sorted({'torch', 'mpi4py'} & set(sys.modules))]))")
    env = {k: v for k, v in __import__("os").environ.items()
           if k not in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["SingleProcess", []]
