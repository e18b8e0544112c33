"""Run a script on N real processes (MPI or torch.distributed) with a hard timeout.

A hang fails the test: when ``timeout`` passes, every launched process group is
killed and :class:`MultiprocTimeout` (an ``AssertionError``) is raised with the
output so far. The MPICH shared-memory segments that a killed job leaves in /dev/shm
are removed when it ends (tests/mpich_segments.py). Scripts report results by printing
``RESULT <json>`` lines with a ``"rank"`` key; they come back parsed in
:attr:`Run.results`.
"""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import mpich_segments

HAVE_MPI = (importlib.util.find_spec("mpi4py") is not None
            and Path(sys.executable).with_name("mpiexec").exists())
HAVE_TORCH = importlib.util.find_spec("torch") is not None
PYTHON = sys.executable
MPIEXEC = str(Path(sys.executable).with_name("mpiexec"))
SRC = str(Path(__file__).resolve().parent.parent / "src")


class MultiprocTimeout(AssertionError):
    """The processes did not finish within the timeout (killed)."""


@dataclass
class Run:
    returncodes: List[int]
    stdout: str
    stderr: str
    results: Dict[int, Any] = field(default_factory=dict)
    wall: float = 0.0

    def check(self) -> "Run":
        """Assert every process exited 0."""
        assert all(rc == 0 for rc in self.returncodes), (
            f"return codes {self.returncodes}\n--- stdout\n{self.stdout[-4000:]}\n--- stderr\n{self.stderr[-4000:]}")
        return self


def _parse(stdout: str) -> Dict[int, Any]:
    # mpiexec merges the ranks' output; lines may be glued together, so decode
    # each JSON object that follows a "RESULT " marker wherever it is.
    out = {}
    dec = json.JSONDecoder()
    for piece in stdout.split("RESULT ")[1:]:
        try:
            obj, _ = dec.raw_decode(piece)
        except ValueError:
            continue
        if isinstance(obj, dict) and "rank" in obj:
            out[obj["rank"]] = obj
    return out


def _env(extra: Optional[Dict[str, str]]) -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def _kill(procs) -> None:
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for p in procs:
        p.wait()


def _launch(cmds: Sequence[Sequence[str]], envs: Sequence[Dict[str, str]], timeout: float,
            monitor: Optional[Callable[[], None]] = None,
            started: Optional[List[subprocess.Popen]] = None) -> Run:
    """``monitor``, if given, is called every few milliseconds while the processes run
    (e.g. to kill one of them at a chosen moment); ``started``, if given, receives the
    processes (in the order of ``cmds``) before it is first called."""
    start = time.monotonic()
    segments = mpich_segments.segments()  # those a killed job leaves are removed at its end
    files = [(tempfile.TemporaryFile(), tempfile.TemporaryFile()) for _ in cmds]
    procs = [subprocess.Popen(list(c), env=e, stdout=o, stderr=er, start_new_session=True)
             for c, e, (o, er) in zip(cmds, envs, files)]
    if started is not None:
        started.extend(procs)
    timed_out = False
    try:
        while monitor is not None and any(p.poll() is None for p in procs) and \
                time.monotonic() < start + timeout:
            monitor()
            time.sleep(0.002)
        for p in procs:
            left = start + timeout - time.monotonic()
            try:
                p.wait(timeout=max(left, 0.01))
            except subprocess.TimeoutExpired:
                timed_out = True
                break
    finally:
        if timed_out or any(p.poll() is None for p in procs):
            _kill(procs)
        mpich_segments.remove_orphans(segments)
    outs, errs = [], []
    for o, er in files:
        o.seek(0)
        er.seek(0)
        outs.append(o.read().decode(errors="replace"))
        errs.append(er.read().decode(errors="replace"))
        o.close()
        er.close()
    stdout, stderr = "".join(outs), "".join(errs)
    if timed_out:
        raise MultiprocTimeout(f"processes did not finish within {timeout} s (killed)\n--- stdout\n"
                               f"{stdout[-4000:]}\n--- stderr\n{stderr[-4000:]}")
    return Run([p.returncode for p in procs], stdout, stderr, _parse(stdout), time.monotonic() - start)


def run_command(cmd: Sequence[Any], timeout: float, env: Optional[Dict[str, str]] = None,
                monitor: Optional[Callable[[], None]] = None) -> Run:
    """One command, in a session of its own: on a timeout every process it started is
    killed too, and the output so far is in the error (``monitor``: see :func:`_launch`)."""
    return _launch([list(map(str, cmd))], [_env(env)], timeout, monitor)


def run_commands(cmds: Sequence[Sequence[Any]], envs: Sequence[Dict[str, str]], timeout: float,
                 monitor: Optional[Callable[[List[subprocess.Popen]], None]] = None) -> Run:
    """Several commands at once, each with its own extra environment and in a session of
    its own (e.g. one torchrun agent per simulated node); ``monitor(processes)``: see
    :func:`_launch`. :attr:`Run.returncodes` are in the order of ``cmds``."""
    procs: List[subprocess.Popen] = []
    return _launch([list(map(str, c)) for c in cmds], [_env(e) for e in envs], timeout,
                   None if monitor is None else lambda: monitor(procs), procs)


def kill_tagged(tag: str) -> List[int]:
    """SIGKILL every process whose command line holds ``tag`` (a test's unique name):
    the workers a launcher started in sessions of their own (torchrun's), which a kill of
    the launcher's session leaves running. Returns their pids."""
    killed = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if tag.encode() not in f.read():
                    continue
            os.kill(int(entry), signal.SIGKILL)
            killed.append(int(entry))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            pass
    return killed


def run_mpi(n: int, script, *args, timeout: float = 60, mpiexec_args: Sequence[str] = (),
            env: Optional[Dict[str, str]] = None, monitor=None) -> Run:
    """``mpiexec -n N python script args...``; ``-disable-auto-cleanup`` (MPICH) in
    ``mpiexec_args`` keeps the survivors alive when one rank dies."""
    cmd = [MPIEXEC, *mpiexec_args, "-n", str(n), PYTHON, str(script), *map(str, args)]
    return _launch([cmd], [_env(env)], timeout, monitor)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_torch(n: int, script, *args, timeout: float = 60, env: Optional[Dict[str, str]] = None,
              monitor=None) -> Run:
    """N processes for torch.distributed (``init_method="env://"``): MASTER_ADDR,
    MASTER_PORT (a free port), RANK, LOCAL_RANK, WORLD_SIZE are set."""
    port = str(free_port())
    envs = [_env({**(env or {}), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "RANK": str(r),
                  "LOCAL_RANK": str(r), "WORLD_SIZE": str(n)}) for r in range(n)]
    cmd = [PYTHON, str(script), *map(str, args)]
    return _launch([cmd] * n, envs, timeout, monitor)


def assert_rank_2_failure_reported(res: Dict[str, Any], rank: int, n: int) -> None:
    """What every rank reports after rank 2 failed with "disk full on rank two" in a
    ``comm.check(..., what="save")`` (comm_worker.py / horovod_worker.py, scenario fail2)."""
    assert res["raised"] == "DistributedError"
    assert "rank 2: ValueError: disk full on rank two" in res["msg"]
    assert f"save failed on 1 of {n} rank(s): 2" in res["msg"]
    assert res["failures"] == {"2": "ValueError: disk full on rank two"}
    assert res["cause"] == ("ValueError" if rank == 2 else None)
    assert res["after"] == list(range(n))
