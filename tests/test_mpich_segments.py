"""The MPICH shared-memory segment of a SIGKILLed ``mpiexec`` job is removed when the
job ends (tests/multiproc.py, tests/mpich_segments.py); a running job's is not."""
import json
import os
import signal
import subprocess

import pytest

import mpich_segments
from multiproc import HAVE_MPI, MPIEXEC, PYTHON, run_mpi

pytestmark = pytest.mark.skipif(not HAVE_MPI, reason="no mpiexec")

RANK = """\
import json, os, sys, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
comm.Barrier()
with open("/proc/self/maps") as f:
    mapped = sorted({line.split()[-1] for line in f if "/dev/shm/mpich_shm_" in line})
tmp = os.path.join(sys.argv[1], f".{comm.rank}")
with open(tmp, "w") as f:
    json.dump({"pid": os.getpid(), "segments": mapped}, f)
os.replace(tmp, os.path.join(sys.argv[1], str(comm.rank)))
time.sleep(120)
"""


def reports(directory):
    """What the ranks of a job wrote once they were all up: pid and mapped segments."""
    return [json.loads(p.read_text()) for p in directory.iterdir() if not p.name.startswith(".")]


def test_a_killed_jobs_segment_is_removed_and_a_running_jobs_kept(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    killed, running = tmp_path / "killed", tmp_path / "running"
    killed.mkdir()
    running.mkdir()
    before = mpich_segments.segments()
    other = []

    def monitor():
        """Once the first job is up, start a second (it must outlive the first's end);
        once that one is up too, SIGKILL the first job's ranks."""
        if other and other[0] == "done" or len(reports(killed)) < 2:
            return
        if not other:
            other.append(subprocess.Popen([MPIEXEC, "-n", "2", PYTHON, script, running],
                                          start_new_session=True))
        if len(reports(running)) == 2:
            for r in reports(killed):
                try:
                    os.kill(r["pid"], signal.SIGKILL)
                except ProcessLookupError:  # mpiexec ended it when the other rank died
                    pass
            other.append("done")

    try:
        run = run_mpi(2, script, killed, timeout=60, monitor=monitor)
        assert run.returncodes[0] != 0 and other[-1] == "done", run.stderr[-2000:]
        mine = {p for r in reports(killed) for p in r["segments"]}
        theirs = {p for r in reports(running) for p in r["segments"]}
        assert mine and theirs and not mine & theirs, (mine, theirs)
        assert not [p for p in mine if os.path.exists(p)]  # the killed job's: removed
        assert all(os.path.exists(p) for p in theirs)  # the running job's: kept
        assert other[0].poll() is None
    finally:
        if other:
            os.killpg(other[0].pid, signal.SIGKILL)
            other[0].wait()
        mpich_segments.remove_orphans(before)
