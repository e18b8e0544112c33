"""Issue 28 item 5: a Horovod elastic restart onto fewer ranks from the memory level.

One job: ``horovodrun -np 4 --min-np 3`` (elastic, gloo) over four host names of this
machine, one slot each, listed by a host discovery script; each worker is a simulated
node (tests/horovod_elastic_train.py). After a step is committed on every node's memory
level (``redundancy="partner"``) and copied to the durable tier, the worker of node 2
moves the durable tier out of reach, drops its host from the discovery file, wipes its
node's memory area and SIGKILLs itself. Horovod resets the other three
(``HorovodInternalError``), ``uckpt.horovod.ElasticState`` restores the committed step
onto 3 ranks from the memory level (node 2's share rebuilt from its partner copy), bit
for bit against the consolidated durable copy, and they train on.

Horovod elastic needs Horovod built with Gloo (``horovodrun --check-build``); the test
skips where it is not.
"""
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("horovod.torch",
                    reason="Horovod is not installed: bash scripts/install_horovod.sh")

import numpy as np  # noqa: E402
import horovod.torch as hvd  # noqa: E402

import uckpt  # noqa: E402
from multiproc import run_command  # noqa: E402
from test_shm_restart import SHM, shm_name  # noqa: E402,F401 (a fixture)

pytestmark = [pytest.mark.xdist_group("distributed"),
              pytest.mark.skipif(not hvd.gloo_built(), reason="Horovod is built without Gloo, "
                                 "which elastic mode needs: bash scripts/install_horovod.sh "
                                 "--force")]

WORKER = Path(__file__).with_name("horovod_elastic_train.py")
HOROVODRUN = str(Path(sys.executable).with_name("horovodrun"))
#: four names of this machine (Horovod runs a worker without ssh where the name resolves
#: to a local address); one host each, so that a lost worker is a lost host
HOSTS = ["localhost", "127.0.0.1", "127.1", "127.0.1"]
SAVE_AT, STEPS, LOST = 3, 7, 2


def arrays(tree, prefix=""):
    """The arrays of a loaded tree by path (``model/0.weight``, ``optimizer/state/0/...``)."""
    if isinstance(tree, dict):
        items = tree.items()
    elif isinstance(tree, list):
        items = enumerate(tree)
    else:
        return {prefix[:-1]: tree} if isinstance(tree, np.ndarray) else {}
    return {k: v for key, sub in items for k, v in arrays(sub, f"{prefix}{key}/").items()}


def test_elastic_restart_on_three_of_four_nodes_from_the_memory_level(tmp_path, shm_name):
    durable, out = tmp_path / "durable", tmp_path / "out"
    out.mkdir()
    hosts = tmp_path / "hosts"
    hosts.write_text("".join(f"{h}:1\n" for h in HOSTS))
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat '{hosts}'\n")
    discover.chmod(0o755)
    run = run_command([HOROVODRUN, "-np", 4, "--min-np", 3, "--max-np", 4,
                       "--host-discovery-script", discover, "--network-interface", "lo",
                       sys.executable, WORKER, shm_name, durable, hosts, ",".join(HOSTS), out],
                      timeout=240)
    log = f"--- stdout\n{run.stdout[-6000:]}\n--- stderr\n{run.stderr[-6000:]}"
    assert run.returncodes == [0], log
    assert hosts.read_text() == "".join(f"{h}:1\n" for i, h in enumerate(HOSTS) if i != LOST)

    away = tmp_path / "durable.away"
    assert not durable.exists()  # out of reach from the kill on, and never made again
    want = arrays(uckpt.load(away / f"step_{SAVE_AT:08d}"))  # consolidated, by 4 ranks
    survivors = [k for k in range(4) if k != LOST]
    restored = {k: json.loads((out / f"restored-node{k}.json").read_text()) for k in survivors}
    assert sorted(r["rank"] for r in restored.values()) == [0, 1, 2], restored
    for k, r in restored.items():
        assert r["size"] == 3 and r["step"] == SAVE_AT, r
        # each new rank restores old rank r's PerRank value (that of the rank node 2 ran,
        # unless it was rank 3, is in node 2's share, which only its partner copy kept)
        assert r["seen"] == [1000 * r["rank"] + SAVE_AT] * 4, r
        assert f"restored step {SAVE_AT} from tier '{shm_name}-node{k}'" in \
            " ".join(r["logs"]), r
        got = np.load(out / f"restored-node{k}.npz")
        assert sorted(got.files) == sorted(n for n in want if n.startswith(("model/", "opt")))
        for name in got.files:
            assert got[name].dtype == want[name].dtype and \
                np.array_equal(got[name], want[name]), name
    lines = [line for r in restored.values() for line in r["logs"]]
    assert any(f"rebuilt the share of node 'node{LOST}'" in line and "(node not in the job) "
               "from partner over the communicator" in line for line in lines), lines
    for k in survivors:
        done = json.loads((out / f"done-node{k}.json").read_text())
        assert done["size"] == 3 and done["params_equal"], done  # trained on to the end
    assert not (SHM / f"{shm_name}-node{LOST}").exists()
