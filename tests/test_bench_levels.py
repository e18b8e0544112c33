"""benchmarks/bench_levels.py at a tiny size, so that the script does not rot: 4 MPI ranks
as 4 simulated nodes, the memory level with and without redundancy, a node-local disk,
a durable directory and (where SeaweedFS is installed) S3; one timed round, no warm-up.

The script itself fails where a restore is not bit for bit; this checks that every row it
promises is there and that each scheme's memory per node is what the scheme says.
"""
import json
import re
import shutil
import uuid
from pathlib import Path

import pytest

from multiproc import HAVE_MPI, PYTHON, run_command

pytestmark = [pytest.mark.xdist_group("distributed"),
              pytest.mark.skipif(not HAVE_MPI, reason="no mpiexec")]

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_levels.py"


def have_s3() -> bool:
    from s3_server import find_weed
    try:
        import boto3  # noqa: F401
    except ImportError:
        return False
    return find_weed() is not None


@pytest.fixture
def shm_parent():
    """A directory of the test's own under /dev/shm for the script's memory areas."""
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm on this system")
    d = Path("/dev/shm") / f"uckpt-test-{uuid.uuid4().hex[:12]}"
    d.mkdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_bench_levels_smoke(tmp_path, shm_parent):
    s3 = have_s3()
    run = run_command([PYTHON, SCRIPT, "--sizes", "tiny", "--nodes", "4", "--repeat", "1",
                       "--warmup", "0", "--schemes", "partner,xor:4", "--scheme-levels",
                       "memory", "--dir", tmp_path, "--shm-dir", shm_parent,
                       "--results-dir", tmp_path / "results", *([] if s3 else ["--no-s3"])],
                      timeout=240)
    assert run.returncodes == [0], run.stderr[-4000:]
    out = json.loads((tmp_path / "results" / "levels.json").read_text())
    (res,) = out["results"]
    assert (res["size"], res["nodes"], res["ranks"]) == ("tiny", 4, 4)
    rows = {(s["level"], s["scheme"]): s for s in res["summary"]}
    want = {("memory", "none"), ("disk", "none"), ("memory", "partner"), ("memory", "xor:4"),
            ("durable disk", "none")} | ({("S3", "none")} if s3 else set())
    assert set(rows) == want
    for s in rows.values():
        assert s["rounds"] == 1 and s["stall"] > 0 and s["background"] > 0 and s["load"] > 0
        assert len(s["load1"]) == 1
    for scheme, predicted in (("partner", 2.0), ("xor:4", 4 / 3)):
        s = rows[("memory", scheme)]
        assert s["memory_predicted"] == pytest.approx(predicted)
        # the pieces are exactly 1 or 1/(g - 1) share; the manifest every node holds
        # (in both counts) keeps the ratio a little below the prediction
        assert predicted - 0.15 < s["memory_ratio"] <= predicted + 1e-9, s
        assert s["rebuild"] > 0 or s["wired"], s  # node 1 was lost and rebuilt
    assert not list(shm_parent.iterdir())  # the script removed its memory areas
    text = (tmp_path / "results" / "levels.md").read_text()
    assert "1-minute load average during the run" in text
    assert re.search(r"\|\s*memory\s*\|\s*xor:4\s*\|", text)
