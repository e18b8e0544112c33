"""The ``uckpt`` command, run as a user runs it: a subprocess, exit codes, stdout and stderr."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import uckpt
from conftest import flip_byte

TEMP_NAME = ".step_00000040.uckpt-tmp-1a2b3c4d"


def run_cli(*args, cwd=None):
    """``python -m uckpt.cli.main ARGS``; returns the CompletedProcess (text mode)."""
    return subprocess.run([sys.executable, "-m", "uckpt.cli.main", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, timeout=120,
                          env=dict(os.environ, PYTHONWARNINGS="ignore"))


def assert_error(proc, *fragments):
    """Exit 1, one ``uckpt: error:`` line on stderr naming every fragment, no traceback."""
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "uckpt: error: " in proc.stderr
    assert "Traceback" not in proc.stderr
    for f in fragments:
        assert f in proc.stderr, (f, proc.stderr)


class Net:
    """A user class saved through the built-in ``stateful`` adapter (an object node)."""

    def __init__(self):
        self.w = np.arange(12, dtype=np.float32).reshape(4, 3)
        self.b = np.zeros(3)

    def state_dict(self):
        return {"weight": self.w, "bias": self.b}

    def load_state_dict(self, sd):
        self.w, self.b = sd["weight"], sd["bias"]


def state(step):
    emb = np.full((8, 2), step, dtype=np.int64)
    return {"model": Net(), "emb": {"table": emb, "tied": emb}, "epoch": 3, "lr": 0.1,
            "name": "run-1", "loss": float("nan"), "history": [], "blob": b"\x00\xff"}


@pytest.fixture
def root(tmp_path):
    """A manager root: steps 10, 20, 30 committed, then an interrupted save of step 40."""
    root = tmp_path / "root"
    with uckpt.CheckpointManager(root) as mgr:
        for step in (10, 20, 30):
            mgr.save(step, state(step), metadata={"run": "cli-test", "seed": 7})
    tmp = root / TEMP_NAME  # made after the manager opened: it removes such debris
    tmp.mkdir()
    (tmp / "data-00000.bin").write_bytes(b"\0" * 100)
    return root


# -- ls --------------------------------------------------------------------------------------
def test_ls_root(root):
    proc = run_cli("ls", root)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    lines = proc.stdout.strip().splitlines()
    assert lines[0].split()[:6] == ["STEP", "STATUS", "SIZE", "LEAVES", "CREATED", "NAME"]
    body = [line.split() for line in lines[1:]]
    assert [row[0] for row in body] == ["10", "20", "30", "40"]  # by step
    for row, step in zip(body[:3], (10, 20, 30)):
        assert row[1] == "committed"
        assert row[4] == "4"  # model/weight, model/bias, emb/table, blob (emb/tied is shared)
        assert f"step_{step:08d}" in row
    assert body[3][1] == "incomplete"
    assert TEMP_NAME in body[3]
    assert body[3][2:4] == ["100", "B"]


def test_ls_damaged(root):
    (root / "step_00000020" / "manifest.json").write_text('{"format": "uckpt"}')
    os.truncate(root / "step_00000030" / "data-00000.bin", 10)
    (root / "step_00000050").mkdir()
    proc = run_cli("ls", root)
    assert proc.returncode == 0, proc.stderr
    lines = {line.split()[0]: line for line in proc.stdout.strip().splitlines()[1:]}
    assert " committed " in lines["10"]
    assert " damaged " in lines["20"] and "format_version" in lines["20"]
    assert " damaged " in lines["30"] and "data-00000.bin is truncated" in lines["30"]
    assert " damaged " in lines["50"] and "no manifest.json" in lines["50"]


def test_ls_json(root):
    proc = run_cli("ls", "--json", root)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    cks = doc["checkpoints"]
    assert [(c["step"], c["status"]) for c in cks] == [
        (10, "committed"), (20, "committed"), (30, "committed"), (40, "incomplete")]
    first = cks[0]
    assert Path(first["path"]) == (root / "step_00000010").absolute()
    assert first["leaves"] == 4 and first["reason"] is None
    assert first["nbytes"] == uckpt.manifest(root / "step_00000010").nbytes
    assert first["size"] == sum(f.stat().st_size for f in (root / "step_00000010").iterdir())
    assert first["created"] == uckpt.manifest(root / "step_00000010").created
    assert cks[3]["name"] == TEMP_NAME and cks[3]["leaves"] is None and cks[3]["size"] == 100


def test_ls_single_checkpoint_and_empty_root(tmp_path, root):
    proc = run_cli("ls", root / "step_00000020")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 2 and lines[1].split()[:2] == ["20", "committed"]
    plain = uckpt.save(tmp_path / "plain", {"x": np.ones(3)})  # no step recorded
    proc = run_cli("ls", "--json", plain)
    (only,) = json.loads(proc.stdout)["checkpoints"]
    assert only["step"] is None and only["status"] == "committed" and only["name"] == "plain"
    (tmp_path / "empty").mkdir()
    proc = run_cli("ls", tmp_path / "empty")
    assert proc.returncode == 0 and "no checkpoints" in proc.stdout
    assert json.loads(run_cli("ls", "--json", tmp_path / "empty").stdout)["checkpoints"] == []


def test_ls_missing_root(tmp_path):
    assert_error(run_cli("ls", tmp_path / "nowhere"), "nowhere", "does not exist")
    (tmp_path / "file").write_text("x")
    assert_error(run_cli("ls", tmp_path / "file"), "is a file")


def test_ls_does_not_touch_the_root(root):
    before = sorted(p.name for p in root.iterdir())
    run_cli("ls", root)
    assert sorted(p.name for p in root.iterdir()) == before  # debris is listed, not removed


# -- inspect ---------------------------------------------------------------------------------
def test_inspect_text(root):
    ckpt = root / "step_00000020"
    proc = run_cli("inspect", ckpt)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "format       uckpt v1" in out
    assert "step         20" in out
    assert "world size   1" in out
    assert "generator    uckpt " in out
    assert "data-00000.bin (rank 0," in out
    assert 'run = "cli-test"' in out and "seed = 7" in out
    assert "model: stateful (test_cli.Net)" in out
    for line in ("epoch = 3", "lr = 0.1", 'name = "run-1"', "loss = nan", "history = []",
                 "emb/tied -> emb/table (shared array)"):
        assert line in out, line
    leaves = {line.split()[0]: line.split() for line in
              out.split("leaves:\n", 1)[1].strip().splitlines()[1:]}
    assert leaves["model/weight"][1:5] == ["float32", "(4,", "3)", "48"]
    assert leaves["model/bias"][1:3] == ["float64", "(3,)"]
    assert leaves["emb/table"][1:5] == ["int64", "(8,", "2)", "128"]
    assert leaves["emb/table"][-1] == "1"  # chunks
    assert "blob" in leaves and "(bytes)" in leaves["blob"]
    assert "emb/tied" not in leaves  # stored once


def test_inspect_json(root, monkeypatch):
    import uckpt.knobs as knobs

    monkeypatch.setattr(knobs, "chunk_bytes", 64)  # big is split into several chunks
    big = np.arange(1000, dtype=np.float32)
    ckpt = uckpt.save(root.parent / "big", {"big": big, "opt": {"step": 5}}, step=99,
                      metadata={"k": [1, 2]})
    proc = run_cli("inspect", "--json", ckpt)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    man = uckpt.manifest(ckpt)
    assert doc["format"] == "uckpt" and doc["format_version"] == 1
    assert doc["step"] == 99 and doc["world_size"] == 1 and doc["metadata"] == {"k": [1, 2]}
    assert doc["created"] == man.created and doc["generator"] == man.generator
    assert doc["nbytes"] == 4000
    assert doc["files"] == [{"name": f.name, "rank": f.rank, "size": f.size}
                            for f in man.files.values()]
    (leaf,) = doc["leaves"]
    assert leaf["path"] == "big" and leaf["dtype"] == "float32" and leaf["shape"] == [1000]
    assert leaf["nbytes"] == 4000 and leaf["chunks"] == len(man.arrays["big"].chunks) > 1
    assert doc["values"] == [{"path": "opt/step", "type": "value", "value": 5}]

    doc = json.loads(run_cli("inspect", "--json", root / "step_00000010").stdout)
    assert doc["objects"] == [{"path": "model", "adapter": "stateful", "class": "test_cli.Net"}]
    values = {v["path"]: v for v in doc["values"]}
    assert values["loss"] == {"path": "loss", "type": "float", "value": "nan"}
    assert values["epoch"]["value"] == 3 and values["history"]["value"] == []
    assert doc["shared"] == [{"path": "emb/tied", "array": "emb/table"}]
    kinds = {leaf["path"]: leaf["kind"] for leaf in doc["leaves"]}
    assert kinds == {"model/weight": "array", "model/bias": "array", "emb/table": "array",
                     "blob": "bytes"}


def test_inspect_reads_no_data(root):
    ckpt = root / "step_00000010"
    flip_byte(ckpt / "data-00000.bin", 0)  # inspect only reads the manifest
    assert run_cli("inspect", ckpt).returncode == 0


def test_inspect_errors(tmp_path, root):
    assert_error(run_cli("inspect", tmp_path / "missing"), "missing", "does not exist")
    assert_error(run_cli("inspect", root / TEMP_NAME), "no manifest.json", "hint:")
    (root / "step_00000010" / "manifest.json").write_text("not json")
    assert_error(run_cli("inspect", root / "step_00000010"), "manifest.json",
                 "not valid UTF-8 JSON")


# -- verify ----------------------------------------------------------------------------------
def test_verify_ok(root):
    ckpt = root / "step_00000010"
    proc = run_cli("verify", ckpt)
    assert proc.returncode == 0, proc.stderr
    chunks = sum(len(a.chunks) for a in uckpt.manifest(ckpt).arrays.values())
    nbytes = uckpt.manifest(ckpt).nbytes
    assert proc.stdout.startswith(f"OK: {chunks} chunks, {nbytes} bytes verified in ")
    assert str(ckpt) in proc.stdout
    assert proc.stderr == ""  # no progress meter when stderr is not a terminal


def test_verify_several_and_all(root):
    proc = run_cli("verify", root / "step_00000010", root / "step_00000030")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("OK: ") == 2
    proc = run_cli("verify", "--all", root)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 3 and all(line.startswith("OK: ") for line in lines)  # temp dir skipped
    assert [line.rsplit("step_", 1)[1] for line in lines] == ["00000010", "00000020", "00000030"]


def test_verify_flipped_byte(root):
    ckpt = root / "step_00000020"
    chunk = uckpt.manifest(ckpt).arrays["emb/table"].chunks[0]
    flip_byte(ckpt / chunk.file, chunk.offset + 17)
    proc = run_cli("verify", ckpt)
    assert_error(proc, str(ckpt / chunk.file), "checksum mismatch", "'emb/table'",
                 f"byte offset {chunk.offset}")
    assert "OK" not in proc.stdout

    proc = run_cli("verify", "--all", root)  # the others are still verified and reported
    assert_error(proc, "'emb/table'", "1 of 3 checkpoints failed verification")
    assert proc.stdout.count("OK: ") == 2


def test_verify_truncated_and_missing_file(root):
    data = root / "step_00000010" / "data-00000.bin"
    os.truncate(data, 5)
    assert_error(run_cli("verify", root / "step_00000010"), str(data), "truncated")
    os.remove(root / "step_00000030" / "data-00000.bin")
    assert_error(run_cli("verify", root / "step_00000030"), "data-00000.bin", "missing")


def test_verify_missing_path(tmp_path, root):
    assert_error(run_cli("verify", tmp_path / "nope"), str(tmp_path / "nope"), "does not exist")
    proc = run_cli("verify", root / "step_00000010", tmp_path / "nope")
    assert_error(proc, "does not exist", "1 of 2 checkpoints failed")
    assert proc.stdout.startswith("OK: ")
    (tmp_path / "empty").mkdir()
    assert_error(run_cli("verify", "--all", tmp_path / "empty"), "no checkpoints under")
    assert_error(run_cli("verify", "--all", tmp_path / "nope"), "does not exist")


# -- usage, help, version, entry points --------------------------------------------------------
@pytest.mark.parametrize("args", [[], ["frobnicate"], ["ls"], ["inspect"], ["verify"],
                                  ["ls", "--bogus", "x"], ["verify", "--all"]])
def test_usage_errors_exit_2(args):
    proc = run_cli(*args)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "usage: uckpt" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("args", [["--help"], ["ls", "--help"], ["inspect", "--help"],
                                  ["verify", "--help"]])
def test_help(args):
    proc = run_cli(*args)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: uckpt")
    if args == ["--help"]:
        for command in ("ls", "inspect", "verify"):
            assert command in proc.stdout


def test_version():
    proc = run_cli("--version")
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"uckpt {uckpt.__version__}"


def test_console_script_and_python_m_package(root):
    script = Path(sys.executable).parent / "uckpt"
    if not script.exists():
        pytest.skip("the uckpt console script is not installed next to this Python")
    proc = subprocess.run([str(script), "verify", root / "step_00000010"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("OK: "), proc.stderr
    proc = subprocess.run([sys.executable, "-m", "uckpt.cli", "ls", root],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "committed" in proc.stdout, proc.stderr
