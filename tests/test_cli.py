"""The ``uckpt`` command, run as a user runs it: a subprocess, exit codes, stdout and stderr."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import uckpt
from uckpt.format import FORMAT_VERSION
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


# -- ls with several roots (storage tiers) -----------------------------------------------------
@pytest.fixture
def tiers(tmp_path):
    """Two tiers saved by two managers: fast holds 20, 30, 40; durable holds 10, 20, 30 (30
    damaged) and is copying 40 (a temp dir). Returns (fast, durable)."""
    fast, durable = tmp_path / "fast", tmp_path / "durable"
    for root, steps in ((fast, (20, 30, 40)), (durable, (10, 20, 30))):
        with uckpt.CheckpointManager(root) as mgr:
            for step in steps:
                mgr.save(step, {"w": np.full(5, step, dtype=np.float32), "step": step})
    os.truncate(durable / "step_00000030" / "data-00000.bin", 3)
    tmp = durable / ".step_00000040.uckpt-tmp-1a2b3c4d"
    tmp.mkdir()
    (tmp / "data-00000.bin").write_bytes(b"\0" * 7)
    return fast, durable


def manifest_size(ckpt):
    """Bytes of all files of a checkpoint directory."""
    return sum(f.stat().st_size for f in ckpt.iterdir())


def tier_table(stdout):
    """(legend lines, header fields, {step: row line}) of a multi-root ``ls``."""
    legend, rest = stdout.split("\n\n", 1)
    lines = rest.strip().splitlines()
    return legend.splitlines(), lines[0].split(), {line.split()[0]: line for line in lines[1:]}


def test_ls_tiers_table(tiers):
    fast, durable = tiers
    proc = run_cli("ls", "--tier-names", "fast,durable", fast, durable)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    legend, header, rows = tier_table(proc.stdout)
    assert legend == [f"fast ({fast}): 3 committed",
                      f"durable ({durable}): 2 committed, 1 damaged, 1 incomplete"]
    assert header == ["STEP", "TIERS", "STATUS", "SIZE", "LEAVES", "CREATED", "NAME", "NOTE"]
    assert list(rows) == ["10", "20", "30", "40"]  # one row per step, merged across tiers
    assert rows["10"].split()[1:4] == ["durable", "committed", "on"]
    assert rows["20"].split()[1:3] == ["fast,durable", "committed"]
    assert rows["20"].split()[3:5] == [str(manifest_size(fast / "step_00000020")), "B"]
    assert rows["30"].split()[1] == "fast"
    assert "committed on fast; damaged on durable" in rows["30"]
    assert "durable: data file data-00000.bin is truncated" in rows["30"]
    assert rows["40"].split()[1] == "fast"
    assert "committed on fast; incomplete on durable" in rows["40"]
    assert "step_00000040,.step_00000040.uckpt-tmp-1a2b3c4d" in rows["40"]

    proc = run_cli("ls", fast, durable)  # default labels
    legend, _, rows = tier_table(proc.stdout)
    assert [line.split(" (")[0] for line in legend] == ["tier0", "tier1"]
    assert rows["20"].split()[1:3] == ["tier0,tier1", "committed"]
    assert "committed on tier0; damaged on tier1" in rows["30"]


def test_ls_tiers_json(tiers):
    fast, durable = tiers
    proc = run_cli("ls", "--json", "--tier-names", "fast,durable", fast, durable)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["tiers"] == [
        {"tier": "fast", "root": str(fast), "path": str(fast.absolute()), "missing": False},
        {"tier": "durable", "root": str(durable), "path": str(durable.absolute()),
         "missing": False}]
    steps = {s["step"]: s for s in doc["steps"]}
    assert [s["step"] for s in doc["steps"]] == [10, 20, 30, 40]
    assert {k: s["committed_on"] for k, s in steps.items()} == {
        10: ["durable"], 20: ["fast", "durable"], 30: ["fast"], 40: ["fast"]}
    entries = {k: [(e["tier"], e["status"]) for e in s["entries"]] for k, s in steps.items()}
    assert entries == {10: [("durable", "committed")],
                       20: [("fast", "committed"), ("durable", "committed")],
                       30: [("fast", "committed"), ("durable", "damaged")],
                       40: [("fast", "committed"), ("durable", "incomplete")]}
    f20, d20 = steps[20]["entries"]
    assert Path(f20["path"]) == (fast / "step_00000020").absolute()
    assert Path(d20["path"]) == (durable / "step_00000020").absolute()
    assert f20["size"] == manifest_size(fast / "step_00000020") and f20["reason"] is None
    assert f20["leaves"] == 1 and f20["nbytes"] == uckpt.manifest(fast / "step_00000020").nbytes
    damaged = steps[30]["entries"][1]
    assert "data-00000.bin is truncated: 3 of" in damaged["reason"]
    temp = steps[40]["entries"][1]
    assert temp["name"] == ".step_00000040.uckpt-tmp-1a2b3c4d" and temp["size"] == 7
    assert temp["leaves"] is None and "temporary directory" in temp["reason"]


def test_ls_tiers_missing(tiers, tmp_path):
    fast, durable = tiers
    lost = tmp_path / "shm" / "job"  # the node-local tier of a lost node
    proc = run_cli("ls", "--tier-names", "fast,durable", lost, durable)
    assert proc.returncode == 0, proc.stderr
    legend, _, rows = tier_table(proc.stdout)
    assert legend[0] == f"fast ({lost}): missing"
    assert list(rows) == ["10", "20", "30", "40"]
    assert rows["20"].split()[1:3] == ["durable", "committed"]  # all present tiers hold it
    assert rows["30"].split()[1:3] == ["-", "damaged"]
    doc = json.loads(run_cli("ls", "--json", lost, durable).stdout)
    assert [t["missing"] for t in doc["tiers"]] == [True, False]
    assert {e["tier"] for s in doc["steps"] for e in s["entries"]} == {"tier1"}

    proc = run_cli("ls", "--tier-names", "fast,durable", lost, tmp_path / "nowhere")
    assert_error(proc, "none of the tier roots exists", f"fast ({lost})",
                 f"durable ({tmp_path / 'nowhere'})")
    assert proc.stdout == ""
    assert_error(run_cli("ls", "--json", lost, tmp_path / "nowhere"), "tier0", "tier1")


def test_ls_tiers_empty_and_single(tiers, tmp_path):
    fast, _ = tiers
    (tmp_path / "empty").mkdir()
    proc = run_cli("ls", tmp_path / "empty", tmp_path / "gone")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"tier0 ({tmp_path / 'empty'}): empty",
                                        f"tier1 ({tmp_path / 'gone'}): missing", "",
                                        "no checkpoints in any tier"]
    proc = run_cli("ls", "--tier-names", "fast", fast)  # one root, listed as a tier
    legend, header, rows = tier_table(proc.stdout)
    assert legend == [f"fast ({fast}): 3 committed"] and "TIERS" in header
    assert [row.split()[1:3] for row in rows.values()] == [["fast", "committed"]] * 3


def test_ls_tiers_usage_errors(tiers):
    fast, durable = tiers
    for args in (["--tier-names", "fast", fast, durable],
                 ["--tier-names", "a,b,c", fast, durable],
                 ["--tier-names", "a,a", fast, durable],
                 ["--tier-names", "a,", fast, durable],
                 [fast, fast.parent / "." / "fast"]):  # the same tier twice
        proc = run_cli("ls", *args)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert "usage: uckpt ls" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_cli("ls", fast, durable / "step_00000010" / "manifest.json")
    assert_error(proc, "is a file")  # a wrong path is an error, not a missing tier


def test_ls_tiers_do_not_touch_the_roots(tiers):
    before = [sorted(p.name for p in root.iterdir()) for root in tiers]
    run_cli("ls", *tiers)
    run_cli("ls", "--json", *tiers)
    assert [sorted(p.name for p in root.iterdir()) for root in tiers] == before


# -- inspect ---------------------------------------------------------------------------------
def test_inspect_text(root):
    ckpt = root / "step_00000020"
    proc = run_cli("inspect", ckpt)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"format       uckpt v{FORMAT_VERSION}" in out
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
    assert leaves["emb/table"][-3:] == ["1", "raw", "1.000"]  # chunks, codec, ratio
    assert "blob" in leaves and "(bytes)" in leaves["blob"]
    assert "emb/tied" not in leaves  # stored once


def test_inspect_json(root):
    big = np.arange(1000, dtype=np.float32)
    ckpt = uckpt.save(root.parent / "big", {"big": big, "opt": {"step": 5}}, step=99,
                      metadata={"k": [1, 2]},
                      options=uckpt.SaveOptions(chunk_bytes=64))  # big: several chunks
    proc = run_cli("inspect", "--json", ckpt)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    man = uckpt.manifest(ckpt)
    assert doc["format"] == "uckpt" and doc["format_version"] == FORMAT_VERSION
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
    if args == ["ls", "--help"]:
        assert "ROOT [ROOT ...]" in proc.stdout and "--tier-names" in proc.stdout
        assert "Storage tiers: given several ROOTs" in proc.stdout


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
