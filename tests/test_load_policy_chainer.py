"""Issue 29's dtype policy and ``strict=False`` report with real Chainer links (Chainer has
no bfloat16: float32 <-> float16 and float64 here)."""
import numpy as np
import pytest

import uckpt
import uckpt_chainer  # noqa: F401  (before chainer: the NumPy 2 shim)
from uckpt.errors import DtypeMismatchError, KeyMismatchError

chainer = pytest.importorskip("chainer")
import chainer.links as L  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:pkg_resources is deprecated")


class Net(chainer.Chain):
    def __init__(self, head=False):
        super().__init__()
        with self.init_scope():
            self.fc = L.Linear(4, 3)
            self.bn = L.BatchNormalization(3)
            if head:
                self.head = L.Linear(3, 2)


def _net(dtype=np.float32, head=False, seed=0):
    np.random.seed(seed)
    with chainer.using_config("dtype", dtype):
        return Net(head)


def _arrays(link):
    return {path: np.array(p.array) for path, p in link.namedparams()}


def test_float32_into_a_float16_link_is_refused_without_cast_and_converted_with_it(tmp_path):
    full = _net()
    path = uckpt.save(tmp_path / "ck", {"model": full})
    half = _net(np.float16, seed=1)
    assert half.fc.W.dtype == np.float16
    before = _arrays(half)
    with pytest.raises(DtypeMismatchError) as e:
        uckpt.load(path, {"model": half})
    assert "fc/W: dtype float32 in the checkpoint, float16 in the object" in str(e.value)
    assert "cast={'model/" in str(e.value)
    assert all(np.array_equal(v, before[k]) for k, v in _arrays(half).items())
    w = half.fc.W.array
    uckpt.load(path, {"model": half}, cast={"model/*": "float16"})
    assert half.fc.W.array is w  # converted into the parameter's own array
    for k, v in _arrays(half).items():
        assert v.dtype == np.float16 and np.array_equal(v, _arrays(full)[k].astype(np.float16))


def test_float16_into_a_float64_link_with_a_safe_rule(tmp_path):
    half = _net(np.float16)
    path = uckpt.save(tmp_path / "ck", {"model": half})
    double = _net(np.float64, seed=2)
    uckpt.load(path, {"model": double}, cast="safe")
    for k, v in _arrays(double).items():
        assert v.dtype == np.float64 and np.array_equal(v, _arrays(half)[k].astype(np.float64))


def test_strict_false_loads_the_shared_links_and_reports_the_rest(tmp_path):
    old = _net(head=True)
    path = uckpt.save(tmp_path / "ck", {"model": old})
    new = _net(seed=5)
    report = uckpt.LoadReport()
    uckpt.load(path, {"model": new}, strict=False, report=report)
    assert report.missing_keys == []
    assert report.unexpected_keys == ["model/head/W", "model/head/b"]
    assert np.array_equal(new.fc.W.array, old.fc.W.array)
    assert np.array_equal(new.bn.avg_mean, old.bn.avg_mean)

    path2 = uckpt.save(tmp_path / "ck2", {"model": new})
    grown = _net(head=True, seed=7)
    head = grown.head.W.array.copy()
    uckpt.load(path2, {"model": grown}, strict=False, report=report)
    assert report.missing_keys == ["model/head/W", "model/head/b"]
    assert report.unexpected_keys == []
    assert np.array_equal(grown.fc.W.array, new.fc.W.array)
    assert np.array_equal(grown.head.W.array, head)
    with pytest.raises(KeyMismatchError) as e:
        uckpt.load(path2, {"model": _net(head=True)})
    assert e.value.missing == ["head/W", "head/b"]
