"""``uckpt inspect`` on a checkpoint whose manifest is split into parts (issue 27): the root
first, then the parts one at a time, only those that hold a shown array
(``--select``); a part that cannot be read is named after what the root gives is shown.

Checkpoints are saved by 4 thread ranks (:func:`uckpt.testing.run_ranks`): an FSDP-style
``model`` (rows of each array in every rank's part), per-rank arrays ``own/<rank>/w``
(each in its rank's part only), a replicated ``bias`` (in the root) and a plain value.
Which parts were read is the command's own INFO record.
"""
from __future__ import annotations

import json
import logging
import re

import numpy as np
import pytest

import uckpt
from uckpt.cli import inspect as inspect_cli
from uckpt.cli.main import main
from uckpt.loading import manifest_io
from uckpt.loading.reader import read_manifest
from uckpt.loading.stored_sizes import stored_sizes
from uckpt.storage import open_source
from uckpt.testing import run_ranks

from test_cli import assert_error, run_cli

WORLD, ROWS = 4, 48
FULL = {"w": np.arange(ROWS * 8, dtype=np.float32).reshape(ROWS, 8),
        "v": np.arange(ROWS * 3, dtype=np.int64).reshape(ROWS, 3) % 5}
PART = "manifest.part-{:05d}.json"


def state(rank):
    lo, hi = rank * ROWS // WORLD, (rank + 1) * ROWS // WORLD
    return {"model": {k: uckpt.Shard(a[lo:hi].copy(), a.shape, (lo, 0)) for k, a in FULL.items()},
            "own": uckpt.PerRank({"w": np.full((3, 4), rank, np.float32)}),
            "bias": np.linspace(0, 1, 5, dtype=np.float32), "step": 7}


@pytest.fixture
def ckpt(tmp_path):
    path = tmp_path / "c"
    for outcome in run_ranks(WORLD, lambda c: uckpt.save(path, state(c.rank), comm=c,
                                                         compression="zstd")):
        assert not isinstance(outcome, BaseException), outcome
    assert sorted(p.name for p in path.glob("manifest.part-*")) == \
        [PART.format(r) for r in range(WORLD)]
    return path


def inspect_in_process(capsys, caplog, *args):
    """``uckpt inspect ARGS`` in this process: (exit status, stdout, stderr, the number of
    manifest parts its INFO record says it read)."""
    with caplog.at_level(logging.INFO, logger="uckpt.loading.stored_sizes"):
        caplog.clear()
        rc = main(["inspect", *map(str, args)])
    out, err = capsys.readouterr()
    read = [int(m.group(1)) for r in caplog.records
            if (m := re.match(r"read (\d+) of 4 manifest part", r.getMessage()))]
    assert len(read) == 1, caplog.records
    return rc, out, err, read[0]


def test_inspect_of_a_split_manifest_is_that_of_the_whole_manifest(ckpt, capsys, caplog):
    whole = read_manifest(ckpt)  # every part read and attached (what inspect read before)
    w = whole.arrays["model/w"]
    assert len(w.chunks) == WORLD and {c.codec for c in w.chunks} == {("bytegroup", "zstd")}
    proc = run_cli("inspect", ckpt)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == inspect_cli.render(inspect_cli.describe(ckpt, whole)) + "\n"
    rc, out, _, read = inspect_in_process(capsys, caplog, "--json", ckpt)
    assert (rc, read) == (0, WORLD)
    assert json.loads(out) == json.loads(json.dumps(inspect_cli.describe(ckpt, whole)))
    leaves = {a["path"]: a for a in json.loads(out)["leaves"]}
    assert leaves["model/w"]["chunks"] == WORLD
    assert leaves["model/w"]["stored"] == sum(c.length for c in w.chunks) < w.nbytes
    assert leaves["model/w"]["codec"] == "bytegroup+zstd"
    assert (leaves["own/2/w"]["chunks"], leaves["bias"]["chunks"]) == (1, 1)


def test_parts_are_counted_one_at_a_time_and_none_is_kept(ckpt):
    with open_source(ckpt) as source:
        root = manifest_io.read_root(source)
        sizes = stored_sizes(source, root)
    assert sizes.parts_read == [PART.format(r) for r in range(WORLD)] and not sizes.errors
    assert root.parts_pending == list(range(WORLD))  # nothing attached to the manifest
    assert len(root.rows_read()) == 1  # the root's rows alone: each part's were dropped
    whole = read_manifest(ckpt)
    assert sizes.by_path["model/v"].stored == sum(c.length for c in whole.arrays["model/v"].chunks)


@pytest.mark.parametrize("select, parts, leaves", [
    ("own/2", 1, ["own/2/w"]),
    ("own/2/w", 1, ["own/2/w"]),
    ("bias", 0, ["bias"]),  # replicated: its rows are in the root
    ("model", WORLD, ["model/w", "model/v"]),
    ("step", 0, []),
    ("own/*/w", WORLD, [f"own/{r}/w" for r in range(WORLD)]),  # globs, as load's select=
    ("*/w", WORLD, ["model/w"] + [f"own/{r}/w" for r in range(WORLD)]),
    ("b?as", 0, ["bias"]),
])
def test_select_reads_only_the_parts_that_hold_its_arrays(ckpt, capsys, caplog, select,
                                                          parts, leaves):
    rc, out, _, read = inspect_in_process(capsys, caplog, "--json", "--select", select, ckpt)
    assert rc == 0 and read == parts
    doc = json.loads(out)
    whole = inspect_cli.describe(ckpt, read_manifest(ckpt))
    want = {a["path"]: a for a in whole["leaves"] if a["path"] in leaves}
    assert [a["path"] for a in doc["leaves"]] == leaves
    assert {a["path"]: a for a in doc["leaves"]} == want
    assert doc["nbytes"] == sum(a["nbytes"] for a in want.values())
    assert doc["stored"] == sum(a["stored"] for a in want.values())
    assert doc["select"] == select
    assert [v["path"] for v in doc["values"]] == (["step"] if select == "step" else [])


def test_several_select_patterns_show_what_any_picks(ckpt, capsys, caplog):
    rc, out, _, read = inspect_in_process(capsys, caplog, "--json", "--select", "model/v",
                                          "--select", "own/[13]/*", "--select", "st*", ckpt)
    doc = json.loads(out)
    assert rc == 0 and read == WORLD  # model/v has rows in every part
    assert [a["path"] for a in doc["leaves"]] == ["model/v", "own/1/w", "own/3/w"]
    assert doc["select"] == ["model/v", "own/[13]/*", "st*"]
    assert [v["path"] for v in doc["values"]] == ["step"]
    assert main(["inspect", "--select", "model/*", "--select", "mdl/*", str(ckpt)]) == 1
    assert "--select 'mdl/*': the checkpoint's state tree has no node there" in \
        capsys.readouterr().err


def test_select_of_no_node_is_refused(ckpt, capsys):
    assert main(["inspect", "--select", "model/x", str(ckpt)]) == 1
    err = capsys.readouterr().err
    assert "--select 'model/x': the checkpoint's state tree has no node there" in err
    assert "hint: run `uckpt inspect CKPT` (without --select)" in err


def test_a_damaged_part_is_named_after_what_the_root_gives(ckpt):
    part = ckpt / PART.format(1)
    data = bytearray(part.read_bytes())
    data[40] ^= 1
    part.write_bytes(bytes(data))
    with pytest.raises(uckpt.errors.CorruptCheckpointError) as loaded:
        uckpt.load(ckpt)
    proc = run_cli("inspect", ckpt)
    assert_error(proc, r"parts[1] (manifest.part-00001.json): the part holds",
                 "but the root lists")
    assert str(loaded.value).splitlines()[0] in proc.stderr  # the same words as load
    rows = {line.split()[0]: line.split() for line in proc.stdout.splitlines()
            if line.startswith("  ") and "(" in line}
    assert rows["own/1/w"][-3:] == ["-", "-", "-"]  # CHUNKS, CODEC, RATIO: in part 1
    assert rows["model/w"][-3:] == ["-", "-", "-"]
    assert rows["own/2/w"][-3:-1] == ["1", "bytegroup+zstd"]  # the other parts are read
    assert rows["bias"][-3] == "1" and rows["bias"][-1] != "-"  # from the root alone
    assert "world size   4" in proc.stdout and "step = 7" in proc.stdout
    assert "stored sizes unknown (a manifest part could not be read)" in proc.stdout
    ok = run_cli("inspect", "--select", "own/2", ckpt)  # a selection without it is whole
    assert ok.returncode == 0 and ok.stderr == "", ok.stderr


def test_a_missing_part_is_named(ckpt, capsys, caplog):
    before = {a["path"]: a for a in inspect_cli.describe(ckpt, read_manifest(ckpt))["leaves"]}
    (ckpt / PART.format(3)).unlink()
    rc, out, err, read = inspect_in_process(capsys, caplog, "--json", ckpt)
    assert (rc, read) == (1, WORLD - 1)
    assert "manifest.part-00003.json: the manifest part listed in the root manifest is " \
           "missing" in err
    leaves = {a["path"]: a for a in json.loads(out)["leaves"]}
    assert leaves["own/3/w"]["stored"] is None and leaves["model/v"]["codec"] is None
    assert leaves["own/0/w"] == before["own/0/w"] and leaves["bias"] == before["bias"]
