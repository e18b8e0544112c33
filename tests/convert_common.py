"""Helpers of the ``uckpt convert`` / ``uckpt diff`` tests: running the command as a user does,
several at once, and a state that holds every kind of leaf."""
import math
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Sequence

import ml_dtypes
import numpy as np

EXT = {"npz": ".npz", "pickle": ".pt", "hdf5": ".h5", "safetensors": ".safetensors", "uckpt": ""}
TARGETS = tuple(EXT)


def cli(*args, env=None, timeout=180, **kw) -> subprocess.CompletedProcess:
    """``python -m uckpt.cli.main ARGS`` as a user runs ``uckpt``."""
    return subprocess.run([sys.executable, "-m", "uckpt.cli.main", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, PYTHONWARNINGS="ignore", **(env or {})), **kw)


def cli_without(modules: Sequence[str], *args, timeout=120) -> subprocess.CompletedProcess:
    """``uckpt ARGS`` in a process where ``modules`` cannot be imported (``sys.modules[m] =
    None``: a real ImportError at their import)."""
    code = ("import runpy, sys; sys.modules.update(dict.fromkeys(sys.argv[1].split(','))); "
            "sys.argv = ['uckpt'] + sys.argv[2:]; "
            "runpy.run_module('uckpt.cli.main', run_name='__main__')")
    return subprocess.run([sys.executable, "-c", code, ",".join(modules), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, PYTHONWARNINGS="ignore"))


def cli_many(commands: Sequence[Sequence]) -> List[subprocess.CompletedProcess]:
    """Run several ``uckpt`` commands at once (they are independent); results in order."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(lambda args: cli(*args), commands))


def assert_ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, (proc.args, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr


def assert_error(proc: subprocess.CompletedProcess, *fragments, code: int = 1) -> None:
    """Exit ``code`` with ``uckpt: error:`` naming every fragment, and no traceback."""
    assert proc.returncode == code, (proc.args, proc.stdout, proc.stderr)
    assert "uckpt: error: " in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    for f in fragments:
        assert f in proc.stderr, (f, proc.stderr)


def target(directory: Path, stem: str, fmt: str) -> Path:
    return directory / (stem + EXT[fmt])


def leftovers(directory: Path) -> List[str]:
    """Temporary files or directories left by an interrupted write."""
    return [p.name for p in directory.iterdir() if ".uckpt-tmp-" in p.name]


def rich_state() -> Dict:
    """Every dtype, 0-d and empty arrays, NumPy scalars, bytes, None, non-finite floats, huge
    ints, int keys, lists, tuples, empty containers, odd keys and a tied array."""
    rng = np.random.default_rng(7)
    arrays = {"bool": rng.integers(0, 2, (3, 4)).astype(bool)}
    for name in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                 "float16", "float32", "float64", "complex64", "complex128", "bfloat16",
                 "float8_e4m3fn", "float8_e5m2"):  # random bits: NaN payloads, subnormals, -0
        dt = np.dtype(getattr(ml_dtypes, name, None) or name)
        arrays[name] = np.frombuffer(rng.bytes(12 * dt.itemsize), dtype=dt).reshape(3, 4)
    weight = rng.standard_normal((4, 3)).astype(np.float32)
    return {
        "dtypes": arrays,
        "model": {"weight": weight, "bias": np.zeros(3, np.float32), "scalar": np.array(2.5)},
        "tied": weight,
        "optimizer": {"state": {0: {"step": np.float32(3.0), "exp_avg": np.ones(3)},
                                5: {"step": np.int64(7)}},
                      "param_groups": [{"lr": 0.1, "betas": (0.9, 0.999), "params": [0, 5],
                                        "nesterov": False, "foreach": None, "name": "héllo ✓"}]},
        "empty": {"array": np.zeros((0, 3), np.int16), "dict": {}, "list": [], "tuple": ()},
        "floats": [math.inf, -math.inf, math.nan, -0.0, 5e-324],
        "big": 2 ** 70, "blob": b"\x00\xffbytes", "nothing": None,
        "weird/key~name": {"a/b": np.arange(3, dtype=np.int8)},
    }
