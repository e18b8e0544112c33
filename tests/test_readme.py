"""Every ```python block of README.md runs, in order, in one namespace (as a reader who
pastes them one after another would), in a temporary working directory.

The README leaves out what is not uckpt's (the training step, the evaluation, the
cluster's paths and the S3 endpoint); the stand-ins below supply exactly that, and the
absolute paths and the bucket are pointed at the test's own directory and S3 server.
A block that stops running, or a new block whose names nothing defines, fails here.
"""
import os
import re
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def blocks():
    return BLOCK.findall((REPO / "README.md").read_text())


def stand_ins(tmp):
    """What the README assumes exists around its snippets."""
    calls = {"evaluated": [], "polls": 0}

    def training_is_running():
        calls["polls"] += 1
        return calls["polls"] <= 2

    return {
        "total": 200,                                  # steps of the training loop
        "train_one_step": lambda: 0.5,                 # returns the loss
        "step": 5,
        "eval_model": None,                            # set below, once there is a model
        "evaluate": lambda model, step: calls["evaluated"].append(step),
        "training_is_running": training_is_running,
        "time": types.SimpleNamespace(sleep=lambda s: None),
        "_calls": calls,
    }


def localized(code, root, bucket):
    """The block with its absolute paths under ``root`` and its bucket the test's."""
    for path in ("/shared/job", "/local/nvme/run1", "/shared/run1",
                 "/ckpt/run1", "/export/final"):
        code = code.replace(f'"{path}"', repr(str(root / path.strip("/"))))
    code = code.replace("s3://bucket/", f"s3://{bucket}/")
    code = re.sub(r'storage_options=\{"endpoint_url": "http://minio:9000", [^}]*\}',
                  "storage_options=S3_OPTIONS", code)
    return code.replace("storage_options={...}", "storage_options=S3_OPTIONS")


#: blocks (by index) that are jobs of their own, and the directory each runs under
OWN_ROOTS = {1: "two-tier", 4: "compressed", 5: "incremental", 6: "options"}


def test_readme_has_the_blocks_this_test_knows():
    found = blocks()
    assert len(found) == 8, "a block was added or removed: check the stand-ins here"
    assert "def state(step)" in found[0]
    assert all("manager.restore(state)" not in b for b in found[:2]), \
        "the first blocks define state(step): call it"


@pytest.mark.timeout(300)
def test_every_readme_python_block_runs(tmp_path, s3_bucket, s3_options, monkeypatch):
    pytest.importorskip("torch")
    import uckpt

    monkeypatch.chdir(tmp_path)
    (tmp_path / "shm").mkdir()  # shm:// roots of the blocks: here, not in /dev/shm
    monkeypatch.setenv("UCKPT_SHM_DIR", str(tmp_path / "shm"))
    ns = stand_ins(tmp_path)
    ns["S3_OPTIONS"] = s3_options
    managers = []
    try:
        for i, code in enumerate(blocks()):
            if i == 7:  # the evaluator restores into a model of its own
                import torch

                ns["eval_model"] = torch.nn.Linear(4, 2)
            # the two-tier, compression and incremental examples are jobs of their own; the
            # evaluator watches the distributed job's root (both say "/shared/job")
            root = tmp_path / OWN_ROOTS[i] if i in OWN_ROOTS else tmp_path
            exec(compile(localized(code, root, s3_bucket), f"README.md block {i + 1}",
                         "exec"), ns)
            if isinstance(ns.get("manager"), uckpt.CheckpointManager) and \
                    ns["manager"] not in managers:
                managers.append(ns["manager"])
    finally:
        for m in managers:
            m.close()
    # what the blocks did, checked from outside
    assert uckpt.CheckpointManager("checkpoints", role="reader").latest_step() == 100
    assert sorted(os.listdir(tmp_path / "checkpoints"))[-3:] == \
        ["step_00000080", "step_00000090", "step_00000100"]
    assert uckpt.CheckpointManager(str(tmp_path / "two-tier/shared/job"),
                                   role="reader").latest_step() == 200
    from uckpt.runtime.nodes import node_name  # the memory level of the two-tier job
    assert uckpt.CheckpointManager(f"shm://job-{node_name()}", role="reader").steps() == [100, 200]
    assert uckpt.CheckpointManager(str(tmp_path / "shared/job"),
                                   role="reader").latest_step() == ns["step"]
    assert ns["_calls"]["evaluated"], "the evaluator's loop never restored a step"
    assert set(uckpt.load("ckpt")["model"]) == {"weight", "bias"}  # tiny arrays: stored raw
    assert not uckpt.manifest(tmp_path / "incremental/export/final").bases  # self-contained
    assert set(uckpt.load(tmp_path / "incremental/export/final")["model"]) == {"weight", "bias"}
    laid_out = uckpt.CheckpointManager(str(tmp_path / "options/ckpt/run1"), role="reader")
    assert laid_out.latest_step() == ns["step"]
    assert set(uckpt.load("ckpt-aligned")["model"]) == {"weight", "bias"}
    loaded = uckpt.load(f"s3://{s3_bucket}/final", storage_options=s3_options)
    assert set(loaded["model"]) == {"weight", "bias"}
