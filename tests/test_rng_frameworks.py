"""uckpt.RandomState() across processes: a framework whose RNG state is in the
checkpoint but that is not installed is skipped with a warning, not a crash."""
import subprocess
import sys

import torch  # noqa: F401  (imported: RandomState() captures torch's generator)

import uckpt


def test_rng_of_a_missing_framework_is_skipped_with_a_warning(tmp_path):
    uckpt.save(tmp_path / "ck", {"rng": uckpt.RandomState(), "step": 3})
    assert "torch" in uckpt.load(tmp_path / "ck")["rng"]
    code = f"""
import sys, random, warnings
sys.modules["torch"] = None  # as if torch were not installed
import uckpt
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    state = {{"rng": uckpt.RandomState(), "step": 0}}
    uckpt.load({str(tmp_path / 'ck')!r}, state)
print(state["step"], random.random())
for w in caught:
    print("WARNING", w.category.__name__, w.message)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[0] == "3"  # everything else was restored
    assert any(line.startswith("WARNING RuntimeWarning") and "'torch' random state" in line
               and "not restored" in line for line in lines[1:])
    # Python's generator was restored: the same draw as in this process after a restore
    import random

    uckpt.load(tmp_path / "ck", {"rng": uckpt.RandomState(), "step": None})
    assert float(lines[0].split()[1]) == random.random()
