"""Rollbacks (issue 25, section 1): a save whose step is not above the newest step of the
root is refused, or the newer steps are moved into an archive; never is a save deleted by
its own retention, and a restart resumes the line the writer was on."""
import json
import logging

import numpy as np
import pytest

import incremental_common
import uckpt
from conftest import entries
from uckpt import errors
from uckpt.cli.scan import scan

KEEP = uckpt.KeepLast(3) | uckpt.KeepEvery(5)


def state(step, line=0):
    """The state of ``step`` on training line ``line`` (a rollback starts another)."""
    return {"w": np.full((64, 32), step + 1000 * line, np.float32),
            "b": np.arange(10, dtype=np.int64) * step, "step": step, "line": line}


def empty():
    return {"w": np.zeros((64, 32), np.float32), "b": np.zeros(10, np.int64), "step": None,
            "line": None}


def check(out, step, line=0):
    want = state(step, line)
    assert out["step"] == step and out["line"] == line
    assert np.array_equal(out["w"], want["w"]) and np.array_equal(out["b"], want["b"])


def ten_steps(root, **kw):
    with uckpt.CheckpointManager(root, keep=KEEP, **kw) as m:
        for s in range(1, 11):
            m.save(s, state(s))
    assert m.steps() == [5, 8, 9, 10]


def committed_in_scan(root):
    return sorted(f.step for f in scan(root) if f.status == "committed")


# --- the example ------------------------------------------------------------------------
def test_a_save_below_the_newest_step_is_refused_and_nothing_is_written(tmp_path):
    root = tmp_path / "ck"
    ten_steps(root)
    before = entries(root)
    m = uckpt.CheckpointManager(root, keep=KEEP)
    out = empty()
    assert m.restore(out, step=5) == 5
    with pytest.raises(errors.StepOrderError) as e:
        m.save(6, state(6, line=1))
    assert isinstance(e.value, ValueError)
    msg = str(e.value)
    assert "save of step 6 refused" in msg and "newer steps 8, 9, 10" in msg
    assert "rollback(to=5)" in msg and "on_rollback='archive'" in msg and "new root" in msg
    assert e.value.newer == [8, 9, 10]
    assert entries(root) == before and m.steps() == [5, 8, 9, 10]
    with pytest.raises(errors.StepOrderError, match="rollback\\(to=4\\)"):  # 5 itself exists
        m.save(5, state(5, line=1), overwrite=False)
    with pytest.raises(errors.StepOrderError, match="rollback\\(to=5\\)"):
        m.save(5, state(5, line=1), overwrite=True)
    m.close()
    assert entries(root) == before


@pytest.mark.parametrize("how", ["rollback", "archive"])
def test_rollback_keeps_the_new_line_and_archives_the_old(tmp_path, how, caplog):
    root = tmp_path / "ck"
    ten_steps(root)
    m = uckpt.CheckpointManager(root, keep=KEEP, on_rollback="archive" if how == "archive"
                                else "refuse")
    out = empty()
    assert m.restore(out, step=5) == 5
    with caplog.at_level(logging.WARNING, logger="uckpt.manager.rollback"):
        if how == "rollback":
            assert m.rollback(to=5) == [8, 9, 10]
        p6 = m.save(6, state(6, line=1))
    assert any("rolled back to step 5" in r.message and "[8, 9, 10]" in r.message and
               "rollback_0001" in r.message for r in caplog.records)
    assert m.steps() == [5, 6]
    p7 = m.save(7, state(7, line=1))
    assert (p6 / "manifest.json").exists() and (p7 / "manifest.json").exists()
    assert m.steps() == [5, 6, 7] and m.latest_step() == 7
    m.close()
    # a restart resumes the new line; the old one is kept whole, listed only when asked
    m = uckpt.CheckpointManager(root, keep=KEEP)
    out = empty()
    assert m.restore(out) == 7
    check(out, 7, line=1)
    assert m.archived() == {"rollback_0001": [8, 9, 10]}
    for s in (8, 9, 10):
        check(uckpt.load(m.path(s, archive="rollback_0001")), s)
        uckpt.verify(m.path(s, archive="rollback_0001"))
    assert committed_in_scan(root) == [5, 6, 7]  # what `uckpt ls ROOT` lists
    assert committed_in_scan(root / "rollback_0001") == [8, 9, 10]
    # the new line goes on under its own retention: 8 of the new line is a new checkpoint
    m.save(8, state(8, line=1))
    assert m.steps() == [5, 6, 7, 8]
    check(uckpt.load(m.path(8)), 8, line=1)
    check(uckpt.load(m.path(8, archive="rollback_0001")), 8)
    m.close()


def test_overwrite_of_an_older_step_archives_the_newer_ones(tmp_path):
    """With on_rollback='archive', overwriting step 5 replaces it (the user asked) and
    archives 8, 9, 10; a save of an existing step without overwrite archives that step
    too; the default still refuses the newest step without overwrite."""
    root = tmp_path / "ck"
    ten_steps(root)
    with uckpt.CheckpointManager(root, keep=KEEP, on_rollback="archive") as m:
        m.save(5, state(5, line=1), overwrite=True)
        assert m.steps() == [5] and m.archived() == {"rollback_0001": [8, 9, 10]}
        check(uckpt.load(m.path(5)), 5, line=1)
        m.save(5, state(5, line=2))  # not above 5: 5 (of line 1) is archived, not replaced
        assert m.steps() == [5] and m.archived()["rollback_0002"] == [5]
        check(uckpt.load(m.path(5, archive="rollback_0002")), 5, line=1)
        check(uckpt.load(m.path(5)), 5, line=2)
    with uckpt.CheckpointManager(root, keep=KEEP) as m:
        with pytest.raises(errors.CheckpointExistsError):
            m.save(5, state(5, line=3))


@pytest.mark.parametrize("async_save", [False, True])
def test_second_stage_counting_from_one_again(tmp_path, async_save):
    root = tmp_path / "ck"
    with uckpt.CheckpointManager(root, keep_last=3, async_save=async_save) as m:
        for s in range(1, 6):
            m.save(s, state(s))
    with uckpt.CheckpointManager(root, keep_last=3, async_save=async_save) as m:
        with pytest.raises(errors.StepOrderError, match="newer steps 3, 4, 5"):
            m.save(1, state(1, line=1))
        m.wait()
        assert m.steps() == [3, 4, 5]
    with uckpt.CheckpointManager(root, keep_last=3, async_save=async_save,
                                 on_rollback="archive") as m:
        for s in range(1, 6):
            m.save(s, state(s, line=1))
            m.wait()
            assert m.latest_step() == s  # acknowledged, and still there
    m = uckpt.CheckpointManager(root)
    assert m.steps() == [3, 4, 5] and m.archived() == {"rollback_0001": [3, 4, 5]}
    out = empty()
    assert m.restore(out) == 5
    check(out, 5, line=1)
    for s in (3, 4, 5):
        check(uckpt.load(m.path(s)), s, line=1)
        check(uckpt.load(m.path(s, archive="rollback_0001")), s)


def test_uckpt_ls_lists_archived_steps_only_when_asked(tmp_path, capsys):
    from uckpt.cli.main import main

    root = tmp_path / "ck"
    ten_steps(root)
    with uckpt.CheckpointManager(root, keep=KEEP) as m:
        m.rollback(to=5)
    assert main(["ls", str(root)]) == 0
    live = capsys.readouterr().out
    assert "step_00000005" in live and "step_00000008" not in live
    assert main(["ls", str(root), "--archived", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["archives"]
    assert {name: [(f["step"], f["status"]) for f in found]
            for name, found in listed.items()} == \
        {"rollback_0001": [(8, "committed"), (9, "committed"), (10, "committed")]}
    assert main(["ls", str(tmp_path / "missing"), "--archived"]) == 1


# --- incremental saves, tiers -------------------------------------------------------------
def test_incremental_saves_across_a_rollback(tmp_path):
    """Archived incremental checkpoints keep their bases (those of the live line are linked
    into the archive): they read back bitwise after the live line's retention deleted the
    bases; the first save after a rollback refers to nothing archived."""
    root = tmp_path / "ck"
    with incremental_common.manager(root, keep_last=2, incremental=True, full_every=100) as m:
        for s in range(1, 7):
            m.save(s, incremental_common.state(s))
        old = m.steps()
        assert 1 in old and m.manifest(6).bases  # 6 refers to the full save of step 1
    with incremental_common.manager(root, keep_last=2, incremental=True, full_every=100) as m:
        out = incremental_common.empty_state()
        assert m.restore(out, step=1) == 1
        moved = m.rollback(to=1)
        assert moved == [s for s in old if s > 1]
        for s in range(2, 7):  # the new line: every row negated
            t = -incremental_common.table(s)
            m.save(s, incremental_common.state(s, t))
            if s == 2:
                assert m.manifest(2).bases == {}
        assert 1 not in m.steps()  # the live line's retention deleted the old base
        for s in m.steps():
            got = uckpt.load(m.path(s))
            assert np.array_equal(got["table"], -incremental_common.table(s))
        for s in moved:
            where = m.path(s, archive="rollback_0001")
            incremental_common.check(uckpt.load(where), s)
            uckpt.verify(where)
    assert sorted(p.name for p in (root / "rollback_0001").iterdir()) == \
        [f"step_{s:08d}" for s in [1] + moved]


def test_two_tiers_roll_back_together(tmp_path):
    fast, durable = tmp_path / "fast", tmp_path / "durable"
    tiers = lambda: [uckpt.Tier(fast, keep=2), uckpt.Tier(durable, keep=KEEP)]  # noqa: E731
    with uckpt.CheckpointManager(tiers=tiers()) as m:
        for s in range(1, 11):
            m.save(s, state(s))
    with uckpt.CheckpointManager(tiers=tiers()) as m:
        out = empty()
        assert m.restore(out, step=5) == 5 and m.tiers_of(5) == ["durable"]
        with pytest.raises(errors.StepOrderError, match="newer steps 8, 9, 10"):
            m.save(6, state(6, line=1))
        assert m.rollback(to=5) == [8, 9, 10]
        m.save(6, state(6, line=1))
        m.save(7, state(7, line=1))
        m.wait()
        assert uckpt.CheckpointManager(fast).steps() == [6, 7]
        assert uckpt.CheckpointManager(durable).steps() == [5, 6, 7]
        assert uckpt.CheckpointManager(fast).archived() == {"rollback_0001": [9, 10]}
        assert m.archived() == {"rollback_0001": [8, 9, 10]}
    m = uckpt.CheckpointManager(tiers=tiers())
    out = empty()
    assert m.restore(out) == 7
    check(out, 7, line=1)
    for s in (8, 9, 10):
        check(uckpt.load(m.path(s, tier=1, archive="rollback_0001")), s)


def test_s3_tier_rolls_back_too(tmp_path, s3_server, s3_bucket, s3_options):
    remote = f"s3://{s3_bucket}/run"

    def tiers():
        return [uckpt.Tier(tmp_path / "fast", keep=2), uckpt.Tier(remote, keep=KEEP)]

    with uckpt.CheckpointManager(tiers=tiers(), storage_options=s3_options) as m:
        for s in range(1, 11):
            m.save(s, state(s))
    m = uckpt.CheckpointManager(tiers=tiers(), storage_options=s3_options,
                                on_rollback="archive")
    out = empty()
    assert m.restore(out, step=5) == 5
    m.save(6, state(6, line=1))
    m.save(7, state(7, line=1))
    m.close()
    m = uckpt.CheckpointManager(tiers=tiers(), storage_options=s3_options)
    assert m.steps() == [5, 6, 7]
    assert uckpt.CheckpointManager(remote, storage_options=s3_options).steps() == [5, 6, 7]
    assert m.archived() == {"rollback_0001": [8, 9, 10]}
    for s in (8, 9, 10):
        where = m.path(s, tier=1, archive="rollback_0001")
        assert where == f"{remote}/rollback_0001/step_{s:08d}"
        check(uckpt.load(where, storage_options=s3_options), s)
    out = empty()
    assert m.restore(out) == 7
    check(out, 7, line=1)
    keys = [o["Key"] for o in s3_server.client().list_objects_v2(
        Bucket=s3_bucket, Prefix="run/")["Contents"]]
    assert not [k for k in keys if k.startswith("run/step_00000008")]
    assert "run/.uckpt-rollback.json" not in keys


@pytest.mark.parametrize("size", [2, 3])
def test_rollback_on_thread_ranks_sharing_a_root(tmp_path, size):
    """rollback() and the refusal are collective: every rank refuses alike, and ranks that
    share the root move its steps together without tripping over each other."""
    from uckpt.testing import run_ranks

    root = tmp_path / "ck"
    ten_steps(root)

    def body(comm):
        with uckpt.CheckpointManager(root, comm=comm, keep=KEEP) as m:
            out = empty()
            assert m.restore(out, step=5) == 5
            with pytest.raises(errors.StepOrderError, match="newer steps 8, 9, 10"):
                m.save(6, state(6, line=1))
            moved = m.rollback(to=5)
            m.save(6, state(6, line=1))
            m.save(7, state(7, line=1))
            return moved, m.steps(), m.archived()

    for outcome in run_ranks(size, body):
        assert outcome == ([8, 9, 10], [5, 6, 7], {"rollback_0001": [8, 9, 10]})
    assert entries(root) == ["rollback_0001", "step_00000005", "step_00000006",
                             "step_00000007"]
    check(uckpt.load(root / "step_00000007"), 7, line=1)


# --- a rollback killed midway --------------------------------------------------------------------
def test_a_rollback_killed_midway_hides_the_old_line_and_the_next_writer_finishes_it(tmp_path):
    """What a kill after the intent record and one of three moves leaves (made with the
    store's own steps): readers already see the rolled-back line; the next writer finishes
    the moves before its first save; nothing is lost."""
    from uckpt.storage.archive import INTENT_NAME, encode_intent

    root = tmp_path / "ck"
    ten_steps(root)
    store = uckpt.CheckpointManager(root).tiers[0].store
    store.put_record(INTENT_NAME, encode_intent(to=5, archive="rollback_0001", steps=[8, 9, 10]))
    assert store.archive("step_00000010", "rollback_0001")
    reader = uckpt.CheckpointManager(root, role="reader")
    assert reader.steps() == [5] and reader.latest_step() == 5
    out = empty()
    assert reader.restore(out) == 5
    assert (root / "step_00000009" / "manifest.json").exists()  # not yet moved
    m = uckpt.CheckpointManager(root, keep=KEEP, role="writer")  # finishes the rollback
    assert not (root / INTENT_NAME).exists() and not (root / "step_00000009").exists()
    assert m.archived() == {"rollback_0001": [8, 9, 10]}
    m.save(6, state(6, line=1))
    assert m.steps() == [5, 6]
    for s in (8, 9, 10):
        check(uckpt.load(m.path(s, archive="rollback_0001")), s)
    m.close()


def test_s3_rollback_killed_midway_is_finished(tmp_path, s3_server, s3_bucket, s3_options):
    """In an object store (no rename): what kills leave, made with the store's own steps: a
    step copied into the archive but not yet deleted here (committed in both places), one
    not moved at all. Readers see the rolled-back line; the next writer finishes."""
    from uckpt.storage.archive import INTENT_NAME, encode_intent

    root = f"s3://{s3_bucket}/run"
    with uckpt.CheckpointManager(root, keep=KEEP, storage_options=s3_options) as m:
        for s in range(1, 11):
            m.save(s, state(s))
    store = m.tiers[0].store
    store.blob.client.copy_limit = 1024  # this store's copies of larger objects: UploadPartCopy
    store.put_record(INTENT_NAME, encode_intent(to=5, archive="rollback_0001", steps=[8, 9, 10]))
    assert store.archive("step_00000010", "rollback_0001")
    assert store.archive("step_00000009", "rollback_0001", keep=True)  # killed before deleting
    reader = uckpt.CheckpointManager(root, role="reader", storage_options=s3_options)
    out = empty()
    assert reader.steps() == [5] and reader.restore(out) == 5
    m = uckpt.CheckpointManager(root, keep=KEEP, role="writer", storage_options=s3_options)
    assert store.record(INTENT_NAME) is None
    assert m.archived() == {"rollback_0001": [8, 9, 10]}
    m.save(6, state(6, line=1))
    assert m.steps() == [5, 6]
    keys = [o["Key"] for o in s3_server.client().list_objects_v2(
        Bucket=s3_bucket, Prefix="run/step_")["Contents"]]
    assert sorted({k.split("/")[1] for k in keys}) == ["step_00000005", "step_00000006"]
    for s in (8, 9, 10):
        check(uckpt.load(m.path(s, archive="rollback_0001"), storage_options=s3_options), s)
    m.close()
