"""The NumPy 2 shim for Chainer 7.8.1 and the lazy imports of uckpt_chainer, each in a
fresh interpreter (the shim changes the numpy module of the process it runs in)."""
import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest

NUMPY2 = int(np.__version__.split(".")[0]) >= 2
needs_chainer = pytest.mark.skipif(importlib.util.find_spec("chainer") is None,
                                   reason="chainer is not installed")


def run(code: str) -> dict:
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_importing_uckpt_chainer_imports_no_framework_and_applies_the_shim():
    got = run("import sys, json, numpy as np, uckpt_chainer, uckpt_chainer.compat as c; "
              "print(json.dumps({'mods': sorted({'chainer', 'cupy'} & set(sys.modules)), "
              "'applied': c.applied, 'again': c.apply(), 'needed': c.needed(), "
              "'providers': len(uckpt_chainer.RNG_PROVIDERS), "
              "'sctypes': {k: [t.__name__ for t in v] for k, v in np.sctypes.items()}}))")
    assert got["mods"] == [] and got["again"] == [] and got["needed"] is False
    if NUMPY2:
        assert got["applied"] == ["sctypes", "float"]
    assert got["sctypes"] == {  # NumPy 1's table (Linux, x86-64)
        "int": ["int8", "int16", "int32", "int64"],
        "uint": ["uint8", "uint16", "uint32", "uint64"],
        "float": ["float16", "float32", "float64", "longdouble"],
        "complex": ["complex64", "complex128", "clongdouble"],
        "others": ["bool", "object", "bytes", "str", "void"]}
    if importlib.util.find_spec("cupy") is None:
        assert got["providers"] == 0  # the cupy RNG provider exists only where CuPy does


@needs_chainer
@pytest.mark.skipif(not NUMPY2, reason="NumPy 1 has everything Chainer needs")
def test_chainer_needs_the_shim_under_numpy_2():
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", "import chainer"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "np.sctypes" in proc.stderr


@needs_chainer
def test_chainer_works_after_the_shim_including_resize_images():
    got = run("import json, uckpt.chainer, chainer, numpy as np, chainer.functions as F; "
              "x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4); "
              "y = F.resize_images(x, (8, 8)); "  # uses numpy.float
              "s = F.as_strided(x.reshape(-1), (2, 2), (4, 4)); "  # uses numpy.sctypes
              "print(json.dumps({'shape': y.shape, 'version': chainer.__version__}))")
    assert got["shape"] == [1, 1, 8, 8]


@needs_chainer
def test_a_numpy_without_distutils_gets_a_stand_in():
    # NumPy 2 ships no numpy.distutils for Python >= 3.12; chainer imports it on import
    got = run("import sys, json; sys.modules['numpy.distutils'] = None; "
              "import uckpt_chainer.compat as c, chainer, numpy; "
              "print(json.dumps({'applied': c.applied, "
              "'info': numpy.distutils.system_info.get_info('blas_opt')}))")
    assert "distutils" in got["applied"] and got["info"] == {}


@needs_chainer
def test_random_state_with_chainer_imported_saves_no_cupy_state(tmp_path):
    got = run("import json, uckpt, uckpt.chainer, chainer, numpy as np; "
              f"uckpt.save({str(tmp_path / 'c')!r}, {{'rng': uckpt.RandomState()}}); "
              f"print(json.dumps(sorted(uckpt.load({str(tmp_path / 'c')!r})['rng'])))")
    assert "cupy" not in got and "numpy" in got
