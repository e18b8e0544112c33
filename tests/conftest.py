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


def mount_tmpfs(path: Path, size: str):
    """Mount a tmpfs of ``size`` (e.g. "1m") at the new directory ``path`` for a fixture
    to yield (needs root; the test is skipped where mounting is not allowed)."""
    import subprocess

    path.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                       capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    yield path
    subprocess.run(["umount", "-l", str(path)], check=False)


def entries(root: Path) -> list:
    """Names under a checkpoint root, less the writer's lock file and the save-costs file
    (always there once a manager has saved to it)."""
    from uckpt.costs import COSTS_NAME
    from uckpt.leases import LOCK_NAME

    return sorted(p.name for p in root.iterdir() if p.name not in (LOCK_NAME, COSTS_NAME))


def flip_byte(path: Path, offset: int) -> None:
    """Corrupt one byte of a file in place."""
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))
