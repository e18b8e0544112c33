"""A fork server for the crash tests' savers: one process that has imported numpy, uckpt
and what the savers import forks a child per run, so a run that is SIGKILLed soon after it
starts does not pay for a fresh interpreter's imports (most of the crash suites' CPU time).
Other tests start one with their own imports (``ForkServer.start(preload=...)``:
tests/test_lightning.py's with torch and Lightning).

    server = ForkServer.start()          # the fixture ``saver_forks`` of conftest.py
    p = server.popen([script, *args], stdout=subprocess.PIPE)
    p.stdout.readline(); p.send_signal(signal.SIGKILL); p.wait()
    server.stop()

The child runs ``script`` as ``__main__`` (``runpy``) with ``sys.argv = [script, *args]``,
the caller's stdin, stderr, working directory and environment, and a pipe (or the caller's
stdout) as its stdout, exactly as ``python script args`` would, and exits as such an
interpreter does. The server answers its pid; the caller signals the child itself and asks
the server, which is its parent, to reap it (:meth:`Forked.wait`): the pid cannot be
reused before that. What differs from a fresh interpreter: the modules are already imported
(their import-time state is the server's, so a ``UCKPT_*`` variable that differs from the
server's start falls back to a fresh interpreter: :meth:`ForkServer.popen`), the hash seed
is the server's, and OpenBLAS has no thread pool (``OPENBLAS_NUM_THREADS=1`` while numpy is
imported: the server starts no thread before it forks). Python's ``random`` is reseeded in
every child by the interpreter itself.

The server's side, run as ``python fork_server.py FD [MODULES]``: FD is its end of a
socket pair, MODULES what it imports (comma-separated; PRELOAD when not given).
Requests and answers are JSON, one a packet: ``{"op": "run", "argv", "cwd", "env"}`` with
the child's stdin, stdout and stderr as passed descriptors -> ``{"pid"}``; ``{"op": "wait",
"pid", "timeout"}`` -> ``{"status"}`` (as ``Popen.returncode``; None: still running at the
timeout); ``{"op": "stop"}`` or the socket's end: SIGKILL and reap every child not reaped
yet, then exit.
"""
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Sequence

#: what the savers import (tests/crash_saver.py, rollback_saver.py, shared_root_worker.py)
PRELOAD = ("logging", "re", "random", "json", "traceback", "warnings", "runpy", "numpy", "uckpt",
           "incremental_common", "rollback_saver", "shared_root_worker")
PACKET = 1 << 20


def _send(sock: socket.socket, message: dict, fds=()) -> None:
    socket.send_fds(sock, [json.dumps(message).encode()], list(fds))


def _receive(sock: socket.socket, nfds: int = 0):
    data, fds, _, _ = socket.recv_fds(sock, PACKET, nfds)
    return (json.loads(data) if data else None), fds


def _status(wait_status: int) -> int:
    """``Popen.returncode`` of a ``waitpid`` status: the exit code, or minus the signal."""
    return os.waitstatus_to_exitcode(wait_status)


# --- the server process -----------------------------------------------------------------

def _preload(names: Sequence[str]) -> None:
    """Import ``names``, with no thread left behind (OpenBLAS starts its pool when numpy
    is imported, unless told to use one thread)."""
    before = os.environ.get("OPENBLAS_NUM_THREADS")
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    import importlib

    for name in names:
        importlib.import_module(name)
    if before is None:
        del os.environ["OPENBLAS_NUM_THREADS"]
    else:
        os.environ["OPENBLAS_NUM_THREADS"] = before
    threads = os.listdir("/proc/self/task")
    if len(threads) != 1:
        raise RuntimeError(f"fork server: {len(threads)} threads after the imports; a fork "
                           "would copy their locks but not the threads")


def _wait(pid: int, timeout):
    """Reap child ``pid`` (None: still running after ``timeout`` seconds)."""
    if timeout is not None:
        fd = os.pidfd_open(pid)
        try:
            select.select([fd], [], [], timeout)
        finally:
            os.close(fd)
        done, status = os.waitpid(pid, os.WNOHANG)
        return _status(status) if done else None
    return _status(os.waitpid(pid, 0)[1])


def _serve(sock: socket.socket):
    """Answer requests until told to stop (returns None) or, in a forked child, return
    the request the child is to run."""
    children = set()
    try:
        while True:
            request, fds = _receive(sock, 3)
            if request is None or request["op"] == "stop":
                return None
            if request["op"] == "wait":
                status = _wait(request["pid"], request["timeout"])
                if status is not None:
                    children.discard(request["pid"])
                _send(sock, {"status": status})
                continue
            pid = os.fork()
            if pid == 0:  # the child: the caller's stdio, nothing of the server's
                children.clear()
                sock.close()
                for target, fd in enumerate(fds):
                    os.dup2(fd, target)
                    os.close(fd)
                return request
            for fd in fds:
                os.close(fd)
            children.add(pid)
            _send(sock, {"pid": pid})
    finally:
        for pid in children:  # a test that failed before it killed its child
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def _run_child(request: dict) -> None:
    """Become ``python script args`` (in a forked child)."""
    import runpy

    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = list(request["argv"])
    sys.path[0] = str(Path(sys.argv[0]).resolve().parent)
    if "numpy.random" in sys.modules:  # as a fresh interpreter: a new seed
        sys.modules["numpy.random"].seed()
    runpy.run_path(sys.argv[0], run_name="__main__")


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    _preload(sys.argv[2].split(",") if len(sys.argv) > 2 else PRELOAD)
    _send(sock, {"ready": True})
    request = _serve(sock)
    if request is None:  # stopped: skip the interpreter's teardown of what it imported
        os._exit(0)  # (seconds for torch and Lightning; nothing here to flush)
    _run_child(request)


# --- the test's side --------------------------------------------------------------------

class Forked:
    """A child of the fork server, as much of ``subprocess.Popen`` as the crash tests use
    (``pid``, ``stdin``, ``stdout``, ``returncode``, ``send_signal``, ``wait``,
    ``communicate``)."""

    def __init__(self, server: "ForkServer", pid: int, stdout):
        self.server, self.pid, self.stdout, self.returncode = server, pid, stdout, None
        self.stdin = None

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:  # not reaped: the pid is still this child's
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout=None) -> int:
        if self.returncode is None:
            self.returncode = self.server.wait(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.server.argv, timeout)
        return self.returncode

    def communicate(self, timeout=None):
        """Read the child's stdout to its end and reap it: (stdout, None)."""
        out = [None]
        if self.stdout is not None:
            reader = threading.Thread(target=lambda: out.__setitem__(0, self.stdout.read()),
                                      daemon=True)
            reader.start()
            reader.join(timeout)
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.server.argv, timeout)
            self.stdout.close()
        self.wait(timeout)
        return out[0], None


def reap(proc) -> None:
    """SIGKILL and reap ``proc`` (a :class:`Forked` or a ``subprocess.Popen``) unless it
    has been reaped already: a test's ``finally`` after a failure or a timeout."""
    if proc.returncode is None:
        proc.kill()
        proc.wait()


class ForkServer:
    """The test's handle on a running fork server (see the module's docstring)."""

    def __init__(self, proc: subprocess.Popen, sock: socket.socket, env: dict):
        self.proc, self.sock, self.env = proc, sock, env
        self.argv = [sys.executable, __file__]

    @classmethod
    def start(cls, timeout: float = 120, preload: Sequence[str] = PRELOAD) -> "ForkServer":
        """Start the server and wait until it has imported the modules ``preload``."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        proc = subprocess.Popen([sys.executable, __file__, str(theirs.fileno()),
                                 ",".join(preload)],
                                pass_fds=[theirs.fileno()], stdout=subprocess.DEVNULL)
        theirs.close()
        server = cls(proc, ours, dict(os.environ))
        try:
            ours.settimeout(timeout)
            ready, _ = _receive(ours)
            ours.settimeout(None)
            if ready != {"ready": True}:
                raise RuntimeError(f"fork server {proc.pid} did not start: exit status "
                                   f"{proc.wait(timeout)}")
        except BaseException:
            server.stop()
            raise
        return server

    def popen(self, argv, stdout=None, stderr=None, stdin=None):
        """Run ``python argv...`` in a child forked from the server (``stdout``: None, the
        caller's, ``subprocess.PIPE`` (text) or an open file; ``stderr``: None, the
        caller's, ``subprocess.STDOUT`` or an open file; ``stdin``: None, the caller's, or
        ``subprocess.PIPE``, text, as ``.stdin``). Falls back to a fresh interpreter
        (``subprocess.Popen``) where a ``UCKPT_*`` variable, which uckpt may read when
        imported, is not what it was when the server started."""
        argv = [str(a) for a in argv]
        knobs = {k: v for k, v in os.environ.items() if k.startswith("UCKPT_")}
        if knobs != {k: v for k, v in self.env.items() if k.startswith("UCKPT_")}:
            return subprocess.Popen([sys.executable, *argv], stdin=stdin, stdout=stdout,
                                    stderr=stderr, text=True)
        r = w = ir = iw = None
        if stdout == subprocess.PIPE:
            r, w = os.pipe()
        if stdin == subprocess.PIPE:
            ir, iw = os.pipe()
        out = w if w is not None else 1 if stdout is None else stdout.fileno()
        err = 2 if stderr is None else out if stderr == subprocess.STDOUT else stderr.fileno()
        try:
            _send(self.sock, {"op": "run", "argv": argv, "cwd": os.getcwd(),
                              "env": dict(os.environ)}, [0 if ir is None else ir, out, err])
            for fd in (w, ir):
                if fd is not None:
                    os.close(fd)
            w = ir = None
            pid = self._answer()["pid"]
        except BaseException:
            for fd in (r, w, ir, iw):
                if fd is not None:
                    os.close(fd)
            raise
        forked = Forked(self, pid, None if r is None else open(r, encoding="utf-8"))
        forked.stdin = None if iw is None else open(iw, "w", encoding="utf-8")
        return forked

    def wait(self, pid: int, timeout=None):
        _send(self.sock, {"op": "wait", "pid": pid, "timeout": timeout})
        return self._answer()["status"]

    def _answer(self) -> dict:
        answer, _ = _receive(self.sock)
        if answer is None:
            raise RuntimeError(f"the fork server (pid {self.proc.pid}) has exited: status "
                               f"{self.proc.wait()}")
        return answer

    def stop(self, timeout: float = 60) -> None:
        """Tell the server to stop (it SIGKILLs children not reaped yet) and wait for it;
        SIGKILL it by its pid if it has not exited after ``timeout`` seconds."""
        try:
            _send(self.sock, {"op": "stop"})
        except OSError:
            pass  # it is gone already
        self.sock.close()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


if __name__ == "__main__":
    main()
