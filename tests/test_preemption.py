"""SIGTERM during training with the signal policy: a final checkpoint, exit 0, and
the next run resumes from it and ends exactly where an uninterrupted run ends."""
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import uckpt

TRAINER = str(Path(__file__).with_name("preempt_trainer.py"))


def run(fast, durable, total):
    return subprocess.run([sys.executable, TRAINER, str(fast), str(durable), str(total)],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_signal_saves_then_exits_cleanly_and_resumes(tmp_path, sig):
    reference = run(tmp_path / "ref_fast", tmp_path / "ref_durable", 150)
    assert reference.returncode == 0, reference.stderr
    fast, durable = tmp_path / "fast", tmp_path / "durable"
    p = subprocess.Popen([sys.executable, TRAINER, str(fast), str(durable), "150"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in p.stdout:
        if line.split() == ["step", "37"]:
            p.send_signal(sig)
            break
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert "after a preemption signal; exiting" in err
    final = max([37] + [int(x.split()[1]) for x in out.splitlines() if x.startswith("step")])
    assert 37 <= final < 100  # not a scheduled save: the signal made it
    # the final checkpoint is committed on both tiers before the process exits
    assert uckpt.CheckpointManager(fast).steps() == [final]
    assert uckpt.CheckpointManager(durable).steps() == [final]
    resumed = run(fast, durable, 150)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from {final}" in resumed.stdout
    # the restart continues exactly: same final state as the uninterrupted run
    assert resumed.stdout.splitlines()[-1] == reference.stdout.splitlines()[-1]
