"""The writer lock of an object store root holds a lease (issue 25, section 4), against a
real SeaweedFS server (tests/s3_server.py): a SIGKILLed writer's lock is taken over once
its lease has expired; a live writer renews it and keeps others out; a writer that lost it
commits nothing; a manager learns at construction who writes the root; every hint names a
remedy that works. Leases are 3 s here (``knobs.lock_lease_s``, ``UCKPT_LOCK_LEASE_S``)."""
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import uckpt
import uckpt.knobs as knobs
from uckpt import errors
from uckpt.storage.checkpoint.lock import CONCURRENT_DIR, LOCK_NAME

pytestmark = pytest.mark.timeout(300)
LEASE_S = 3.0
# a writer that saves step 1, says its pid, then saves each step read from stdin until EOF
WRITER = """\
import os, sys, json, numpy as np, uckpt
m = uckpt.CheckpointManager(sys.argv[1], storage_options=json.loads(sys.argv[2]))
m.save(1, {"w": np.full(4, 1.0)})
print(os.getpid(), flush=True)
for line in sys.stdin:
    m.save(int(line), {"w": np.full(4, float(line))})
    print("saved", int(line), flush=True)
m.close()
"""


@pytest.fixture(autouse=True)
def short_lease(monkeypatch):
    monkeypatch.setattr(knobs, "lock_lease_s", LEASE_S)


def url(bucket, *parts):
    return "/".join([f"s3://{bucket}", *parts])


def start_writer(root, options):
    env = dict(os.environ, UCKPT_LOCK_LEASE_S=str(LEASE_S))
    p = subprocess.Popen([sys.executable, "-c", WRITER, root, json.dumps(options)], env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    pid = p.stdout.readline().strip()
    assert pid == str(p.pid), "the writer did not start"
    return p


def lock_record(server, bucket, key):
    return json.loads(server.client().get_object(Bucket=bucket, Key=key)["Body"].read())


def test_sigkilled_writer_is_taken_over_after_its_lease(s3_server, s3_bucket, s3_options, caplog):
    """21 of 21 restarts after a SIGKILL were refused at their first save; now the restart
    restores, and its first save takes the dead writer's lock over, logging whose it was."""
    root = url(s3_bucket, "killed")
    writer = start_writer(root, s3_options)
    holder = lock_record(s3_server, s3_bucket, f"killed/{LOCK_NAME}")
    writer.send_signal(signal.SIGKILL)
    writer.wait(30)
    caplog.set_level(logging.INFO, logger="uckpt")
    m = uckpt.CheckpointManager(root, storage_options=s3_options)  # role="auto"
    target = {"w": np.zeros(4)}
    assert m.restore(target) == 1 and (target["w"] == 1).all()
    m.save(2, {"w": np.full(4, 2.0)})  # no manual step: the dead writer's lease ran out
    took = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and
            "took over the writer lock" in r.getMessage()]
    assert len(took) == 1
    assert (f"took over the writer lock {root}/{LOCK_NAME} of process {writer.pid} on host "
            f"{socket.gethostname()} (job {holder['job']}, exclusive writer): its lease of "
            f"{LEASE_S:g} s was last renewed at ") in took[0]
    assert "that writer is taken for dead" in took[0]
    assert lock_record(s3_server, s3_bucket, f"killed/{LOCK_NAME}")["pid"] == os.getpid()
    m.close()
    assert uckpt.CheckpointManager(root, storage_options=s3_options).steps() == [1, 2]


def test_live_writer_renews_and_others_are_refused(s3_server, s3_bucket, s3_options):
    """A writer that lives renews its lease across many lease periods; a second writer is
    refused, told who holds the root and what works (not concurrent_writers=True, which an
    exclusive holder refuses too)."""
    root = url(s3_bucket, "live")
    writer = start_writer(root, s3_options)
    try:
        first = lock_record(s3_server, s3_bucket, f"live/{LOCK_NAME}")
        time.sleep(3 * LEASE_S)  # three lease periods
        with pytest.raises(errors.RootLockedError) as ei:
            uckpt.CheckpointManager(root, role="writer", storage_options=s3_options)
        e = ei.value
        assert str(e).startswith(
            f"checkpoint root {root!r} is held by process {writer.pid} on host "
            f"{socket.gethostname()} (exclusive writer since {first['since']}, job "
            f"{first['job']})\n  hint: only one job may write to a root: stop that job, or use "
            "another root; its lease runs until ")
        assert re.search(r"its lease runs until (\d\d:\d\d:\d\d) UTC and is renewed while "
                         r"it lives: if it is dead, wait until \1 UTC and save again", e.hint)
        assert e.hint.endswith(f"and save again (a new writer takes an expired lease over), or "
                               f"delete {root}/{LOCK_NAME} (e.g. `aws s3 rm {root}/{LOCK_NAME}`)")
        assert e.holder["pid"] == writer.pid and "concurrent_writers" not in e.hint
        with pytest.raises(errors.RootLockedError) as ei:  # a concurrent writer is refused too
            uckpt.CheckpointManager(root, role="writer", concurrent_writers=True,
                                    storage_options=s3_options)
        assert "exclusive writer" in str(ei.value) and "concurrent_writers" not in ei.value.hint
        assert lock_record(s3_server, s3_bucket, f"live/{LOCK_NAME}")["nonce"] != first["nonce"]
        writer.stdin.write("2\n")  # the live writer still holds the root and saves
        writer.stdin.flush()
        assert writer.stdout.readline().strip() == "saved 2"
    finally:
        writer.stdin.close()
        assert writer.wait(60) == 0
    assert uckpt.CheckpointManager(root, storage_options=s3_options).steps() == [1, 2]
    assert f"live/{LOCK_NAME}" not in {o["Key"] for o in s3_server.client().list_objects_v2(
        Bucket=s3_bucket, Prefix="live/").get("Contents", [])}  # released at close


def test_writer_that_lost_its_lease_commits_nothing(s3_server, s3_bucket, s3_options, caplog):
    """Another writer took the lock over (this one was taken for dead): this one's next save
    raises, commits nothing, and its close() leaves the new holder's lock alone."""
    root = url(s3_bucket, "lost")
    m = uckpt.CheckpointManager(root, storage_options=s3_options)
    m.save(1, {"w": np.full(4, 1.0)})
    other = {"host": "other-host", "pid": 4242, "job": "f00d", "mode": "exclusive",
             "since": "2026-01-01T00:00:00Z", "lease_s": 60, "nonce": "1"}
    s3_server.client().put_object(Bucket=s3_bucket, Key=f"lost/{LOCK_NAME}",
                                  Body=json.dumps(other).encode())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(r.levelno == logging.ERROR
                                                  for r in caplog.records):
        time.sleep(0.1)  # the next renewal (a third of a lease) finds the lock replaced
    with pytest.raises(errors.WriterLeaseLostError) as ei:
        m.save(2, {"w": np.full(4, 2.0)})
    assert isinstance(ei.value, errors.RootLockedError)
    assert str(ei.value).startswith(
        f"this process lost the writer lock {root}/{LOCK_NAME} of checkpoint root {root!r}: it "
        "now holds process 4242 on host other-host (exclusive writer since "
        "2026-01-01T00:00:00Z, job f00d) (at ")
    assert "it commits and deletes nothing more there" in str(ei.value)
    assert ei.value.hint.startswith("checkpoints committed before are kept")
    m.close()
    assert uckpt.CheckpointManager(root, storage_options=s3_options).steps() == [1]
    assert lock_record(s3_server, s3_bucket, f"lost/{LOCK_NAME}") == other


def test_construction_names_the_live_writer(s3_server, s3_bucket, s3_options, caplog):
    """A role='auto' manager learns at construction, not at its first save, that a live
    writer holds the root; role='reader' looks at nothing."""
    root = url(s3_bucket, "ctor")
    first = uckpt.CheckpointManager(root, role="writer", storage_options=s3_options)
    caplog.set_level(logging.INFO, logger="uckpt")
    uckpt.CheckpointManager(root, storage_options=s3_options).close()
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 1 and said[0].startswith(
        f"{root} is written by process {os.getpid()} on host {socket.gethostname()} "
        f"(exclusive writer since ")
    assert said[0].endswith("a save here is refused while that writer renews it (pass "
                            "role='reader' to only read)")
    caplog.clear()
    uckpt.CheckpointManager(root, role="reader", storage_options=s3_options).close()
    uckpt.CheckpointManager(root, storage_options=s3_options).close()  # told once per holder
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    first.close()


def test_lock_without_a_lease_names_the_object_to_delete(s3_server, s3_bucket, s3_options):
    """A lock written before leases never expires: the hint says to delete it, not to pass
    concurrent_writers=True (which it refuses as well)."""
    root = url(s3_bucket, "old")
    key = f"old/{LOCK_NAME}"
    s3_server.client().put_object(Bucket=s3_bucket, Key=key, Body=json.dumps(
        {"host": "gone-host", "pid": 77, "job": "abc", "mode": "exclusive",
         "since": "2026-01-01T00:00:00Z", "nonce": "00"}).encode())
    for shared in (False, True):
        with pytest.raises(errors.RootLockedError) as ei:
            uckpt.CheckpointManager(root, role="writer", concurrent_writers=shared,
                                    storage_options=s3_options)
        assert str(ei.value) == (
            f"checkpoint root {root!r} is held by process 77 on host gone-host (exclusive "
            "writer since 2026-01-01T00:00:00Z, job abc)\n  hint: that lock has no lease (a "
            "uckpt without lock leases wrote it) and never expires: if its holder is dead, "
            f"delete {root}/{LOCK_NAME} (e.g. `aws s3 rm {root}/{LOCK_NAME}`) and save again; "
            "otherwise stop it, or use another root")
    s3_server.client().delete_object(Bucket=s3_bucket, Key=key)  # the remedy named works
    with uckpt.CheckpointManager(root, role="writer", storage_options=s3_options) as m:
        m.save(1, {"w": np.zeros(2)})


def test_expired_shared_lock_is_removed_by_an_exclusive_writer(s3_server, s3_bucket,
                                                               s3_options, caplog):
    """Concurrent writers' locks hold the same lease: a dead one's keeps an exclusive
    writer out only until it has expired."""
    root = url(s3_bucket, "shared")
    key = f"shared/{CONCURRENT_DIR}/dead"
    s3_server.client().put_object(Bucket=s3_bucket, Key=key, Body=json.dumps(
        {"host": "gone-host", "pid": 78, "job": "dead", "mode": "shared",
         "since": "2026-01-01T00:00:00Z", "lease_s": 1, "nonce": "00"}).encode())
    caplog.set_level(logging.INFO, logger="uckpt")
    with uckpt.CheckpointManager(root, role="writer", storage_options=s3_options) as m:
        m.save(1, {"w": np.zeros(2)})
    assert any(r.levelno == logging.WARNING and r.getMessage().startswith(
        f"removed the writer lock {root}/{CONCURRENT_DIR}/dead of process 78 on host gone-host "
        "(job dead, shared writer): its lease of 1 s") for r in caplog.records)
    assert not s3_server.client().list_objects_v2(Bucket=s3_bucket, Prefix=key).get("Contents")


def test_writer_that_cannot_renew_stops_committing(s3_bucket, fault_proxy, caplog):
    """The store refuses every renewal for a whole lease (503s): the writer can no longer
    know that nobody took the root over, so it commits nothing more, even once the store
    answers again."""
    root = url(s3_bucket, "cut")
    options = {**fault_proxy.storage_options, "max_attempts": 1}
    m = uckpt.CheckpointManager(root, storage_options=options)
    m.save(1, {"w": np.full(4, 1.0)})
    fault_proxy.configure(rate=1.0, kinds=("503",), path_contains=LOCK_NAME)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(r.levelno == logging.ERROR
                                                  for r in caplog.records):
        time.sleep(0.1)  # renewals fail for a whole lease
    fault_proxy.configure(rate=0.0)
    with pytest.raises(errors.WriterLeaseLostError) as ei:
        m.save(2, {"w": np.full(4, 2.0)})
    assert f"this process lost the writer lock {root}/{LOCK_NAME} of checkpoint root " \
           f"{root!r}: no renewal succeeded for {LEASE_S:g} s (last error: " in str(ei.value)
    m.close()
    assert uckpt.CheckpointManager(root, storage_options=options).steps() == [1]


def test_two_writers_racing_for_an_expired_lock_one_wins(s3_server, s3_bucket, s3_options):
    """Of two writers taking over the same dead holder's lock at once, exactly one gets it
    (If-Match on the ETag both read); the other is refused, naming the winner."""
    import threading

    from uckpt.storage import open_store

    root = url(s3_bucket, "race")
    s3_server.client().put_object(Bucket=s3_bucket, Key=f"race/{LOCK_NAME}", Body=json.dumps(
        {"host": "gone-host", "pid": 79, "job": "dead", "mode": "exclusive",
         "since": "2026-01-01T00:00:00Z", "lease_s": 0.001, "nonce": "00"}).encode())
    time.sleep(3.0)  # Last-Modified + lease + 1 s, in whole seconds: expired on the store's clock
    locks = [open_store(root, s3_options).writer_lock(job, False) for job in ("j1", "j2")]
    results = [None, None]
    go = threading.Barrier(2)

    def take(i):
        go.wait()
        results[i] = locks[i].try_acquire()

    threads = [threading.Thread(target=take, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    try:
        assert sorted(r is None for r in results) == [False, True]
        winner = results.index(None)
        loser = locks[1 - winner]
        assert results[1 - winner]["job"] == locks[winner].job
        assert str(loser.refusal()).startswith(
            f"checkpoint root {root!r} is held by process {os.getpid()} on host "
            f"{socket.gethostname()} (exclusive writer since ")
        assert lock_record(s3_server, s3_bucket, f"race/{LOCK_NAME}")["job"] == locks[winner].job
    finally:
        for lock in locks:
            lock.release()
