"""CPU cost of ``import uckpt`` and of a first NumPy ``uckpt.save``, beyond ``import numpy``.

Each case runs in a fresh interpreter, the cases alternating, ``--repeat`` times; the CPU
(user + system) of each child comes from ``getrusage(RUSAGE_CHILDREN)``, so a loaded,
shared machine moves the figures less than wall time would. Prints the medians (ms) and
the load average. The interpreter's ``PYTHONPATH`` picks which uckpt is measured.

    PYTHONPATH=$PWD/src python benchmarks/bench_import.py --repeat 11
"""
import argparse
import os
import resource
import statistics
import subprocess
import sys

CASES = {
    "numpy": "import numpy",
    "import uckpt": "import numpy, uckpt",
    "save": ("import numpy as np, uckpt, tempfile, os; "
             "uckpt.save(os.path.join(tempfile.mkdtemp(), 'c'), {'a': np.ones(3)})"),
}


def child_cpu_ms(code: str) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", code], check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return 1000 * (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=11)
    args = parser.parse_args()
    runs = {name: [] for name in CASES}
    for _ in range(args.repeat):
        for name, code in CASES.items():
            runs[name].append(child_cpu_ms(code))
    median = {name: statistics.median(v) for name, v in runs.items()}
    base = median.pop("numpy")
    print(f"numpy alone: {base:.0f} ms CPU; load average {os.getloadavg()}")
    for name, value in median.items():
        print(f"{name}: {value - base:.0f} ms CPU beyond import numpy (median of {args.repeat})")


if __name__ == "__main__":
    main()
