"""scripts/test.sh's ``-n 2 --dist loadgroup``: the tests of an ``xdist_group`` run on one
worker, so a module-scoped launch (tests/test_horovod_tf.py's 4 TensorFlow ranks) is
made once, not once per worker (tests/xdist_groups.py)."""
import json
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

GROUPED = '''
import json, os, pytest
pytestmark = pytest.mark.xdist_group("launch")

@pytest.fixture(scope="module")
def launch():
    with open(os.environ["MADE"], "a") as f:
        f.write(json.dumps(os.environ.get("PYTEST_XDIST_WORKER")) + "\\n")

@pytest.mark.parametrize("name", ["fit", "tape"])
def test_first(launch, name):
    pass

def test_second(launch):
    pass
'''
OTHER = '''
import pytest

@pytest.mark.parametrize("i", range(8))
def test_other(i):
    pass
'''


def test_a_grouped_modules_fixture_is_made_once_on_one_worker(tmp_path):
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    (tmp_path / "test_other.py").write_text(OTHER)
    made = tmp_path / "made.jsonl"
    outer = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}  # a worker's
    env = {**outer, "MADE": str(made),
           "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    # the project's conftest as a plugin: its plugins, xdist_groups among them
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p",
                          "no:cacheprovider", "-n", "2", "--dist", "loadgroup", "-rA",
                          str(tmp_path)], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "11 passed" in run.stdout, run.stdout[-3000:]
    workers = [json.loads(line) for line in made.read_text().splitlines()]
    assert len(workers) == 1 and workers[0] in ("gw0", "gw1"), workers
