"""The fsyncs of a one-rank local save, counted in a real process: those of
docs/format.md section 3's commit rule and no more, the temporary directory's entries
made durable before its rename (:meth:`uckpt.storage.blob.base.BlobStore.stage`).

Counted by ``strace`` where it can trace, else by wrapping ``os.fsync`` in the saving
process (every fsync of uckpt goes through it)."""
import os
import re
import shutil
import subprocess
import sys

import pytest

SAVE = """
import sys, numpy as np, uckpt
uckpt.save(sys.argv[1], {"a": np.arange(1000, dtype=np.float32), "b": {"c": np.ones((3, 4))}})
"""
# the fallback: each fsync as the path of its descriptor (a directory by its name then)
WRAPPED = """
import os, sys
_fsync, seen = os.fsync, []
def fsync(fd):
    seen.append(os.readlink(f"/proc/self/fd/{fd}"))
    _fsync(fd)
os.fsync = fsync
""" + SAVE + """
with open(sys.argv[2], "w") as f:
    f.write("".join(f"fsync {p}\\n" for p in seen))
"""
_CALL = re.compile(r"^\d+\s+(fsync|fdatasync|renameat2)\((\d+)<([^>]*)>(?:, \"([^\"]*)\")?")


def _strace_works(tmp_path) -> bool:
    if shutil.which("strace") is None:
        return False
    probe = subprocess.run(["strace", "-f", "-o", str(tmp_path / "probe"), "true"],
                           capture_output=True, check=False)
    return probe.returncode == 0


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The root of one save and its events (:func:`_events`), shared by the tests."""
    tmp_path = tmp_path_factory.mktemp("fsyncs")
    return str(tmp_path / "root"), _events(tmp_path)


def _events(tmp_path):
    """(call, path) of each fsync and directory rename of one save into ``root/ck``:
    the path of an fsync's descriptor, the source directory of a rename."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    target, trace = str(tmp_path / "root" / "ck"), tmp_path / "trace"
    if _strace_works(tmp_path):
        subprocess.run(["strace", "-f", "-y", "-o", str(trace), "-e",
                        "trace=fsync,fdatasync,renameat2", sys.executable, "-c", SAVE, target],
                       env=env, check=True)
        found = [_CALL.match(line) for line in trace.read_text().splitlines()]
        return [(m[1], m[3] if m[1] != "renameat2" else os.path.join(m[3], m[4]))
                for m in found if m]
    subprocess.run([sys.executable, "-c", WRAPPED, target, str(trace)], env=env, check=True)
    return [tuple(line.split(" ", 1)) for line in trace.read_text().splitlines()]


def test_one_rank_local_save_makes_four_fsyncs(saved):
    """The data file, the manifest, the temporary directory (once, before its rename)
    and the root after the rename: 8f13f2b's count (the blob layer made 7)."""
    root, events = saved
    syncs = [path for call, path in events if call in ("fsync", "fdatasync")]
    assert len(syncs) == 4, syncs
    assert sorted(os.path.dirname(p) == root for p in syncs[:3]) == [False, False, True], \
        syncs  # the two files, then their directory
    assert syncs[3] == root, syncs


def test_temporary_directory_durable_before_its_rename(saved):
    """The temporary directory is fsynced once, after both of its objects and before
    it becomes the checkpoint (still under its temporary name when fsynced)."""
    root, events = saved
    tmp_dirs = [p for call, p in events if call == "fsync" and os.path.dirname(p) == root]
    assert len(tmp_dirs) == 1 and ".uckpt-tmp-" in tmp_dirs[0], events
    assert not os.path.exists(tmp_dirs[0]) and os.path.isfile(os.path.join(root, "ck",
                                                                           "manifest.json"))
    order = [p for _call, p in events]
    files = [i for i, p in enumerate(order) if os.path.dirname(p) == tmp_dirs[0]]
    assert len(files) == 2 and max(files) < order.index(tmp_dirs[0]), events
    renames = [i for i, (call, _p) in enumerate(events) if call == "renameat2"]
    assert all(order.index(tmp_dirs[0]) < i for i in renames), events
