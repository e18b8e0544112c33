"""The memory level (issue 28, items 1 and 3): ``shm://NAME`` roots in the node's shared
memory, their bounded capacity, node names and ``{node}`` in tier paths, and restore
from node-local copies. Roots live under ``UCKPT_SHM_DIR`` set to a tmp_path (or a small
tmpfs mounted there), so nothing is left in /dev/shm."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import uckpt
from uckpt import errors
from uckpt.testing import run_ranks


@pytest.fixture
def shm(tmp_path, monkeypatch):
    """The directory shm:// roots live in for this test."""
    base = tmp_path / "shm"
    base.mkdir()
    monkeypatch.setenv("UCKPT_SHM_DIR", str(base))
    return base


def state(step, n=64):
    return {"w": np.arange(n, dtype=np.float32) * (step + 1), "step": np.int64(step)}


def zeros(n=64):
    return {"w": np.zeros(n, dtype=np.float32), "step": np.int64(0)}


# --- shm:// roots --------------------------------------------------------------------------
def test_shm_root_saves_loads_and_lives_in_the_shm_directory(shm):
    path = uckpt.save("shm://run1/a/step_1", state(1))
    assert path == shm / "run1" / "a" / "step_1"
    assert sorted(p.name for p in path.iterdir()) == ["data-00000.bin", "manifest.json"]
    got = zeros()
    uckpt.load("shm://run1/a/step_1", got)
    np.testing.assert_array_equal(got["w"], state(1)["w"])
    uckpt.verify("shm://run1/a/step_1")


def test_a_flipped_byte_in_shared_memory_is_caught(shm):
    path = uckpt.save("shm://run1/step_1", state(1))
    data = path / "data-00000.bin"
    raw = bytearray(data.read_bytes())
    raw[0] ^= 1
    data.write_bytes(bytes(raw))
    with pytest.raises(errors.ChecksumMismatchError, match="data-00000.bin"):
        uckpt.load("shm://run1/step_1", zeros())


@pytest.mark.parametrize("url, what", [
    ("shm://", "an empty name"), ("shm://../x", "'..'"), ("shm://a/../b", "'..'"),
    ("shm://.hidden", "'.hidden'"), ("shm://a b", "'a b'"),
    ("shm://run-{node}", "replaced only in a CheckpointManager's tiers"),
])
def test_bad_shm_names_are_refused(shm, url, what):
    with pytest.raises(errors.StorageConfigError, match="not a valid name of a "
                       "shared-memory root") as e:
        if "{" in url:  # (a manager replaces {node}: opened as a URL)
            uckpt.save(f"{url}/ck", state(1))
        else:
            uckpt.CheckpointManager(url).steps()
    assert what in str(e.value) and "shm://NAME" in str(e.value)
    assert list(shm.iterdir()) == []


def test_shm_takes_no_storage_options(shm):
    with pytest.raises(errors.StorageConfigError, match="storage_options were given for "
                       "'shm://x', a shm:// root"):
        uckpt.save("shm://x/ck", state(1), storage_options={"key": "k"})


def test_a_missing_shm_directory_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("UCKPT_SHM_DIR", str(tmp_path / "absent"))
    with pytest.raises(errors.StorageConfigError, match="UCKPT_SHM_DIR=.*absent.* is not a "
                       "directory") as e:
        uckpt.save("shm://x/ck", state(1))
    assert "unset UCKPT_SHM_DIR to use /dev/shm" in str(e.value)
    assert not (tmp_path / "absent").exists()


def test_cli_ls_inspect_verify_an_shm_root(shm):
    m = uckpt.CheckpointManager("shm://cli", keep=2)
    for s in (1, 2):
        m.save(s, state(s))
    m.close()
    env = dict(os.environ, PYTHONWARNINGS="ignore")

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "uckpt.cli.main", *args], env=env,
                              capture_output=True, text=True)
    ls = cli("ls", "shm://cli")
    assert ls.returncode == 0, ls.stderr
    assert "step_00000001" in ls.stdout and "step_00000002" in ls.stdout
    verify = cli("verify", "shm://cli/step_00000002")
    assert verify.returncode == 0 and "OK" in verify.stdout, verify.stderr
    inspect = cli("inspect", "shm://cli/step_00000002")
    assert inspect.returncode == 0 and "shm://cli/step_00000002" in inspect.stdout


# --- capacity --------------------------------------------------------------------------------
def test_an_shm_tier_keeps_one_by_default(shm):
    with uckpt.CheckpointManager(tiers=["shm://cap"]) as m:
        for s in range(3):
            m.save(s, state(s))
        assert m.steps() == [2]
    with uckpt.CheckpointManager(tiers=[uckpt.Tier("shm://cap2", keep=2)], keep=None) as m:
        for s in range(4):
            m.save(s, state(s))
        assert m.steps() == [2, 3]


@pytest.mark.parametrize("tier_keep, manager_keep, policy", [
    (uckpt.KeepAll(), None, "KeepAll()"),
    ([1, uckpt.KeepEvery(10)], None, "KeepEvery(10)"),
    (None, uckpt.KeepEvery(100), "KeepEvery(100)"),
])
def test_unbounded_retention_of_an_shm_tier_is_refused(shm, tmp_path, tier_keep, manager_keep,
                                                       policy):
    with pytest.raises(errors.OptionsError, match=r"the memory level shm://cap \(tier 'cap'\) "
                       r"would keep checkpoints without bound") as e:
        uckpt.CheckpointManager(tiers=[uckpt.Tier("shm://cap", keep=tier_keep),
                                       tmp_path / "durable"], keep=manager_keep)
    assert policy in str(e.value) and "keep=1" in str(e.value)


@pytest.fixture
def small_tmpfs(tmp_path, monkeypatch):
    """UCKPT_SHM_DIR on a 1 MiB tmpfs of its own (root only; unmounted after)."""
    base = tmp_path / "tmpfs"
    base.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(base)],
                             capture_output=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    monkeypatch.setenv("UCKPT_SHM_DIR", str(base))
    yield base
    subprocess.run(["umount", "-l", str(base)], check=True)


def test_a_save_that_does_not_fit_the_shared_memory_is_refused(small_tmpfs):
    m = uckpt.CheckpointManager(tiers=[uckpt.Tier("shm://full", keep=2)])
    m.save(1, state(1, n=1024))  # 4 KiB
    big = state(2, n=512 * 1024)  # 2 MiB: more than the file system holds
    with pytest.raises(errors.LevelFullError) as e:
        m.save(2, big)
    err = e.value
    assert isinstance(err, errors.StorageFullError) and isinstance(err, OSError)
    text = str(err)
    assert "the memory level shm://full" in text and f"needs {err.needed} bytes" in text
    assert 2 * 1024 * 1024 <= err.needed < 2 * 1024 * 1024 + 4096
    assert 0 < err.free < 1024 * 1024
    assert f"{err.free} bytes free" in text and "smaller keep" in text
    assert m.steps() == [1]  # the earlier checkpoint is intact, nothing else is left
    assert sorted(p.name for p in (small_tmpfs / "full").iterdir()
                  if not p.name.startswith(".uckpt-writer")) == ["step_00000001"]
    got = zeros(1024)
    assert m.restore(got) == 1
    np.testing.assert_array_equal(got["w"], state(1, n=1024)["w"])
    m.close()


# --- nodes -----------------------------------------------------------------------------------
def test_nodes_answer_order_index_ranks_and_leaders():
    from uckpt.runtime.nodes import Nodes

    nodes = Nodes(("b", "b", "a", "a", "b"), rank=2)
    assert nodes.name == "a" and nodes.order == ("b", "a") and nodes.index == 1
    assert nodes.ranks() == {"b": (0, 1, 4), "a": (2, 3)}
    assert nodes.leaders == (0, 2)


def test_node_names_come_from_the_argument_the_variable_or_the_host(tmp_path, monkeypatch):
    import socket

    monkeypatch.delenv("UCKPT_NODE", raising=False)
    tier = uckpt.Tier(str(tmp_path / "{node}" / "run"))
    assert uckpt.CheckpointManager(tiers=[tier]).tiers[0].path == \
        tmp_path / socket.gethostname() / "run"
    monkeypatch.setenv("UCKPT_NODE", "n7")
    m = uckpt.CheckpointManager(tiers=[tier])
    assert m.tiers[0].path == tmp_path / "n7" / "run" and m.nodes.name == "n7"
    assert uckpt.CheckpointManager(tiers=[tier], node="n8").tiers[0].path == \
        tmp_path / "n8" / "run"


def test_ranks_gather_their_node_names_once(tmp_path):
    def job(c):
        m = uckpt.CheckpointManager(tiers=[tmp_path / "{node}"], comm=c, node=f"n{c.rank // 2}")
        return m.nodes, m.tiers[0].path
    for rank, (nodes, path) in enumerate(run_ranks(4, job)):
        assert nodes.of_rank == ("n0", "n0", "n1", "n1") and nodes.rank == rank
        assert path == tmp_path / f"n{rank // 2}"


@pytest.mark.parametrize("node", ["a/b", "..", "", ".x", "a b"])
def test_bad_node_names_are_refused(tmp_path, monkeypatch, node):
    monkeypatch.setenv("UCKPT_NODE", node)
    if not node:  # an empty variable is unset: the host name is used
        uckpt.CheckpointManager(tiers=[tmp_path / "{node}"])
        return
    with pytest.raises(errors.OptionsError, match=r"the node name .* \(from UCKPT_NODE\) is "
                       "not usable in a path") as e:
        uckpt.CheckpointManager(tiers=[tmp_path / "{node}"])
    assert "set UCKPT_NODE" in str(e.value)


@pytest.mark.parametrize("tier, message", [
    ("{where}/run", r"unknown placeholder \{where\}; only \{node\} is replaced"),
    ("{node}/{rank}", r"unknown placeholder \{rank\}"),
    ("memory://x-{node}", "names storage every node shares"),
    ("s3://bucket/{node}", "names storage every node shares"),
    ("{node}/../shared", "two nodes would share one root"),
])
def test_bad_placeholders_are_refused(tmp_path, tier, message):
    path = tier if "://" in tier else str(tmp_path / tier)

    def job(c):
        uckpt.CheckpointManager(tiers=[path], comm=c, node=f"n{c.rank}")
    outcomes = run_ranks(2, job)
    for outcome in outcomes:
        assert isinstance(outcome, errors.StorageConfigError), outcome
        assert __import__("re").search(message, str(outcome)), outcome
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# --- restore prefers the memory level -------------------------------------------------------
def test_restore_takes_the_memory_level_and_never_the_durable_tier(shm, tmp_path):
    tiers = [uckpt.Tier("shm://pref", keep=1), tmp_path / "durable"]
    with uckpt.CheckpointManager(tiers=tiers, async_save=True) as m:
        for s in range(3):
            m.save(s, state(s))
    (tmp_path / "durable").rename(tmp_path / "away")
    m = uckpt.CheckpointManager(tiers=tiers)
    got = zeros()
    assert m.restore(got) == 2
    np.testing.assert_array_equal(got["w"], state(2)["w"])
    m.close()
    assert not (tmp_path / "durable").exists()


ROWS = 16


def shard(rank, world, zero=False):
    """FSDP-style: rank ``rank``'s rows of one array: what it reads is in its own file."""
    full = np.arange(ROWS * 4, dtype=np.float32).reshape(ROWS, 4)
    lo, hi = rank * ROWS // world, (rank + 1) * ROWS // world
    part = np.zeros_like(full[lo:hi]) if zero else full[lo:hi].copy()
    return {"w": uckpt.Shard(part, full.shape, (lo, 0))}


def test_restore_reads_node_local_copies_that_hold_what_each_rank_reads(tmp_path):
    """Two simulated nodes (ranks 0-1, 2-3), a node-local first tier: each node's copy
    holds its ranks' files only; sharded state reads back from it, durable tier gone."""
    def tiers(rank):
        return [tmp_path / f"node{rank // 2}" / "run", tmp_path / "durable"]

    def save(c):
        with uckpt.CheckpointManager(tiers=tiers(c.rank), comm=c) as m:
            m.save(5, shard(c.rank, 4))
    assert run_ranks(4, save) == [None] * 4
    (tmp_path / "durable").rename(tmp_path / "away")

    def restore(c):
        got = shard(c.rank, 4, zero=True)
        with uckpt.CheckpointManager(tiers=tiers(c.rank), comm=c) as m:
            return m.restore(got), got
    for rank, outcome in enumerate(run_ranks(4, restore)):
        assert not isinstance(outcome, BaseException), outcome
        step, got = outcome
        assert step == 5
        np.testing.assert_array_equal(got["w"].array, shard(rank, 4)["w"].array)
    assert not (tmp_path / "durable").exists()


def test_every_node_restores_the_newest_step_committed_on_all_of_them(tmp_path):
    """Step 5 is committed on node 0's copy only (as when a kill came between the two
    nodes' commits): every rank restores step 4, the newest on both, from its node."""
    def tiers(rank):
        return [uckpt.Tier(tmp_path / f"node{rank // 2}" / "run", keep=2), tmp_path / "durable"]

    def stepped(step, rank, zero=False):
        s = shard(rank, 4, zero)
        s["w"].array[...] *= 0 if zero else step
        return s

    def save(c):
        with uckpt.CheckpointManager(tiers=tiers(c.rank), comm=c) as m:
            for step in (4, 5):
                m.save(step, stepped(step, c.rank))
    assert run_ranks(4, save) == [None] * 4
    __import__("shutil").rmtree(tmp_path / "node1" / "run" / "step_00000005")
    (tmp_path / "durable").rename(tmp_path / "away")

    def restore(c):
        got = stepped(0, c.rank, zero=True)
        with uckpt.CheckpointManager(tiers=tiers(c.rank), comm=c) as m:
            return m.restore(got), got
    for rank, outcome in enumerate(run_ranks(4, restore)):
        assert not isinstance(outcome, BaseException), outcome
        assert outcome[0] == 4
        np.testing.assert_array_equal(outcome[1]["w"].array, stepped(4, rank)["w"].array)
    assert not (tmp_path / "durable").exists()
