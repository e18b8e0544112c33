"""``uckpt diff A B``: two checkpoints of any formats compared leaf by leaf (issue 6, item 6)."""
import json
import math

import ml_dtypes
import numpy as np
import pytest

import uckpt
from convert_common import assert_error, cli
from uckpt.conversion import convert, diff

pytestmark = pytest.mark.filterwarnings("ignore::uckpt.conversion.ConvertWarning")


def base():
    return {"model": {"w": np.arange(12, dtype=np.float32).reshape(3, 4),
                      "b": np.zeros(4, np.float32), "h": np.ones(3, ml_dtypes.bfloat16)},
            "lr": 0.1, "name": "run", "steps": np.arange(3), "gone": np.ones(2)}


@pytest.fixture
def pair(tmp_path):
    a = base()
    b = base()
    b["model"]["w"] = a["model"]["w"].copy()
    b["model"]["w"][1, 2] += 0.5
    b["model"]["w"][2, 3] = np.nan
    b["model"]["b"] = np.zeros(4, np.float64)
    b["model"]["h"] = a["model"]["h"].copy()
    b["model"]["h"][0] = 3
    b["steps"] = np.arange(4)
    b["lr"] = 0.01
    del b["gone"]
    b["new"] = [1, 2]
    uckpt.save(tmp_path / "a", a)
    convert(tmp_path / "a", tmp_path / "a.safetensors")
    uckpt.save(tmp_path / "b", b)
    convert(tmp_path / "b", tmp_path / "b.npz")
    return tmp_path / "a.safetensors", tmp_path / "b.npz"


def test_identical_across_formats(tmp_path):
    uckpt.save(tmp_path / "a", base())
    convert(tmp_path / "a", tmp_path / "a.h5")
    convert(tmp_path / "a.h5", tmp_path / "a.pt")
    proc = cli("diff", tmp_path / "a", tmp_path / "a.pt")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "identical: 7 entries compared"


def test_differences_are_listed(pair):
    a, b = pair
    proc = cli("diff", a, b)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    assert "values differ: model/w  max abs diff nan (2 of 12 elements)" in lines
    assert "dtype differs: model/b  float32 vs float64" in lines
    assert "values differ: model/h  max abs diff 2 (1 of 3 elements)" in lines
    assert "shape differs: steps  (3,) vs (4,)" in lines
    assert "value differs: lr  0.1 vs 0.01" in lines
    assert "only in A: gone  float64 (2,)" in lines
    assert "only in B: new/0  1" in lines and "only in B: new/1  2" in lines
    assert lines[-1] == "8 difference(s); 6 entries in both"


def test_max_abs_diff_without_nan(tmp_path):
    a = {"w": np.array([1.0, -2.0, 3.0]), "n": np.array([1, 2], np.uint64)}
    b = {"w": np.array([1.0, -2.25, 3.0]), "n": np.array([1, 2 ** 40], np.uint64)}
    uckpt.save(tmp_path / "a", a)
    uckpt.save(tmp_path / "b", b)
    report = diff(tmp_path / "a", tmp_path / "b")
    got = {d.path: (d.max_abs_diff, d.differing) for d in report.differences}
    assert got == {"w": (0.25, 1), "n": (float(2 ** 40 - 2), 1)}


def test_bits_not_values_decide(tmp_path):
    """-0.0 and 0.0 compare equal as numbers but differ in bits: listed, with difference 0."""
    uckpt.save(tmp_path / "a", {"z": np.array([0.0])})
    uckpt.save(tmp_path / "b", {"z": np.array([-0.0])})
    (d,) = diff(tmp_path / "a", tmp_path / "b").differences
    assert (d.kind, d.max_abs_diff, d.differing) == ("values", 0.0, 1)
    uckpt.save(tmp_path / "c", {"z": np.array([0.0]), "f": math.nan})
    uckpt.save(tmp_path / "d", {"z": np.array([0.0]), "f": math.nan})
    assert diff(tmp_path / "c", tmp_path / "d").identical


def test_json(pair):
    a, b = pair
    proc = cli("diff", a, b, "--json")
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    assert (doc["a_format"], doc["b_format"], doc["identical"]) == ("safetensors", "npz", False)
    by_path = {d["path"]: d for d in doc["differences"]}
    assert by_path["model/w"] == {"path": "model/w", "kind": "values", "differing": 2,
                                  "size": 12, "max_abs_diff": "nan"}
    assert by_path["gone"]["kind"] == "only_a" and by_path["new/0"]["kind"] == "only_b"


def test_trouble_exits_2(tmp_path):
    uckpt.save(tmp_path / "a", {"x": np.ones(1)})
    assert_error(cli("diff", tmp_path / "a", tmp_path / "missing"), "does not exist", code=2)
    (tmp_path / "junk").write_bytes(b"junk")
    assert_error(cli("diff", tmp_path / "a", tmp_path / "junk"), "cannot tell the format",
                 code=2)
