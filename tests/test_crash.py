"""SIGKILL a process that saves in a loop at random moments; the newest committed
checkpoint must always load and verify, and no uncommitted one is ever returned."""
import json
import os
import random
import signal
import subprocess
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import incremental_common
import uckpt
from conftest import entries
from fork_server import Forked

KILLS = int(os.environ.get("UCKPT_CRASH_KILLS", "50"))
SAVER = Path(__file__).with_name("crash_saver.py")


def check_step(path: Path, step: int) -> None:
    a = np.zeros((512, 1024), np.float32)
    out = uckpt.load(path, {"a": a, "b": None, "small": None, "step": None})
    assert out["step"] == step and (a == step).all() and (out["b"] == -step).all()
    uckpt.verify(path)


def wait_for_a_step(root: Path, timeout: float = 120.0) -> None:
    """Wait until ``root`` holds a committed checkpoint (a ``step_*`` directory: the
    commit renames it into place), at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (root.exists() and any(p.startswith("step_") for p in entries(root))):
        assert time.monotonic() < deadline, f"no checkpoint reached {root} in {timeout} s"
        time.sleep(0.01)


def run_kills(forks, roots, extra_args, rnd, kills, lines=None, window=0.25, first_in=None):
    """Start the saver (forked by ``forks``, the fork server of conftest.py), kill it at a
    random moment (up to ``window`` seconds after it is ready), ``kills`` times; yield the
    newest step it reported as committed after each kill (``lines``: gets every line it
    printed, with its newline: the last line of a round has none where the kill tore it).
    ``first_in``: a root the saver copies to in the background (a durable tier); a round
    draws its kill moment only once that root holds a checkpoint, so a copy at idle
    priority on a loaded machine cannot miss every window."""
    last, interrupted = 0, 0
    for i in range(kills):
        p = forks.popen([SAVER, *roots, *extra_args], stdout=subprocess.PIPE)
        assert p.stdout.readline().strip() == "ready"
        printed = []
        if i == 0:  # make sure a first checkpoint exists
            printed.append(p.stdout.readline())
            assert printed[0].split()[:2] == ["committed", "1"]
            last = 1
        if first_in is not None:
            wait_for_a_step(first_in)
        time.sleep(rnd.uniform(0.0, window))
        p.send_signal(signal.SIGKILL)
        printed += p.stdout.read().splitlines(keepends=True)
        p.stdout.close()
        if lines is not None:
            lines.extend(printed)
        for line in printed:
            words = line.split()  # the last line may be torn by the kill: "committed"
            if len(words) == 2 and words[0] == "committed" and words[1].isdigit():
                last = max(last, int(words[1]))
        assert p.wait() == -signal.SIGKILL  # it was saving until the kill, not dead of an error
        interrupted += any(q.startswith(".") for r in roots if r.exists() for q in entries(r))
        yield last
    assert interrupted >= kills // 4, f"only {interrupted} kills landed inside a save"


@pytest.mark.timeout(600)
def test_sigkill_at_random_moments(tmp_path, saver_forks):
    root = tmp_path / "ck"
    previous = 0
    for last in run_kills(saver_forks, [root], [], random.Random(1234), KILLS):
        mgr = uckpt.CheckpointManager(root, role="writer")  # removes debris of the killed save
        latest = mgr.latest_step()
        # everything reported as committed is visible; at most one more (committed, not
        # printed) past what this round reported or the previous round left
        assert last <= latest <= max(last, previous) + 1
        previous = latest
        check_step(mgr.path(latest), latest)
        assert not [p for p in entries(root) if p.startswith(".")]
        mgr.close()


@pytest.mark.timeout(600)
def test_sigkill_async_saves_with_two_tiers(tmp_path, saver_forks):
    fast, durable = tmp_path / "fast", tmp_path / "durable"
    previous = 0
    for last in run_kills(saver_forks, [fast, durable], ["--async"], random.Random(99),
                          KILLS // 2, first_in=durable):
        mgr = uckpt.CheckpointManager(tiers=[fast, durable])
        # up to max_inflight saves committed but not yet reported
        assert last <= mgr.latest_step() <= max(last, previous) + 2
        previous = mgr.latest_step()
        for i in (0, 1):  # every committed copy on every tier is whole
            for s in uckpt.CheckpointManager(mgr.tiers[i].path).steps():
                check_step(mgr.path(s, i), s)
        holder = {"a": np.zeros((512, 1024), np.float32), "b": None, "small": None, "step": None}
        assert mgr.restore(holder) == mgr.latest_step() == holder["step"]
        mgr.close()
    assert uckpt.CheckpointManager(durable).steps(), "nothing ever reached the durable tier"


@pytest.mark.timeout(600)
def test_sigkill_during_incremental_saves_and_retention(tmp_path, saver_forks):
    """Kills land in incremental saves and in retention (keep_last=2 deletes after every
    save, newest first): every checkpoint left visible loads bitwise and verifies, its
    bases included, and restore gives the newest."""
    root = tmp_path / "ck"
    previous = 0
    for last in run_kills(saver_forks, [root], ["--incremental"], random.Random(77),
                          KILLS // 2):
        mgr = uckpt.CheckpointManager(root, role="writer")
        latest = mgr.latest_step()
        assert last <= latest <= max(last, previous) + 1
        previous = latest
        for s in mgr.steps():
            incremental_common.check(uckpt.load(mgr.path(s)), s)
            uckpt.verify(mgr.path(s))
        out = incremental_common.empty_state()
        assert mgr.restore(out) == latest
        incremental_common.check(out, latest)
        mgr.close()


@pytest.mark.timeout(900)
def test_sigkill_during_incremental_saves_with_bit_rot_in_bases(tmp_path, saver_forks):
    """The saver flips a bit in a base after every 4th save (re-read every 2 saves that
    refer to it) and is killed at random moments: every kept checkpoint loads bitwise,
    except those holding or referring to a flipped chunk that were committed before the
    damage was found (named in its warning, or not found yet) or were refused for it;
    restore gives the newest that loads."""
    root = tmp_path / "ck"
    lines, previous, seen = [], 0, 0
    damaged = set()  # (checkpoint, file, chunk offset) of every flip
    named = {}  # the same -> steps the warning of its detection named
    refused, acknowledged, after_detection, loaded, excused = set(), set(), set(), set(), set()
    nothing = 0  # rounds after which no kept checkpoint loads
    # long enough runs for flips, re-reads and detections to happen between the kills
    for last in run_kills(saver_forks, [root], ["--bitrot"], random.Random(2525), KILLS, lines,
                          window=1.0):
        detected_yet = False  # in this saver's run
        for line in lines[seen:]:
            words = line.split()
            if words[:1] == ["damaging"] and len(words) == 4:
                damaged.add((words[1], words[2], int(words[3])))
            elif words[:1] == ["detected"] and len(words) == 5:
                named[(words[1], words[2], int(words[3]))] = set(json.loads(words[4]))
                detected_yet = True
            elif words[:1] == ["refused"] and len(words) == 2:
                refused.add(int(words[1]))
            elif words[:1] == ["committed"] and len(words) == 2 and words[1].isdigit():
                acknowledged.add(int(words[1]))
                if detected_yet:
                    after_detection.add(int(words[1]))
        seen = len(lines)
        assert set(named) <= damaged, "damage found where no bit was flipped"
        mgr = uckpt.CheckpointManager(root, role="writer")
        latest = mgr.latest_step()
        assert last <= latest <= max(last, previous) + 1
        previous, intact = latest, []
        for s in mgr.steps():
            try:
                out = uckpt.load(mgr.path(s))
            except uckpt.errors.CorruptCheckpointError:
                name = mgr.path(s).name
                hit = {(c.base or name, c.file, c.offset) for e in mgr.manifest(s).arrays.values()
                       for c in e.chunks} & damaged
                assert hit, f"step {s} does not load, and holds no flipped bit"
                # committed before the damage was found (named, or not found yet), or never
                # acknowledged (refused for it, or killed before save() returned)
                assert s in refused or s not in acknowledged or \
                    all(s in named.get(d, {s}) for d in hit), \
                    f"step {s}, committed after the damage {sorted(hit)} was found, is lost"
                excused.add(s)
                continue
            incremental_common.check(out, s)  # an inexact load fails here
            intact.append(s)
            loaded.add(s)
        out = incremental_common.empty_state()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # restore warns of each damaged step it skips
            if intact:
                assert mgr.restore(out) == intact[-1]
                incremental_common.check(out, intact[-1])
            else:  # every kept step holds or refers to a flip not found before the kill
                with pytest.raises(uckpt.errors.CorruptCheckpointError,
                                   match="no checkpoint under .* reads back intact"):
                    mgr.restore(out)
                nothing += 1
        mgr.close()
    assert named and after_detection, "no damage was found, or no save followed a detection"
    print(f"\nbit rot under SIGKILL: {KILLS} kills, {len(acknowledged)} saves acknowledged "
          f"({len(after_detection)} after a detection in their run, "
          f"{len(after_detection & loaded)} of them checked and loaded bitwise), "
          f"{len(damaged)} bits flipped, {len(named)} found, {len(refused)} saves redone in "
          f"full, {len(loaded)} checkpoints loaded bitwise, {len(excused)} unreadable (each "
          "holding or referring to a flipped bit, committed before its detection or never "
          f"acknowledged); after {nothing} kills none was left to restore; 0 acknowledged "
          "after a detection lost, 0 inexact")


@pytest.mark.timeout(900)
def test_sigkill_while_rolling_back(tmp_path, saver_forks):
    """The rollback pattern: the saver goes back to an earlier step now and then (by
    rollback() or on_rollback="archive") and continues on a new line, and is SIGKILLed at
    random moments. After each kill a reader and then a new writer (which finishes a
    half-done rollback) restore: the newest acknowledged step of the live line is never
    lost, and the restore is bitwise the state of the line the writer was on."""
    from rollback_saver import empty, same
    from uckpt.storage.archive import INTENT_NAME

    root, lines, read = tmp_path / "ck", [], 0
    acked = {}  # step -> line: the acknowledged saves of the live line (and accepted ones)
    counts = dict(kills=0, saves=0, rollbacks=0, mid_rollback=0)
    for _ in run_kills(saver_forks, [root], ["--rollback"], random.Random(4321),
                       max(60, KILLS * 6 // 5), lines):
        counts["kills"] += 1
        events = [line.split() for line in lines[read:] if line.endswith("\n")]  # not torn
        read = len(lines)
        pending = None  # the saver goes on with the line of what it restored
        line_now = acked[max(acked)] if acked else None
        for words in events:
            kind, step, line = words[0], int(words[1]), int(words[2])
            if kind == "rollback":
                pending, line_now = (step, line), line
                counts["rollbacks"] += 1
            elif kind == "rolledback" or (kind == "committed" and pending and
                                          line == pending[1]):
                acked = {s: v for s, v in acked.items() if s <= pending[0]}
                pending = None
            if kind == "committed":
                acked[step], line_now = line, line
                counts["saves"] += 1
        counts["mid_rollback"] += (root / INTENT_NAME).exists()
        reader = uckpt.CheckpointManager(root, role="reader")  # sees the line as it will be
        seen = empty()
        seen_step = reader.restore(seen)
        writer = uckpt.CheckpointManager(root, role="writer")  # finishes a rollback
        out = empty()
        got = (writer.restore(out), out["line"])
        assert got == (seen_step, seen["line"]) and same(out, *got)
        assert not (root / INTENT_NAME).exists()
        newest = max(acked)
        allowed = {(newest, acked[newest])}  # what was acknowledged last ...
        if line_now is not None and (pending is None or line_now != pending[1]):
            allowed.add((newest + 1, line_now))  # ... or one more, committed, not printed
        if pending is not None:  # a rollback begun: done (its intent record) or not
            before = {s: v for s, v in acked.items() if s <= pending[0]}
            allowed |= {(pending[0], before[pending[0]]), (pending[0] + 1, pending[1])}
        assert got in allowed, f"restored {got}, acknowledged {sorted(acked.items())}, " \
            f"rollback begun: {pending}"
        if pending is not None and got[0] <= pending[0] + 1 and got != (newest, acked[newest]):
            acked = {s: v for s, v in acked.items() if s <= pending[0]}
        acked[got[0]] = got[1]
        writer.close()
    print("rollback crash run:", counts)
    assert counts["rollbacks"] >= counts["kills"] // 2 and counts["mid_rollback"] >= 1


def test_forked_saver_runs_as_a_fresh_interpreter_would(tmp_path, saver_forks, monkeypatch):
    """The fork server's child gets the test's argv, working directory and environment,
    runs as ``__main__``, and its exit code (or the signal that killed it) is reported."""
    script = tmp_path / "child.py"
    script.write_text("import os, signal, sys\n"
                      "print(__name__, sys.argv[1:], os.getcwd(), os.environ['CHILD_WORD'],\n"
                      "      sys.path[0], flush=True)\n"
                      "if sys.argv[1] == 'hang':\n    signal.pause()\n"
                      "sys.exit(int(sys.argv[1]))\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CHILD_WORD", "forked")
    p = saver_forks.popen([script, 3], stdout=subprocess.PIPE)
    assert isinstance(p, Forked)
    assert p.communicate(timeout=60) == \
        (f"__main__ ['3'] {tmp_path} forked {tmp_path}\n", None) and p.returncode == 3
    p = saver_forks.popen([script, "hang"], stdout=subprocess.PIPE)
    assert p.stdout.readline().startswith("__main__ ['hang']")
    p.send_signal(signal.SIGKILL)
    assert p.wait() == -signal.SIGKILL and p.stdout.read() == ""
    p.stdout.close()
    monkeypatch.setenv("UCKPT_COMM_TIMEOUT", "7")  # read by uckpt at import: not forked
    p = saver_forks.popen([script, 0], stdout=subprocess.PIPE)
    assert not isinstance(p, Forked) and p.communicate(timeout=60)[0].startswith("__main__")
