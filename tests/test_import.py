"""Invariant 1: `import uckpt` imports no deep-learning framework."""
import json
import subprocess
import sys

FRAMEWORKS = ["torch", "tensorflow", "keras", "chainer", "jax", "cupy", "mpi4py", "horovod"]


def test_import_uckpt_pulls_in_no_framework():
    code = ("import sys, json, uckpt, uckpt.cli.main; "
            f"print(json.dumps(sorted(set({FRAMEWORKS!r}) & set(sys.modules))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_saving_numpy_state_imports_no_framework(tmp_path):
    code = ("import sys, json, numpy as np, uckpt; "
            f"uckpt.save({str(tmp_path / 'c')!r}, {{'a': np.ones(3), 'rng': uckpt.RandomState()}}); "
            f"uckpt.load({str(tmp_path / 'c')!r}); "
            f"print(json.dumps(sorted(set({FRAMEWORKS!r}) & set(sys.modules))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_import_uckpt_leaves_slow_standard_modules_for_first_use():
    """`import uckpt` stays fast: ``importlib.metadata`` (about 10-20 ms) is imported when
    adapters' entry points are first looked up, not before; and with crc32c-rs installed
    the ``crc32c`` package, which imports it, is not imported at all."""
    code = ("import sys, json, uckpt, uckpt.codecs.checksum; "
            "print(json.dumps(['importlib.metadata' in sys.modules, 'crc32c' in sys.modules, "
            "uckpt.codecs.checksum.BACKEND]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    metadata, reference, backend = json.loads(out.stdout.strip().splitlines()[-1])
    assert not metadata
    assert reference == (backend == "crc32c")
