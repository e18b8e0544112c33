"""The README's demo: SIGKILL a training run, resume it, compare bit for bit."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from multiproc import run_command

DEMO = Path(__file__).resolve().parents[1] / "examples" / "resume_demo.py"


@pytest.mark.timeout(300)
def test_resumed_run_is_bitwise_identical_to_uninterrupted(tmp_path):
    # Checkpoints at 25, 30, 35 (keep_last=3); killed after 37; resumed from 35 in the
    # third epoch (16 batches each), so the restored data order matters, and the
    # resumed steps 36-50 cross into the next epoch.
    proc = subprocess.run(
        [sys.executable, str(DEMO), "--framework", "torch", "--steps", "50", "--kill-at", "37",
         "--every", "5", "--workdir", str(tmp_path)],
        capture_output=True, text=True, timeout=280)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "SIGKILLed after step 37" in proc.stdout, output
    assert "checkpoints on disk: 25, 30, 35" in proc.stdout, output
    verdict = re.search(r"^bitwise identical: (\d+)/(\d+) steps after restart$",
                        proc.stdout, re.MULTILINE)
    assert verdict, output
    assert verdict.groups() == ("15", "15"), output
    assert "final parameters: identical" in proc.stdout, output


@pytest.mark.timeout(180)
def test_chainer_demo_resumes_bitwise(tmp_path):
    pytest.importorskip("uckpt_chainer")  # before chainer: the NumPy 2 shim
    pytest.importorskip("chainer")
    proc = subprocess.run(
        [sys.executable, str(DEMO), "--framework", "chainer", "--workdir", str(tmp_path)],
        capture_output=True, text=True, timeout=170)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    verdicts = re.findall(r"^bitwise identical: (\d+)/(\d+) steps after restart; "
                          r"final weights identical$", proc.stdout, re.MULTILINE)
    assert len(verdicts) == 2, output  # the custom loop and the Trainer
    assert all(same == total and int(total) > 0 for same, total in verdicts), output
    assert "all runs bitwise identical after restart" in proc.stdout, output


@pytest.mark.timeout(300)
def test_distributed_demo_resumes_bitwise_and_loads_on_half_the_ranks():
    # its ranks are killed with it on a timeout, which shows the phases it got through
    proc = run_command([sys.executable, DEMO.with_name("distributed_demo.py"),
                        "--ranks", "4", "--steps", "20"], timeout=280)
    output = proc.stdout + proc.stderr
    assert proc.returncodes == [0], output
    assert "rank 3 SIGKILLed at step 13" in proc.stdout, output
    assert "committed: steps [5, 10]; step 10 was written by 4 ranks" in proc.stdout, output
    assert "steps 11..20 bitwise identical to the reference run on every rank" in proc.stdout, output
    assert "loaded on 2 ranks: final model identical" in proc.stdout, output
