"""README.md's ```python blocks run as a reader runs them: pasted in order into one
``python`` session (tests/readme_session.py), and the whole session once more, in a new
process, in the same directory, as a user who comes back the next day does (the first
block's loop then resumes from its last checkpoint; nothing the first session saved may make
the second fail). Each block imports what it uses: the session takes every module out of
its namespace before each block.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from readme_session import blocks

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"


def test_readme_has_the_blocks_this_test_knows():
    found = blocks(README)
    assert len(found) == 8, "a block was added or removed: check readme_session's stand-ins"
    assert "def state(step)" in found[0]
    assert all("manager.restore(state)" not in b for b in found[:2]), \
        "the first blocks define state(step): call it"


def run_session(tmp_path, session, bucket, options):
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("readme_session.py")), str(README),
         bucket, json.dumps(options)],
        cwd=tmp_path, capture_output=True, text=True, timeout=280,
        env=dict(os.environ, UCKPT_SHM_DIR=str(tmp_path / "shm")))
    assert proc.returncode == 0, f"session {session}:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(600)
def test_every_readme_python_block_runs_twice(tmp_path, s3_bucket, s3_options, monkeypatch):
    pytest.importorskip("torch")
    import uckpt

    monkeypatch.setenv("UCKPT_SHM_DIR", str(tmp_path / "shm"))
    (tmp_path / "shm").mkdir()  # shm:// roots of the blocks: here, not in /dev/shm
    first = run_session(tmp_path, 1, s3_bucket, s3_options)
    assert first["evaluated"] == [5]
    second = run_session(tmp_path, 2, s3_bucket, s3_options)
    assert second["evaluated"] == [10]  # the distributed job went on: its new step

    # what the two sessions left, checked from outside
    def reader(root):
        return uckpt.CheckpointManager(str(root), role="reader")

    assert reader(tmp_path / "checkpoints").steps() == [80, 90, 100]  # keep_last=3
    assert reader(tmp_path / "two-tier/shared/job").latest_step() == 200
    from uckpt.runtime.nodes import node_name  # the memory level of the two-tier job
    shm = uckpt.CheckpointManager(f"shm://job-{node_name()}", role="reader")
    assert shm.steps() == [100, 200]
    assert reader(tmp_path / "shared/job").steps() == [5, 10]
    assert set(uckpt.load(tmp_path / "final")["model"]) == {"weight", "bias"}
    assert set(uckpt.load(tmp_path / "ckpt")["model"]) == {"weight", "bias"}
    final = tmp_path / "incremental/export/final"
    assert not uckpt.manifest(final).bases and uckpt.manifest(final).step == 10
    assert reader(tmp_path / "options/ckpt/run1").steps() == [5, 10]
    assert set(uckpt.load(tmp_path / "ckpt-aligned")["model"]) == {"weight", "bias"}
    loaded = uckpt.load(f"s3://{s3_bucket}/final", storage_options=s3_options)
    assert set(loaded["model"]) == {"weight", "bias"}
