"""Checkpoints in an S3-compatible object store (issue 11), against a real SeaweedFS server
(tests/s3_server.py): uckpt.save/load on s3:// URLs, a local fast tier with an S3 durable
tier, the server killed mid-upload, injected transient faults, corrupted objects, the
object-store commit rule (manifest last), debris and the writer lock."""
import json
import logging
import os
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import uckpt
import uckpt.knobs as knobs
from uckpt import errors
from uckpt.storage.checkpoint.lock import CONCURRENT_DIR, LOCK_NAME

pytestmark = pytest.mark.timeout(300)
MiB = 1 << 20


def url(bucket, *parts):
    return "/".join([f"s3://{bucket}", *parts])


def keys(server, bucket, prefix=""):
    """Every object under ``prefix`` of ``bucket``: key -> size (a plain boto3 client)."""
    out = {}
    for page in server.client().get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                             Prefix=prefix):
        out.update((o["Key"], o["Size"]) for o in page.get("Contents", ()))
    return out


def incomplete_uploads(server, bucket):
    return server.client().list_multipart_uploads(Bucket=bucket).get("Uploads", [])


def arrays(seed=0, mb=2):
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal(mb * MiB // 8), "b": {"x": np.arange(12.0).reshape(3, 4)},
            "step": seed, "name": "run"}


def assert_same(a, b):
    assert np.array_equal(a["w"], b["w"]) and np.array_equal(a["b"]["x"], b["b"]["x"])
    assert a["step"] == b["step"] and a["name"] == b["name"]


# --- uckpt.save / uckpt.load on s3:// URLs -------------------------------------------------------
def test_save_load_verify_s3_url(s3_server, s3_bucket, s3_options):
    state = arrays(1, mb=40)  # 40 MiB: a multipart upload of 3 parts
    where = uckpt.save(url(s3_bucket, "ckpts", "a"), state, step=3, metadata={"k": 1},
                       storage_options=s3_options)
    assert where == url(s3_bucket, "ckpts", "a")
    assert sorted(keys(s3_server, s3_bucket)) == ["ckpts/a/data-00000.bin", "ckpts/a/manifest.json"]
    assert_same(uckpt.load(where, storage_options=s3_options), state)
    m = uckpt.verify(where, storage_options=s3_options)
    assert m.step == 3 and m.metadata == {"k": 1} and m.world_size == 1
    # into live objects, in place
    w = np.zeros_like(state["w"])
    target = {"w": w, "b": {"x": np.zeros((3, 4))}, "step": None, "name": None}
    uckpt.load(where, target, storage_options=s3_options)
    assert np.array_equal(w, state["w"]) and target["step"] == 1
    # asynchronous: the handle returns the URL once the manifest is there
    h = uckpt.save(url(s3_bucket, "ckpts", "b"), arrays(2), blocking=False,
                   storage_options=s3_options)
    assert h.wait(60) == url(s3_bucket, "ckpts", "b")
    assert_same(uckpt.load(h.wait(), storage_options=s3_options), arrays(2))


def test_existing_checkpoint_refused_unless_overwrite(s3_server, s3_bucket, s3_options):
    where = url(s3_bucket, "c")
    uckpt.save(where, arrays(1), storage_options=s3_options)
    with pytest.raises(errors.CheckpointExistsError, match="already holds a committed"):
        uckpt.save(where, arrays(2), storage_options=s3_options)
    assert_same(uckpt.load(where, storage_options=s3_options), arrays(1))
    uckpt.save(where, arrays(2), overwrite=True, storage_options=s3_options)
    assert_same(uckpt.load(where, storage_options=s3_options), arrays(2))
    # a prefix holding objects that are not a checkpoint's is never written into
    s3_server.client().put_object(Bucket=s3_bucket, Key="other/notes.txt", Body=b"mine")
    with pytest.raises(errors.CheckpointExistsError, match="notes.txt"):
        uckpt.save(url(s3_bucket, "other"), arrays(1), storage_options=s3_options)


def test_missing_and_bad_targets(s3_server, s3_bucket, s3_options):
    with pytest.raises(errors.NotACheckpointError, match="no manifest.json"):
        uckpt.load(url(s3_bucket, "nothing"), storage_options=s3_options)
    with pytest.raises(errors.CheckpointNotFoundError, match="no bucket"):
        uckpt.load("s3://no-such-bucket-here/x", storage_options=s3_options)
    with pytest.raises(errors.StorageConfigError, match="names a bucket"):
        uckpt.save(f"s3://{s3_bucket}", arrays(1), storage_options=s3_options)
    with pytest.raises(errors.StorageConfigError, match="s3:// URLs only"):
        uckpt.save("/tmp/x-not-used", arrays(1), storage_options=s3_options)
    with pytest.raises(errors.StorageConfigError, match="unknown S3 storage option"):
        uckpt.load(url(s3_bucket, "x"), storage_options={**s3_options, "colour": "red"})


def test_uncommitted_prefix_is_invisible(s3_server, s3_bucket, s3_options):
    """Data objects without a manifest (a save that died) are no checkpoint to anyone."""
    root = url(s3_bucket, "run")
    uckpt.save(url(s3_bucket, "run", "step_00000001"), arrays(1), step=1,
               storage_options=s3_options)
    s3_server.client().put_object(Bucket=s3_bucket, Key="run/step_00000002/data-00000.bin",
                                  Body=b"x" * 100)
    mgr = uckpt.CheckpointManager(root, storage_options=s3_options)
    assert mgr.steps() == [1]
    holder = arrays(0)
    assert mgr.restore(holder) == 1
    assert_same(holder, arrays(1))
    with pytest.raises(errors.NotACheckpointError):
        uckpt.load(url(s3_bucket, "run", "step_00000002"), storage_options=s3_options)


# --- a local fast tier and an S3 durable tier ------------------------------------------------
def torch_state(seed):
    torch = pytest.importorskip("torch")
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return model, opt


def train(model, opt, steps):
    import torch

    for _ in range(steps):
        x = torch.randn(8, 16)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_two_tiers_async_node_loss_restore_from_s3_bit_for_bit(tmp_path, s3_server, s3_bucket,
                                                               s3_options):
    """Train and save (async) to local + S3; the local tier is lost; a fresh process state
    (new model, optimizer, RNGs) restores from S3 to exactly the saved bits."""
    import random
    import shutil

    import torch

    model, opt = torch_state(0)
    fast, durable = tmp_path / "fast", url(s3_bucket, "run1")
    mgr = uckpt.CheckpointManager(tiers=[fast, uckpt.Tier(durable, keep=3)], keep_last=2,
                                  async_save=True, storage_options=s3_options)
    for step in range(1, 5):
        train(model, opt, 3)
        mgr.save(step, {"model": model, "optimizer": opt, "rng": uckpt.RandomState()})
    mgr.wait()
    assert mgr.tiers[1].store.steps() == [2, 3, 4]
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    saved_opt = opt.state_dict()
    expected_next = (random.random(), np.random.random(), torch.rand(3))  # the RNGs after step 4
    mgr.close()

    shutil.rmtree(fast)  # node loss
    model2, opt2 = torch_state(123)
    random.seed(9)
    np.random.seed(9)
    torch.manual_seed(9)
    fresh = uckpt.CheckpointManager(tiers=[fast, durable], storage_options=s3_options)
    assert fresh.restore({"model": model2, "optimizer": opt2, "rng": uckpt.RandomState()}) == 4
    assert all(torch.equal(saved[k], v) for k, v in model2.state_dict().items())
    got = opt2.state_dict()
    for i, st in saved_opt["state"].items():
        assert all(torch.equal(st[k], got["state"][i][k]) for k in st)
    assert got["param_groups"] == saved_opt["param_groups"]
    after = (random.random(), np.random.random(), torch.rand(3))
    assert after[0] == expected_next[0] and after[1] == expected_next[1]
    assert torch.equal(after[2], expected_next[2])
    fresh.close()


def test_tier_spellings_and_options(tmp_path, s3_bucket, s3_options):
    t = uckpt.Tier(url(s3_bucket, "run9") + "/", keep=2, storage_options=s3_options)
    assert t.path == url(s3_bucket, "run9") and t.name == "run9" and not t.store.acts_here(1)
    mgr = uckpt.CheckpointManager(tiers=[tmp_path / "f", url(s3_bucket, "run8")],
                                  storage_options=s3_options)
    assert mgr.tiers[1].storage_options == s3_options and mgr.tiers[0].storage_options is None
    assert mgr.path(5, 1) == url(s3_bucket, "run8", "step_00000005")
    mgr.close()


def test_s3_only_manager_with_retention(s3_server, s3_bucket, s3_options):
    root = url(s3_bucket, "only")
    with uckpt.CheckpointManager(root, keep_last=2, storage_options=s3_options) as mgr:
        for step in range(5):
            mgr.save(step, arrays(step, mb=1))
        assert mgr.steps() == [3, 4]
    names = sorted(keys(s3_server, s3_bucket, "only/"))
    assert names == ["only/step_00000003/data-00000.bin", "only/step_00000003/manifest.json",
                     "only/step_00000004/data-00000.bin", "only/step_00000004/manifest.json"]
    # the writer lock was released at close
    assert f"only/{LOCK_NAME}" not in names


# --- the server killed in the middle of an upload --------------------------------------------
def test_server_killed_mid_upload(tmp_path, own_s3_server, monkeypatch):
    server = own_s3_server
    bucket = server.new_bucket()
    opts = {**server.storage_options, "max_attempts": 2, "connect_timeout": 1.0,
            "read_timeout": 5.0, "part_bytes": 5 * MiB, "threads": 2}
    fast, durable = tmp_path / "fast", url(bucket, "run")
    mgr = uckpt.CheckpointManager(tiers=[fast, durable], async_save=True, storage_options=opts)
    mgr.save(1, arrays(1, mb=1))
    mgr.wait()
    assert mgr.tiers[1].store.steps() == [1]

    big = arrays(2, mb=160)  # 32 parts of 5 MiB, two at a time
    mgr.save(2, big)
    deadline = time.monotonic() + 60
    while not incomplete_uploads(server, bucket):  # the upload has started
        assert time.monotonic() < deadline, "the upload never started"
        time.sleep(0.02)
    server.kill()
    with pytest.raises((errors.StorageUnavailableError, errors.ObjectStoreError)) as ei:
        mgr.wait()
    assert server.endpoint_url in str(ei.value) or "s3://" in str(ei.value)
    # the local checkpoint is intact; nothing of step 2 is committed on S3
    assert_same(uckpt.load(fast / "step_00000002"), big)
    # with the store down, a restore lists the other tiers (saying so) and reads from them
    other = uckpt.CheckpointManager(tiers=[fast, durable], storage_options=opts, role="reader")
    holder = {"w": np.zeros_like(big["w"]), "b": {"x": np.zeros((3, 4))}, "step": None,
              "name": None}
    with pytest.warns(RuntimeWarning, match="tier 'run' .* cannot be listed"):
        assert other.restore(holder) == 2
    assert_same(holder, big)
    server.restart()
    assert keys(server, bucket, "run/step_00000002/").get("run/step_00000002/manifest.json") is None
    reader = uckpt.CheckpointManager(durable, storage_options=opts, role="reader")
    assert reader.steps() == [1]
    # the next save and its copy succeed, and the failed save's leftovers are removed
    mgr.save(3, arrays(3, mb=1))
    mgr.wait()
    assert mgr.tiers[1].store.steps() == [1, 3]
    assert not incomplete_uploads(server, bucket)
    assert not keys(server, bucket, "run/step_00000002/")
    assert_same(uckpt.load(url(bucket, "run", "step_00000003"), storage_options=opts), arrays(3, mb=1))
    mgr.close()


# --- transient faults ------------------------------------------------------------------------
def test_transient_faults_end_in_verified_checkpoints(tmp_path, s3_server, s3_bucket, fault_proxy,
                                                       s3_options):
    fault_proxy.configure(rate=0.15, kinds=("503", "500", "reset", "reset_mid"), seed=11)
    opts = {**fault_proxy.storage_options, "part_bytes": 5 * MiB, "max_attempts": 10}
    mgr = uckpt.CheckpointManager(tiers=[tmp_path / "fast", url(s3_bucket, "flaky")],
                                  async_save=True, storage_options=opts)
    for step in range(1, 5):
        mgr.save(step, arrays(step, mb=12))
    mgr.close()
    assert fault_proxy.total_injected() > 5, fault_proxy.injected
    fault_proxy.configure(rate=0.0)
    for step in range(1, 5):  # straight from the server, not through the proxy
        where = url(s3_bucket, "flaky", f"step_{step:08d}")
        uckpt.verify(where, storage_options=s3_options)
        assert_same(uckpt.load(where, storage_options=s3_options), arrays(step, mb=12))


def test_restore_reads_through_faults(s3_bucket, fault_proxy, s3_options):
    where = url(s3_bucket, "rd")
    uckpt.save(where, arrays(5, mb=20), storage_options=s3_options)
    fault_proxy.configure(rate=0.3, kinds=("503", "reset", "reset_mid"), seed=3,
                          methods=["GET", "HEAD"])
    opts = {**fault_proxy.storage_options, "max_attempts": 10}
    assert_same(uckpt.load(where, storage_options=opts), arrays(5, mb=20))
    assert fault_proxy.total_injected() > 0


# --- corruption on S3 ------------------------------------------------------------------------
def corrupt(server, bucket, key, offset=100):
    c = server.client()
    data = bytearray(c.get_object(Bucket=bucket, Key=key)["Body"].read())
    data[offset] ^= 0xFF
    c.put_object(Bucket=bucket, Key=key, Body=bytes(data))


def test_corrupted_object_detected_restore_falls_back(tmp_path, s3_server, s3_bucket, s3_options):
    fast, durable = tmp_path / "fast", url(s3_bucket, "run")
    with uckpt.CheckpointManager(tiers=[fast, durable], storage_options=s3_options) as mgr:
        for step in (1, 2):
            mgr.save(step, arrays(step))
    corrupt(s3_server, s3_bucket, "run/step_00000002/data-00000.bin")
    with pytest.raises(errors.ChecksumMismatchError, match="data-00000.bin"):
        uckpt.verify(url(s3_bucket, "run", "step_00000002"), storage_options=s3_options)

    # S3 first: its damaged copy of step 2 is skipped for the local tier's copy of step 2
    s3_first = uckpt.CheckpointManager(tiers=[durable, fast], storage_options=s3_options)
    holder = arrays(0)
    with pytest.warns(RuntimeWarning, match="skipping checkpoint step 2 on tier 'run'.*checksum mismatch"):
        assert s3_first.restore(holder) == 2
    assert_same(holder, arrays(2))

    # the local tier lost: the damaged step 2 is skipped for step 1 on S3
    import shutil

    shutil.rmtree(fast)
    holder = arrays(0)
    mgr = uckpt.CheckpointManager(tiers=[fast, durable], storage_options=s3_options)
    with pytest.warns(RuntimeWarning, match="skipping checkpoint step 2"):
        assert mgr.restore(holder) == 1
    assert_same(holder, arrays(1))

    # a damaged manifest is caught by its own checksum
    corrupt(s3_server, s3_bucket, "run/step_00000001/manifest.json", offset=40)
    with pytest.raises(errors.CorruptCheckpointError, match="no checkpoint .* reads back intact"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mgr.restore(arrays(0))


# --- several ranks uploading their own files -------------------------------------------------
def aws_env(server):
    """The standard AWS variables naming the test server (how child processes find it)."""
    return {"AWS_ENDPOINT_URL": server.endpoint_url, "AWS_ACCESS_KEY_ID": server.storage_options["key"],
            "AWS_SECRET_ACCESS_KEY": server.storage_options["secret"],
            "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.mark.timeout(600)
def test_mpi_ranks_upload_their_own_files_and_load_on_1_2_3_ranks(s3_server, s3_bucket):
    from multiproc import HAVE_MPI, HAVE_TORCH, run_mpi

    if not (HAVE_MPI and HAVE_TORCH):
        pytest.skip("mpi4py/mpiexec or torch missing")
    worker = Path(__file__).with_name("dist_worker.py")
    where = url(s3_bucket, "by4")
    env = aws_env(s3_server)
    r = run_mpi(4, worker, "mpi", "save", where, env=env, timeout=240).check()
    uploads = {rank: res["uploaded"] for rank, res in r.results.items()}
    m = uckpt.manifest(where, storage_options=s3_server.storage_options)
    assert m.world_size == 4 and sorted(m.files) == [f"data-{r:05d}.bin" for r in range(4)]
    parts = sorted(p.file for p in m.parts)
    assert parts == [f"manifest.part-{r:05d}.json" for r in range(4)], parts  # one per rank
    # every rank uploaded its own data file, then its own manifest part (uckpt.saving.own_parts);
    # rank 0 the root, last
    assert uploads == {rank: [f"{where}/data-{rank:05d}.bin",
                              f"{where}/manifest.part-{rank:05d}.json"] +
                       ([f"{where}/manifest.json"] if rank == 0 else []) for rank in range(4)}
    objs = keys(s3_server, s3_bucket, "by4/")
    assert sorted(objs) == sorted([f"by4/data-{r:05d}.bin" for r in range(4)] +
                                  [f"by4/{p}" for p in parts] + ["by4/manifest.json"])
    assert all(objs[f"by4/{f.name}"] == f.size for f in m.files.values())
    assert all(objs[f"by4/{p.file}"] == p.size for p in m.parts)
    for n in (1, 2, 3):
        r = run_mpi(n, worker, "mpi", "load", where, "cols", env=env, timeout=240).check()
        assert sorted(r.results) == list(range(n))
        for rank, res in r.results.items():
            assert res["model"] and res["optimizer"] and res["zero"] and res["step"] == 7, res
            assert res["rank_state"] == 100 + rank, res


# --- readers while the writer saves ----------------------------------------------------------
@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", ["async", "tiers"])
def test_readers_never_see_a_partial_checkpoint(tmp_path, s3_server, s3_bucket, mode):
    """One saver (async to S3 with retention deleting; or local + S3 tiers) against three
    reader processes listing and restoring from S3 every 50 ms."""
    from test_shared_root import acked, check_readers, start_readers, stop_readers, WORKER

    durable = url(s3_bucket, "shared")
    roots = [durable] if mode == "async" else [tmp_path / "fast", durable]
    env = {**os.environ, **aws_env(s3_server)}
    saves = int(os.environ.get("UCKPT_S3_SHARED_SAVES", "40"))
    old = dict(os.environ)
    os.environ.update(aws_env(s3_server))  # the readers inherit it
    try:
        stop, readers = start_readers(tmp_path, [durable])
    finally:
        os.environ.clear()
        os.environ.update(old)
    saver = subprocess.run([sys.executable, str(WORKER), "save", mode, str(saves), "0",
                            *map(str, roots)], capture_output=True, text=True, timeout=500,
                           env=env)
    summaries = stop_readers(stop, readers)
    assert saver.returncode == 0, saver.stderr
    check_readers(summaries)
    assert acked(saver.stdout) == list(range(saves))
    # what is committed on S3 loads, and nothing else is visible
    mgr = uckpt.CheckpointManager(durable, storage_options=s3_server.storage_options)
    steps = mgr.steps()
    assert steps and steps[-1] == saves - 1
    for s in steps[-3:]:
        tree = uckpt.load(mgr.path(s), storage_options=s3_server.storage_options)
        assert (tree["w"] == s).all()


# --- the writer lock and debris --------------------------------------------------------------
def test_second_writer_refused_naming_the_holder(s3_bucket, s3_options, monkeypatch):
    monkeypatch.setattr(knobs, "lock_lease_s", 3.0)  # a refusal waits for a renewal
    root = url(s3_bucket, "locked")
    first = uckpt.CheckpointManager(root, role="writer", storage_options=s3_options)
    with pytest.raises(errors.RootLockedError, match=f"process {os.getpid()} on host") as ei:
        uckpt.CheckpointManager(root, role="writer", storage_options=s3_options)
    assert LOCK_NAME in str(ei.value) and "concurrent_writers" not in ei.value.hint
    assert ei.value.holder["pid"] == os.getpid()
    with pytest.raises(errors.RootLockedError):  # an exclusive writer keeps concurrent ones out
        uckpt.CheckpointManager(root, role="writer", concurrent_writers=True,
                                storage_options=s3_options)
    reader = uckpt.CheckpointManager(root, storage_options=s3_options)  # readers are welcome
    assert reader.steps() == []
    first.close()
    second = uckpt.CheckpointManager(root, role="writer", storage_options=s3_options)
    second.close()
    # concurrent writers share the root; an exclusive one is refused while they hold it
    a = uckpt.CheckpointManager(root, role="writer", concurrent_writers=True, storage_options=s3_options)
    b = uckpt.CheckpointManager(root, role="writer", concurrent_writers=True, storage_options=s3_options)
    a.save(1, arrays(1, mb=1))
    b.save(2, arrays(2, mb=1))
    with pytest.raises(errors.RootLockedError, match="shared writer") as ei:
        uckpt.CheckpointManager(root, role="writer", storage_options=s3_options)
    assert "pass concurrent_writers=True to this writer too" in ei.value.hint
    assert f"{CONCURRENT_DIR}/" in ei.value.path  # the object that holds it, not the exclusive one
    a.close()
    b.close()
    assert uckpt.CheckpointManager(root, storage_options=s3_options).steps() == [1, 2]


def test_lock_of_an_exited_writer(s3_server, s3_bucket, s3_options, monkeypatch, caplog):
    """A writer that exits without close() gives the lock up; one that dies (no exit
    handlers run) leaves it, and the next writer takes it over once its lease has expired."""
    monkeypatch.setattr(knobs, "lock_lease_s", 3.0)
    monkeypatch.setenv("UCKPT_LOCK_LEASE_S", "3")
    root = url(s3_bucket, "exits")
    code = ("import os, sys, json, numpy as np, uckpt\n"
            "m = uckpt.CheckpointManager(sys.argv[1], storage_options=json.loads(sys.argv[2]))\n"
            "m.save(int(sys.argv[4]), {'w': np.arange(3)})\n"
            "print(os.getpid(), flush=True)\n"
            "if sys.argv[3] == 'die': os._exit(0)\n")
    run = [sys.executable, "-c", code, root, json.dumps(s3_options)]
    subprocess.run(run + ["exit", "1"], check=True, timeout=120)
    uckpt.CheckpointManager(root, role="writer", storage_options=s3_options).close()
    died = subprocess.run(run + ["die", "2"], check=True, timeout=120, capture_output=True, text=True)
    with uckpt.CheckpointManager(root, role="writer", storage_options=s3_options) as m:
        assert m.steps() == [1, 2]
    assert any(f"took over the writer lock {root}/{LOCK_NAME} of process "
               f"{died.stdout.strip()} on host" in r.getMessage() for r in caplog.records)


def test_debris_removed_by_the_writer_only_when_old(s3_server, s3_bucket, s3_options, monkeypatch):
    c = s3_server.client()
    for step in (7, 8):
        c.put_object(Bucket=s3_bucket, Key=f"deb/step_0000000{step}/data-00000.bin", Body=b"x" * 10)
    c.create_multipart_upload(Bucket=s3_bucket, Key="deb/step_00000009/data-00000.bin")
    # a reader removes nothing; a writer keeps young debris (another process may be saving)
    uckpt.CheckpointManager(url(s3_bucket, "deb"), storage_options=s3_options).steps()
    with uckpt.CheckpointManager(url(s3_bucket, "deb"), role="writer",
                                 storage_options=s3_options):
        pass
    assert len(keys(s3_server, s3_bucket, "deb/step_")) == 2
    monkeypatch.setattr(knobs, "debris_expiry_s", 0.0)
    with uckpt.CheckpointManager(url(s3_bucket, "deb"), role="writer",
                                 storage_options=s3_options):
        pass
    assert keys(s3_server, s3_bucket, "deb/") == {}
    assert not incomplete_uploads(s3_server, s3_bucket)


def test_own_live_save_is_never_debris(s3_server, s3_bucket, s3_options, monkeypatch):
    """With no age limit, a writer's debris removal still skips this process's live save."""
    from uckpt.storage import open_store

    monkeypatch.setattr(knobs, "debris_expiry_s", 0.0)
    store = open_store(url(s3_bucket, "live"), s3_options)
    sink = store.sink("step_00000001")
    sink.write_pieces("data-00000.bin", 8, [(0, np.arange(8, dtype=np.uint8))])
    assert store.remove_debris() == []
    assert "live/step_00000001/data-00000.bin" in keys(s3_server, s3_bucket)
    sink.abort()
    assert keys(s3_server, s3_bucket, "live/") == {}


# --- a single process runs the planning and checking of many ranks -----------------------------
def test_incomplete_shard_tiling_refused_by_save_and_manager(tmp_path):
    state = {"w": uckpt.Shard(np.arange(4), global_shape=(8,), offsets=(0,))}
    with pytest.raises(errors.StateMismatchError, match="cover 4 of its 8 elements"):
        uckpt.save(tmp_path / "d", state)
    with uckpt.CheckpointManager(tmp_path / "m") as mgr:
        with pytest.raises(errors.StateMismatchError, match="cover 4 of its 8 elements"):
            mgr.save(1, state)
        assert mgr.steps() == []
    assert not (tmp_path / "d").exists()
    # a Shard that covers its array is saved whole, by either
    full = {"w": uckpt.Shard(np.arange(8), global_shape=(8,), offsets=(0,))}
    with uckpt.CheckpointManager(tmp_path / "m") as mgr:
        mgr.save(1, full)
    assert uckpt.load(tmp_path / "m" / "step_00000001")["w"].tolist() == list(range(8))


# --- logging ---------------------------------------------------------------------------------
def test_info_logs_of_save_copy_verify_and_retention(tmp_path, s3_bucket, s3_options, caplog):
    caplog.set_level(logging.INFO, logger="uckpt")
    with uckpt.CheckpointManager(tiers=[uckpt.Tier(tmp_path / "fast", keep=1),
                                        url(s3_bucket, "logs")], storage_options=s3_options) as m:
        m.save(1, arrays(1, mb=1))
        m.save(2, arrays(2, mb=1))
    text = "\n".join(f"{r.name}: {r.getMessage()}" for r in caplog.records)
    size = str(uckpt.manifest(tmp_path / "fast" / "step_00000002").files["data-00000.bin"].size)
    for pattern in ("uckpt.saving.collective: committed", "uckpt.saving.collective: verified the copy of step 2",
                    "uckpt.saving.collective: copied step 2", "uckpt.manager.checkpoint_manager: deleted step 1 from tier 'fast'"):
        assert pattern in text, text
    saved = [r.getMessage() for r in caplog.records if "committed" in r.getMessage()]
    assert any("step 2" in s and size in s and s.rstrip().endswith(" s") for s in saved), saved


# --- the command line on s3:// URLs ----------------------------------------------------------
def run_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "uckpt.cli.main", *map(str, args)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})})


def test_cli_ls_inspect_verify_on_s3(tmp_path, s3_server, s3_bucket, s3_options):
    root = url(s3_bucket, "cli")
    with uckpt.CheckpointManager(tiers=[tmp_path / "fast", root], storage_options=s3_options) as m:
        m.save(10, arrays(10, mb=1), metadata={"who": "cli"})
        m.save(20, arrays(20, mb=1))
    s3_server.client().put_object(Bucket=s3_bucket, Key="cli/step_00000030/data-00000.bin",
                                  Body=b"half")
    env = aws_env(s3_server)
    r = run_cli("ls", root, env=env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert any("10" in ln and "committed" in ln for ln in lines)
    assert any("30" in ln and "incomplete" in ln for ln in lines), r.stdout
    doc = json.loads(run_cli("ls", "--json", root, env=env).stdout)
    assert [(c["step"], c["status"]) for c in doc["checkpoints"]] == \
        [(10, "committed"), (20, "committed"), (30, "incomplete")]
    assert doc["checkpoints"][0]["path"] == f"{root}/step_00000010"
    # several tiers, one of them on S3; options by flags instead of the environment
    flags = ["--endpoint-url", s3_server.endpoint_url]
    creds = {"AWS_ACCESS_KEY_ID": env["AWS_ACCESS_KEY_ID"],
             "AWS_SECRET_ACCESS_KEY": env["AWS_SECRET_ACCESS_KEY"], "AWS_DEFAULT_REGION": "us-east-1"}
    r = run_cli("ls", *flags, tmp_path / "fast", root, env=creds)
    assert r.returncode == 0 and "tier1" in r.stdout, r.stderr
    r = run_cli("inspect", f"{root}/step_00000010", *flags, env=creds)
    assert r.returncode == 0 and '"cli"' in r.stdout and f"{root}/step_00000010" in r.stdout, r.stderr
    r = run_cli("verify", f"{root}/step_00000020", env=env)
    assert r.returncode == 0 and r.stdout.startswith("OK:"), r.stderr
    r = run_cli("verify", "--all", root, env=env)
    assert r.returncode == 0 and r.stdout.count("OK:") == 2, r.stderr
    corrupt(s3_server, s3_bucket, "cli/step_00000020/data-00000.bin")
    r = run_cli("verify", f"{root}/step_00000020", env=env)
    assert r.returncode == 1 and "checksum mismatch" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("ls", url(s3_bucket, "cli"), "--storage-option", "max_attempts=x", env=env)
    assert r.returncode == 2
