"""Peak resident memory of one operation, measured in a fresh process (Linux).

:func:`peak` runs ``setup`` (Python source: imports, the state the operation needs) in a
new interpreter, resets the kernel's high-water mark (``/proc/self/clear_refs``), runs
``op``, and returns what the peak (``VmHWM``) rose above the resident memory (``VmRSS``)
held before ``op``, with the seconds ``op`` took. What ``setup`` built (a state to save,
destination arrays to load into) is therefore not counted: the peak is the memory the
operation needs *beyond* it. Every allocator counts (NumPy, Zstandard, h5py, threads'
stacks as they are touched), not only Python's. ``limit`` caps the child's address space
(``RLIMIT_AS``) before ``setup`` runs, so an operation that would need more fails there::

    from uckpt.testing.peaks import peak

    got = peak("import numpy as np, uckpt\\nstate = {'w': np.ones(1 << 26)}",
               "uckpt.save(dst, state)", dst=str(tmp_path / "c"))
    got.mib, got.seconds

Keyword arguments become string variables of both snippets. Used by
``tests/test_memory_budgets.py`` and ``benchmarks/bench_memory.py``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Mapping, Optional

_CHILD = r"""
import json, resource, sys, time
spec = json.loads(sys.argv[1])
if spec["limit"]:
    resource.setrlimit(resource.RLIMIT_AS, (spec["limit"], spec["limit"]))

def _status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024

scope = dict(spec["args"])
exec(spec["setup"], scope)
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # VmHWM := VmRSS: the peak from here on
before, start = _status("VmRSS"), time.perf_counter()
out = {}
try:
    exec(spec["op"], scope)
except BaseException as e:
    out["error"] = f"{type(e).__name__}: {e}"[:1000]
out.update(seconds=time.perf_counter() - start, peak=_status("VmHWM") - before,
           before=before, vmpeak=_status("VmPeak"))
with open(spec["result"], "w") as f:
    json.dump(out, f)
"""


@dataclass(frozen=True)
class Peak:
    """What one measured operation did."""

    peak: int  #: bytes the resident high-water mark rose above the resident memory before
    seconds: float
    before: int  #: resident bytes before the operation (the interpreter and ``setup``)
    vmpeak: int  #: the most address space the process held (``VmPeak``)
    error: Optional[str] = None  #: ``"Type: message"`` of what the operation raised

    @property
    def mib(self) -> float:
        return self.peak / (1 << 20)


def peak(setup: str, op: str, *, limit: int = 0, env: Optional[Mapping[str, str]] = None,
         timeout: float = 600, **args: str) -> Peak:
    """Run ``setup`` then ``op`` in a fresh ``sys.executable`` (with ``RLIMIT_AS`` =
    ``limit`` bytes when given, environment ``env``, default this one's) and return the
    peak of ``op`` (see the module docstring). A child that dies (a signal, an exit
    outside ``op``) raises ``RuntimeError`` with its stderr; what ``op`` raises is
    returned in :attr:`Peak.error`."""
    with tempfile.TemporaryDirectory(prefix="uckpt-peak-") as where:
        result = os.path.join(where, "result.json")  # (not stdout, which ``op`` may use)
        spec = json.dumps({"setup": setup, "op": op, "limit": limit, "args": args,
                           "result": result})
        r = subprocess.run([sys.executable, "-c", _CHILD, spec], capture_output=True,
                           text=True, env=dict(os.environ if env is None else env),
                           timeout=timeout)
        if r.returncode != 0 or not os.path.exists(result):
            raise RuntimeError(f"the measuring process exited {r.returncode}: "
                               f"{r.stderr[-3000:]}")
        with open(result) as f:
            return Peak(**json.load(f))
