"""Shared test helpers. Tests use real files under pytest's tmp_path, never fixed paths."""
import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# a real S3 server (SeaweedFS) for the object-store tests: fixtures s3_server, s3_bucket, ...
pytest_plugins = ["s3_server"]

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


@pytest.fixture
def small_chunks(monkeypatch):
    """Make arrays split into many chunks so chunking paths run on tiny data."""
    import uckpt.knobs as knobs

    monkeypatch.setattr(knobs, "chunk_bytes", 256)
    return knobs


def entries(root: Path) -> list:
    """Names under a checkpoint root, less the writer's lock file (always there once a
    manager has saved to it)."""
    from uckpt.leases import LOCK_NAME

    return sorted(p.name for p in root.iterdir() if p.name != LOCK_NAME)


def flip_byte(path: Path, offset: int) -> None:
    """Corrupt one byte of a file in place."""
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))
