"""benchmarks/bench_jax.py at a tiny size, so that the script does not rot: uckpt and
Orbax on a state sharded over 4 CPU devices, one warm-up and one timed round.

The script loads every checkpoint it writes back into ShapeDtypeStructs carrying the
source's shardings and compares each array bit for bit; this checks that every method
has every row, and that each compared every array of every checkpoint it wrote.
"""
import json
import os
from pathlib import Path

import pytest

from multiproc import PYTHON, run_command

pytest.importorskip("jax")
pytest.importorskip("orbax.checkpoint")

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "bench_jax.py"


def test_bench_jax_smoke(tmp_path):
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "adapters"),
                                          os.environ.get("PYTHONPATH", "")]),
           "JAX_PLATFORMS": "cpu"}
    run = run_command([PYTHON, SCRIPT, "--quick", "--sizes", "tiny", "--devices", "4",
                       "--dir", tmp_path, "--results-dir", tmp_path / "results"],
                      timeout=300, env=env)
    assert run.returncodes == [0], run.stderr[-4000:]
    out = json.loads((tmp_path / "results" / "jax_tiny_4dev.json").read_text())
    assert (out["size"], out["devices"], out["repeat"]) == ("tiny", 4, 1)
    n = out["state"]["n_arrays"]
    by = {r["method"]: r for r in out["results"]}
    assert set(by) == {"uckpt", "uckpt_mgr", "orbax_std", "orbax_mgr"}
    for name, r in by.items():
        assert r["error"] is None, (name, r["error_trace"])
        assert set(r["rows"]) == {"sync save", "load", "async stall", "async durable"}
        for row, t in r["rows"].items():
            assert len(t["seconds"]) == 1 and t["median"] > 0, (name, row)
        # warm-up and timed round, a sync and an async checkpoint each, all arrays equal
        assert r["verified_arrays"] == 4 * n, name
        assert r["disk_bytes"] > 0
    md = (tmp_path / "results" / "jax_tiny_4dev.md").read_text()
    for row in ("sync save", "load", "async stall", "async durable"):
        assert f"| {row} " in md
    # the working directory (checkpoints of every method) is removed; only results stay
    assert [p.name for p in tmp_path.iterdir()] == ["results"]
