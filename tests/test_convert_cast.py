"""``cast=`` of ``uckpt convert`` (issue 29, item 4): the leaves a pattern names a dtype
for converted while copied, by the API and the CLI; nothing narrowed unless named; a cast
across kinds of number refused before anything is written."""
import ml_dtypes
import numpy as np
import pytest

import uckpt
from convert_common import assert_ok, cli
from uckpt.cli.main import main
from uckpt.errors import DtypeMismatchError, OptionsError

BF16 = np.dtype(ml_dtypes.bfloat16)


def source(tmp_path):
    rng = np.random.default_rng(0)
    state = {"model": {"w": rng.standard_normal((300, 70)).astype(np.float32),
                       "b": rng.standard_normal(70).astype(np.float64)},
             "count": np.arange(5, dtype=np.int64), "lr": 0.5}
    uckpt.save(tmp_path / "src", state)
    return tmp_path / "src", state


def test_cast_converts_the_named_leaves_bit_for_bit_as_numpy_does(tmp_path):
    src, state = source(tmp_path)
    report = uckpt.convert(src, tmp_path / "out", cast={"model/w": "bfloat16",
                                                        "model/*": "float32", "*": "safe"})
    assert {n: d for n, d, _, _ in report.arrays} == \
        {"model/w": "bfloat16", "model/b": "float32", "count": "int64"}
    got = uckpt.load(tmp_path / "out")
    assert got["model"]["w"].dtype == BF16
    assert got["model"]["w"].tobytes() == state["model"]["w"].astype(BF16).tobytes()
    assert got["model"]["b"].tobytes() == state["model"]["b"].astype(np.float32).tobytes()
    assert got["count"].tobytes() == state["count"].tobytes() and got["lr"] == 0.5


def test_a_rule_never_narrows_and_a_change_of_kind_is_refused(tmp_path):
    src, state = source(tmp_path)
    uckpt.convert(src, tmp_path / "same.npz", cast="same_kind")
    with np.load(tmp_path / "same.npz") as z:
        assert z["model/w"].dtype == np.float32 and z["model/b"].dtype == np.float64
    with pytest.raises(DtypeMismatchError, match="float32 -> int32 changes the kind") as e:
        uckpt.convert(src, tmp_path / "bad.npz", cast={"model/w": "int32"})
    assert "'model/w'" in str(e.value)
    assert not (tmp_path / "bad.npz").exists()
    with pytest.raises(OptionsError, match="'unsafe' casts are not taken by rule"):
        uckpt.convert(src, tmp_path / "bad.npz", cast="unsafe")


def test_cli_cast_pattern_equals_dtype(tmp_path, capsys):
    src, state = source(tmp_path)
    assert_ok(cli("convert", src, tmp_path / "half.npz", "-q", "--cast", "model/*=float16",
                  "--cast", "same_kind"))
    with np.load(tmp_path / "half.npz") as z:
        assert z["model/w"].tobytes() == state["model"]["w"].astype(np.float16).tobytes()
        assert z["count"].dtype == np.int64
    for cast, words in (("model/*=int8", "float32 -> int8 changes the kind of number"),
                        ("model/*=", "--cast 'model/*=' is not PATTERN=DTYPE")):
        assert main(["convert", str(src), str(tmp_path / "bad.npz"), "--cast", cast]) == 1
        err = capsys.readouterr().err
        assert "uckpt: error: " in err and words in err, err
    assert not (tmp_path / "bad.npz").exists()
