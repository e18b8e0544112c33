"""Odd entries in a checkpoint directory: FIFOs, devices, directories, symlinks, unreadable
files, sizes that lie. Reading never hangs, never follows a symlink out of the directory,
never allocates beyond what the files hold, and every failure is a specific uckpt error that
makes ``CheckpointManager.restore`` fall back to an older checkpoint."""
import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import uckpt
from uckpt import errors
from uckpt.storage import fsutil
from deep_tree import deep_directory
from test_bad_inputs import edit_manifest

pytestmark = pytest.mark.timeout(60)  # a hang fails its test instead of blocking the run

DATA = "data-00000.bin"
MANIFEST = "manifest.json"
STATE = {"w": np.arange(64, dtype=np.float32).reshape(8, 8), "epoch": 3}


def state(step):
    return {"w": np.full((8, 8), step, dtype=np.float32), "epoch": step}


@pytest.fixture
def ck(tmp_path):
    return uckpt.save(tmp_path / "ck", STATE)


@pytest.fixture
def outside(tmp_path):
    """A valid checkpoint elsewhere, whose files a symlink may point to."""
    return uckpt.save(tmp_path / "elsewhere", STATE)


def replace(path, make):
    """Replace the file at ``path`` by what ``make(path)`` creates there."""
    os.unlink(path)
    make(path)


def fifo(path):
    os.mkfifo(path)


def directory(path):
    os.mkdir(path)


def null_device(path):
    try:
        os.mknod(path, 0o600 | 0o020000, os.makedev(1, 3))  # what /dev/null is
    except PermissionError:
        pytest.skip("creating a device node needs CAP_MKNOD")


def run_python(code, *args, timeout=60, preexec_fn=None):
    """Run ``code`` in a fresh interpreter (hard timeout); returns the CompletedProcess."""
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, preexec_fn=preexec_fn,
                          env=dict(os.environ, PYTHONWARNINGS="ignore"))


LOAD_REPORT = """
import json, sys
import uckpt
try:
    uckpt.load(sys.argv[1])
    out = {"error": None}
except Exception as e:
    out = {"error": type(e).__name__, "message": str(e), "errno": getattr(e, "errno", None)}
# VmHWM: this process's own peak; ru_maxrss also counts the parent it was forked from
# (Linux carries the high-water mark across exec), which is the whole pytest process
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM:")][0].split()[1]
out["maxrss_mib"] = int(hwm) / 1024
print(json.dumps(out))
"""


def load_in_child(path, preexec_fn=None):
    """``uckpt.load(path)`` in a subprocess under a 3 GiB address-space limit (a regression
    fails there instead of exhausting the machine); returns its error and peak RSS."""
    def limited():
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
        if preexec_fn:
            preexec_fn()
    proc = run_python(LOAD_REPORT, path, preexec_fn=limited)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def run_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "uckpt.cli.main", *map(str, args)],
                          capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONWARNINGS="ignore", **(env or {})))


def assert_cli_error(proc, *fragments):
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "uckpt: error: " in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    for f in fragments:
        assert f in proc.stderr, (f, proc.stderr)


# -- FIFOs: nothing blocks ------------------------------------------------------------------
def test_fifo_as_data_file_load(ck):
    replace(ck / DATA, fifo)
    with pytest.raises(errors.CorruptCheckpointError, match="FIFO") as ei:
        uckpt.load(ck)
    assert ei.value.path == str(ck / DATA)
    assert "regular file" in str(ei.value) and "hint:" in str(ei.value)


def test_fifo_as_manifest_load(ck):
    replace(ck / MANIFEST, fifo)
    with pytest.raises(errors.NotACheckpointError, match="manifest .* is a FIFO"):
        uckpt.load(ck)
    with pytest.raises(errors.NotACheckpointError, match="FIFO"):
        uckpt.manifest(ck)


@pytest.mark.parametrize("name", [DATA, MANIFEST])
def test_fifo_verify_cli_exits_1(ck, name):
    replace(ck / name, fifo)
    assert_cli_error(run_cli("verify", ck), name, "FIFO")


@pytest.mark.parametrize("name", [DATA, MANIFEST])
def test_fifo_inspect_cli(ck, name):
    replace(ck / name, fifo)
    proc = run_cli("inspect", ck)
    if name == MANIFEST:
        assert_cli_error(proc, MANIFEST, "FIFO")
    else:  # inspect reads only the manifest
        assert proc.returncode == 0 and "leaves:" in proc.stdout, proc.stderr


@pytest.mark.parametrize("name", [DATA, MANIFEST])
def test_fifo_ls_cli_lists_damaged(tmp_path, name):
    root = tmp_path / "root"
    with uckpt.CheckpointManager(root) as mgr:
        mgr.save(1, state(1))
        mgr.save(2, state(2))
    replace(root / "step_00000002" / name, fifo)
    proc = run_cli("ls", root)
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines()[1:]}
    assert " committed " in rows["1"]
    assert " damaged " in rows["2"] and "FIFO" in rows["2"], proc.stdout


# -- restore falls back past every kind of odd entry, with exact values ----------------------
def _moved_out(path):
    """The file itself, moved out of its checkpoint and linked back: identical bytes, so
    only refusing the symlink makes the load fail."""
    away = path.parent.parent.parent / "moved"
    away.mkdir(exist_ok=True)
    os.rename(path, away / path.name)
    os.symlink(away / path.name, path)


@pytest.mark.parametrize("name", [DATA, MANIFEST])
@pytest.mark.parametrize("kind", ["fifo", "directory", "symlink-out", "dev-zero"])
def test_restore_falls_back(tmp_path, name, kind):
    root = tmp_path / "root"
    with uckpt.CheckpointManager(root) as mgr:
        mgr.save(1, state(1))
        mgr.save(2, state(2))
    victim = root / "step_00000002" / name
    if kind == "symlink-out":
        _moved_out(victim)
    else:
        makers = {"fifo": fifo, "directory": directory,
                  "dev-zero": lambda path: os.symlink("/dev/zero", path)}
        replace(victim, makers[kind])
    target = {"w": np.zeros((8, 8), dtype=np.float32), "epoch": 0}
    with uckpt.CheckpointManager(root) as mgr, warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert mgr.restore(target) == 1
    np.testing.assert_array_equal(target["w"], state(1)["w"])
    assert target["epoch"] == 1
    assert any("step 2" in str(w.message) and name in str(w.message) for w in seen)


# -- /dev/zero and growing files: reads are bounded -----------------------------------------
def test_manifest_symlink_to_dev_zero_bounded(ck):
    replace(ck / MANIFEST, lambda p: os.symlink("/dev/zero", p))
    with pytest.raises(errors.NotACheckpointError, match=r"symbolic link \(to '/dev/zero'\)"):
        uckpt.load(ck)
    out = load_in_child(ck)
    assert out["error"] == "NotACheckpointError", out
    assert out["maxrss_mib"] < 400, out  # the old reader read /dev/zero until memory ran out


def test_read_capped_stops_at_cap_whatever_st_size_says(tmp_path):
    # files in /proc are regular files whose st_size is 0 however much they hold
    fd = fsutil.open_regular("/proc/self", "status", what="status file")
    try:
        assert os.fstat(fd).st_size == 0
        assert b"Name:" in fsutil.read_capped(fd, 1 << 20, "/proc/self/status")
        with pytest.raises(errors.CorruptCheckpointError, match="more than 16 bytes"):
            fsutil.read_capped(fd, 16, "/proc/self/status")
    finally:
        os.close(fd)


def test_oversized_manifest_refused(ck, monkeypatch):
    import uckpt.storage.base

    monkeypatch.setattr(uckpt.storage.base, "MAX_MANIFEST_BYTES", 100)
    with pytest.raises(errors.ManifestError, match="more than 100 bytes"):
        uckpt.load(ck)


# -- symlinks: never followed inside a checkpoint -------------------------------------------
def test_manifest_symlink_out_of_the_directory_refused(ck, outside):
    replace(ck / MANIFEST, lambda p: os.symlink(outside / MANIFEST, p))
    with pytest.raises(errors.NotACheckpointError, match="manifest .* is a symbolic link"):
        uckpt.load(ck)


def test_data_file_symlink_out_of_the_directory_refused(ck, outside):
    replace(ck / DATA, lambda p: os.symlink(outside / DATA, p))
    with pytest.raises(errors.CorruptCheckpointError, match="data file .* is a symbolic link") \
            as ei:
        uckpt.load(ck)
    assert str(outside / DATA) in str(ei.value)  # names where it points
    with pytest.raises(errors.CorruptCheckpointError, match="symbolic link"):
        uckpt.verify(ck)


def test_data_file_symlink_inside_the_directory_refused(ck):
    # regular files only: even a link to a file beside it is refused
    os.rename(ck / DATA, ck / "real.bin")
    os.symlink("real.bin", ck / DATA)
    with pytest.raises(errors.CorruptCheckpointError, match=r"symbolic link \(to 'real.bin'\)"):
        uckpt.load(ck)


def test_checkpoint_directory_itself_a_symlink_loads(ck, tmp_path):
    link = tmp_path / "link"
    os.symlink(ck, link)
    out = uckpt.load(link)
    np.testing.assert_array_equal(out["w"], STATE["w"])
    assert uckpt.verify(link).step is None
    proc = run_cli("verify", link)
    assert proc.returncode == 0 and proc.stdout.startswith("OK:"), proc.stderr


def test_ls_does_not_follow_a_symlinked_step(tmp_path, outside):
    root = tmp_path / "root"
    with uckpt.CheckpointManager(root) as mgr:
        mgr.save(1, state(1))
    os.symlink(outside, root / "step_00000005")
    proc = run_cli("ls", "--json", root)
    assert proc.returncode == 0, proc.stderr
    entries = {c["name"]: c for c in json.loads(proc.stdout)["checkpoints"]}
    link = entries["step_00000005"]
    assert link["status"] == "damaged" and "symbolic link" in link["reason"]
    assert link["leaves"] is None and link["size"] == 0  # nothing read through it
    assert entries["step_00000001"]["status"] == "committed"


def test_ls_of_a_symlinked_root(tmp_path):
    root = tmp_path / "root"
    with uckpt.CheckpointManager(root) as mgr:
        mgr.save(1, state(1))
    os.symlink(root, tmp_path / "alias")
    proc = run_cli("ls", tmp_path / "alias")
    assert proc.returncode == 0 and " committed " in proc.stdout, proc.stderr


# -- directories and devices ----------------------------------------------------------------
def test_manifest_is_a_directory(ck):
    replace(ck / MANIFEST, directory)
    with pytest.raises(errors.NotACheckpointError, match="manifest .* is a directory"):
        uckpt.load(ck)


def test_data_file_is_a_directory(ck):
    replace(ck / DATA, directory)
    with pytest.raises(errors.CorruptCheckpointError, match="data file .* is a directory"):
        uckpt.load(ck)


def test_data_file_is_a_character_device(ck):
    replace(ck / DATA, null_device)
    with pytest.raises(errors.CorruptCheckpointError, match="is a character device"):
        uckpt.load(ck)
    assert_cli_error(run_cli("verify", ck), "character device")


def test_checkpoint_path_is_a_fifo(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(errors.NotACheckpointError, match="is a FIFO"):
        uckpt.load(tmp_path / "pipe")
    assert_cli_error(run_cli("ls", tmp_path / "pipe"), "FIFO")


# -- sizes: checked before any allocation ---------------------------------------------------
def test_huge_declared_shape_refused_before_allocation(tmp_path):
    ck = uckpt.save(tmp_path / "ck", {"w": np.arange(16, dtype=np.float32)})
    n = 1 << 40  # 4 TiB of float32

    def huge(m):
        m["files"][DATA]["size"] = 4 * n  # declared: 4 TiB; the file holds 64 bytes
        a = m["arrays"]["w"]
        a["shape"] = [n]
        a["chunks"][0].update(shape=[n], length=4 * n)
    edit_manifest(ck, huge)
    with pytest.raises(errors.TruncatedDataError, match=f"64 bytes, the manifest records {4 * n}"):
        uckpt.load(ck)
    out = load_in_child(ck)
    assert out["error"] == "TruncatedDataError", out
    assert out["maxrss_mib"] < 400, out


def test_chunks_sharing_file_bytes_refused_before_allocation(tmp_path):
    # 1,000 chunks that all point at the same 4 KiB: each checksum matches, but the array
    # would need 1,000 times what the file holds
    ck = uckpt.save(tmp_path / "ck", {"w": np.zeros(1024, dtype=np.float32)})

    def shared(m):
        a = m["arrays"]["w"]
        one = a["chunks"][0]
        a["shape"] = [1024 * 1000]
        a["chunks"] = [dict(one, start=[1024 * i]) for i in range(1000)]
    edit_manifest(ck, shared)
    with pytest.raises(errors.CorruptCheckpointError, match="stored in files of 4096 bytes"):
        uckpt.load(ck)


def test_data_file_shorter_than_declared(ck):
    os.truncate(ck / DATA, 10)
    with pytest.raises(errors.TruncatedDataError, match="10 bytes, the manifest records") as ei:
        uckpt.load(ck)
    assert ei.value.offset == 10 and ei.value.leaf is not None


def test_missing_data_file_checked_before_reading(ck):
    os.unlink(ck / DATA)
    with pytest.raises(errors.CheckpointNotFoundError, match="data-00000.bin.*missing"):
        uckpt.verify(ck)


# -- permissions ---------------------------------------------------------------------------
def _without_dac_override():
    """In the child: drop the capabilities that let root read any file (bounding set, so
    the exec'ed interpreter runs without them)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


@pytest.mark.parametrize("name", [DATA, MANIFEST])
def test_unreadable_file(ck, name):
    os.chmod(ck / name, 0)
    if os.geteuid() == 0:
        try:  # root reads any file: check the child can be made to obey permissions
            run_python("pass", preexec_fn=_without_dac_override)
        except (subprocess.SubprocessError, OSError) as e:
            pytest.skip(f"running as root and cannot drop CAP_DAC_OVERRIDE: {e}")
        out = load_in_child(ck, preexec_fn=_without_dac_override)
    else:
        out = load_in_child(ck)
    assert out["error"] == "CorruptCheckpointError", out
    assert out["errno"] == 13 and "Permission denied" in out["message"], out
    assert name in out["message"] and "read access" in out["message"], out


# -- the command line: no traceback, and names it cannot encode are escaped -----------------
def test_inspect_on_an_ascii_terminal(tmp_path):
    ck = uckpt.save(tmp_path / "ck", {"café": np.ones(2), "note": "snow ☃"},
                    metadata={"author": "Zoë"})
    proc = run_cli("inspect", ck, env={"PYTHONIOENCODING": "ascii"})
    assert proc.returncode == 0, proc.stderr
    assert "caf\\xe9" in proc.stdout and "Zo\\xeb" in proc.stdout
    proc = run_cli("inspect", "--json", ck, env={"PYTHONIOENCODING": "ascii"})
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)  # still valid JSON, with \\u escapes
    assert doc["metadata"] == {"author": "Zoë"}
    assert {leaf["path"] for leaf in doc["leaves"]} == {"café"}


def test_ls_names_that_are_not_utf8(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    name = os.fsdecode(b"run-\xff")  # undecodable bytes, kept as surrogate escapes
    uckpt.save(root / name, STATE)
    proc = run_cli("ls", root)
    assert proc.returncode == 0, proc.stderr
    assert "run-\\udcff" in proc.stdout and " committed " in proc.stdout


def test_ls_deeply_nested_directory(tmp_path):
    root = tmp_path / "root"
    with uckpt.CheckpointManager(root) as mgr:
        mgr.save(1, state(1))
    top = str(root / "step_00000001")
    with deep_directory(top, 1500) as deep:  # deeper than Python's recursion limit
        with open(os.path.join(deep, "x"), "wb") as f:
            f.write(b"12345")
        proc = run_cli("ls", "--json", root)
        assert proc.returncode == 0, proc.stderr
        (entry,) = json.loads(proc.stdout)["checkpoints"]
        assert entry["status"] == "committed"
        assert entry["size"] == sum(p.stat().st_size for p in (root / "step_00000001").iterdir()
                                    if p.is_file()) + 5


def test_verify_all_does_not_follow_a_symlinked_step(tmp_path):
    root = tmp_path / "root"
    with uckpt.CheckpointManager(root) as m:
        m.save(1, {"w": np.ones(3)})
    uckpt.save(tmp_path / "elsewhere", {"w": np.ones(3)})
    (root / "step_00000002").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    proc = run_cli("verify", "--all", root)
    assert proc.returncode == 1
    assert "OK:" in proc.stdout and "step_00000001" in proc.stdout
    assert "step_00000002: a symbolic link" in proc.stderr and "not followed" in proc.stderr
