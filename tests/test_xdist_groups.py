"""scripts/test.sh's ``-n 2 --dist loadgroup``: the tests of an ``xdist_group`` run on one
worker, so a module-scoped launch (tests/test_horovod_tf.py's 4 TensorFlow ranks) is
made once, not once per worker; modules with slow tests are handed out first, so the
workers end on quick ones (tests/xdist_groups.py)."""
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
import os, pytest

@pytest.mark.parametrize("i", range(8))
def test_other(i):
    with open(os.environ["ORDER"], "a") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"] + " other\\n")
'''
SLOW = '''
import os, pytest
pytestmark = pytest.mark.slow  # last by name: handed out before test_other.py all the same

@pytest.mark.parametrize("i", range(2))
def test_slow(i):
    with open(os.environ["ORDER"], "a") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"] + " slow\\n")
'''


def test_a_grouped_modules_fixture_is_made_once_on_one_worker(tmp_path):
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    (tmp_path / "test_other.py").write_text(OTHER)
    (tmp_path / "test_zslow.py").write_text(SLOW)
    made, order = tmp_path / "made.jsonl", tmp_path / "order.txt"
    outer = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}  # a worker's
    env = {**outer, "MADE": str(made), "ORDER": str(order),
           "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    # the project's conftest as a plugin: its plugins, xdist_groups among them
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p",
                          "no:cacheprovider", "-n", "2", "--dist", "loadgroup", "-rA",
                          str(tmp_path)], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "13 passed" in run.stdout, run.stdout[-3000:]
    workers = [json.loads(line) for line in made.read_text().splitlines()]
    assert len(workers) == 1 and workers[0] in ("gw0", "gw1"), workers
    # each worker runs its units in the order handed out: the slow module's before the
    # quick one's, wherever each landed
    ran = [line.split() for line in order.read_text().splitlines()]
    assert sorted(kind for _, kind in ran) == ["other"] * 8 + ["slow"] * 2, ran
    for worker in ("gw0", "gw1"):
        kinds = [kind for w, kind in ran if w == worker]
        assert kinds == sorted(kinds, key=lambda kind: kind != "slow"), ran
