"""The load contract of issue 29 (items 3 and 4) on plain arrays and mappings: a dtype
mismatch refused with a hint naming ``cast=``, ``cast=`` converting while reading (in
bounded memory), and ``strict=False`` loading what matches with a report of the keys it
skipped. The adapters' side: test_load_policy_torch / _chainer / _keras."""
import json
import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import uckpt
from uckpt.errors import DtypeMismatchError, KeyMismatchError, OptionsError
from conftest import REPO

BF16 = np.dtype(ml_dtypes.bfloat16)


def _saved(tmp_path, **kw):
    rng = np.random.default_rng(0)
    state = {"w": rng.standard_normal((64, 33)).astype(np.float32),
             "n": {"b": rng.standard_normal(100), "c": np.arange(7, dtype=np.int32),
                   "k": 3},
             "top": np.ones(4, np.float16)}
    path = uckpt.save(tmp_path / "ck", state, **kw)
    return path, state


def test_a_dtype_mismatch_is_refused_naming_the_leaf_both_dtypes_and_cast(tmp_path):
    path, _ = _saved(tmp_path)
    w = np.zeros((64, 33), BF16)
    with pytest.raises(DtypeMismatchError) as e:
        uckpt.load(path, {"w": w}, strict=False)
    msg = str(e.value)
    assert isinstance(e.value, ValueError)
    assert "'w'" in msg and "float32" in msg and "bfloat16" in msg
    assert "cast={'w': 'bfloat16'}" in msg  # the hint names a remedy that works (below)
    assert not w.any()  # refused before anything was read
    uckpt.load(path, {"w": w}, strict=False, cast={"w": "bfloat16"})
    assert w.any()


@pytest.mark.parametrize("kw", [{}, {"compression": "zstd"},
                                {"options": uckpt.SaveOptions(chunk_bytes=4096)}],
                         ids=["raw", "zstd", "chunked"])
def test_cast_to_a_named_dtype_converts_into_the_destination(tmp_path, kw):
    """float32 -> bfloat16 (a narrowing: the dtype is named) and float64 -> float32, read
    into the caller's arrays, raw, compressed and in many chunks."""
    path, state = _saved(tmp_path, **kw)
    w, b = np.zeros((64, 33), BF16), np.zeros(100, np.float32)
    got = uckpt.load(path, {"w": w, "n": {"b": b, "c": np.zeros(7, np.int32), "k": 0}},
                     strict=False, cast={"w": "bfloat16", "n/*": np.float32})
    assert got["w"] is w and got["n"]["b"] is b
    assert np.array_equal(w, state["w"].astype(BF16))
    assert np.array_equal(b, state["n"]["b"].astype(np.float32))


def test_cast_into_a_shard_box_of_another_dtype(tmp_path):
    path, state = _saved(tmp_path, options=uckpt.SaveOptions(chunk_bytes=1024))
    box = np.zeros((20, 33), np.float64)
    uckpt.load(path, {"w": uckpt.Shard(box, (64, 33), (10, 0))}, strict=False, cast="safe")
    assert np.array_equal(box, state["w"][10:30].astype(np.float64))


def test_a_rule_widens_and_never_narrows(tmp_path):
    path, state = _saved(tmp_path)
    top = np.zeros(4, np.float32)  # float16 -> float32: safe
    uckpt.load(path, {"top": top}, strict=False, cast="safe")
    assert np.array_equal(top, np.ones(4, np.float32))
    b = np.zeros(100, np.float32)  # float64 -> float32: NumPy's same_kind allows it
    with pytest.raises(DtypeMismatchError) as e:
        uckpt.load(path, {"n": {"b": b, "c": state["n"]["c"], "k": 0}}, strict=False,
                   cast="same_kind")
    assert "'n/b'" in str(e.value) and "narrows" in str(e.value)
    assert "cast={'n/b': 'float32'}" in str(e.value)
    assert not b.any()


def test_a_named_dtype_does_not_change_the_kind_of_number(tmp_path):
    path, _ = _saved(tmp_path)
    with pytest.raises(DtypeMismatchError, match=r"'w'.*float32.*int32(.|\n)*kind of number"):
        uckpt.load(path, {"w": np.zeros((64, 33), np.int32)}, strict=False, cast={"*": "int32"})
    with pytest.raises(DtypeMismatchError, match="cast= names float16 for it"):
        uckpt.load(path, {"w": np.zeros((64, 33), BF16)}, strict=False, cast={"w": "float16"})


def test_cast_without_state_returns_the_named_dtypes(tmp_path):
    path, state = _saved(tmp_path)
    got = uckpt.load(path, cast={"w": "bfloat16", "n/b": "safe"})
    assert got["w"].dtype == BF16 and np.array_equal(got["w"], state["w"].astype(BF16))
    assert got["n"]["b"].dtype == np.float64 and got["top"].dtype == np.float16


@pytest.mark.parametrize("cast, words", [
    ("unsafe", "'unsafe' casts are not taken"), ({"w": "float128x"}, "neither a casting rule"),
    (3, "not a int"), ({"": "safe"}, "non-empty string")])
def test_bad_cast_arguments_are_refused(tmp_path, cast, words):
    path, _ = _saved(tmp_path)
    with pytest.raises(OptionsError, match=words) as e:
        uckpt.load(path, {"w": np.zeros((64, 33), np.float32)}, strict=False, cast=cast)
    assert isinstance(e.value, ValueError)


def test_strict_false_loads_what_matches_and_reports_the_rest(tmp_path):
    """Keys on one side only, at every depth: the others are loaded, the report names
    them as leaf paths; missing entries are left as they were, unexpected ones unread."""
    path, state = _saved(tmp_path)
    w, b, extra = np.zeros((64, 33), np.float32), np.zeros(100), np.full(3, 7.0)
    report = uckpt.LoadReport(["stale"], [])
    got = uckpt.load(path, {"w": w, "n": {"b": b, "extra": extra}, "gone": 1},
                     strict=False, report=report)
    assert report == uckpt.LoadReport(missing_keys=["gone", "n/extra"],
                                      unexpected_keys=["n/c", "n/k", "top"])
    assert np.array_equal(w, state["w"]) and np.array_equal(b, state["n"]["b"])
    assert np.array_equal(extra, np.full(3, 7.0))
    assert set(got) == {"w", "n"} and set(got["n"]) == {"b"}


def test_strict_names_the_keys_and_points_at_strict_false(tmp_path):
    path, _ = _saved(tmp_path)
    with pytest.raises(KeyMismatchError) as e:
        uckpt.load(path, {"w": np.zeros((64, 33), np.float32),
                          "n": {"b": np.zeros(100), "extra": 1, "c": 0, "k": 0}, "top": 0})
    assert e.value.missing == ["extra"] and e.value.unexpected == []
    assert "strict=False" in str(e.value) and "'n'" in str(e.value)


def test_manager_restore_takes_cast_strict_and_report(tmp_path):
    manager = uckpt.CheckpointManager(tmp_path / "root")
    manager.save(1, {"w": np.arange(6, dtype=np.float32), "x": np.ones(2)})
    manager.wait()
    w, report = np.zeros(6, BF16), uckpt.LoadReport()
    with pytest.raises(DtypeMismatchError, match="cast="):
        manager.restore({"w": w, "y": 1}, strict=False, report=report)
    assert manager.restore({"w": w, "y": 1}, strict=False, report=report,
                           cast={"w": "bfloat16"}) == 1
    assert np.array_equal(w, np.arange(6).astype(BF16))
    assert report.missing_keys == ["y"] and report.unexpected_keys == ["x"]
    manager.close()


_PEAK = r"""
import json, sys
import ml_dtypes, numpy as np, uckpt

def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024

dest = np.ones(int(sys.argv[2]), ml_dtypes.bfloat16)  # touched: resident before the load
open("/proc/self/clear_refs", "w").write("5")
before = status("VmRSS")
uckpt.load(sys.argv[1], {"x": dest}, cast={"x": "bfloat16"})
print(json.dumps({"peak": status("VmHWM") - before,
                  "sum": float(dest[-1000:].astype(np.float64).sum())}))
"""


def test_a_cast_of_a_large_array_holds_a_block_not_a_copy(tmp_path):
    """128 MiB of float32 cast into a 64 MiB bfloat16 destination: the load adds read
    blocks (1 MiB each), not the 128 MiB of the array in its stored dtype."""
    n = 32 << 20
    x = (np.arange(n) % 200).astype(np.float32)  # (exact in bfloat16)
    path = uckpt.save(tmp_path / "big", {"x": x})
    del x
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(Path(uckpt.__file__).resolve().parent.parent), str(REPO / "adapters")]))
    r = subprocess.run([sys.executable, "-c", _PEAK, str(path), str(n)], capture_output=True,
                       text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["sum"] == float((np.arange(n - 1000, n) % 200).sum())
    assert got["peak"] < 32 << 20, got["peak"] >> 20
