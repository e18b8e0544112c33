"""``uckpt convert`` run as a user runs it: every source format to every target format and
back, loaded by the real frameworks; dry runs, --force, atomic output, Ctrl-C, the progress
bar, exit codes and bounded memory."""
import json
import os
import pty
import resource
import select
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import uckpt
from convert_common import (EXT, TARGETS, assert_error, assert_ok, cli, cli_many, leftovers,
                            target)
from convert_sources import SOURCES
from uckpt.conversion import diff

pytestmark = pytest.mark.filterwarnings("ignore::uckpt.conversion.ConvertWarning")


def native_load(fmt, path):
    """Open a produced file with the library its format belongs to, reading every array."""
    if fmt == "npz":
        with np.load(path, allow_pickle=False) as z:
            return len([z[k] for k in z.files])
    if fmt == "pickle":
        import torch

        return torch.load(path, weights_only=True)
    if fmt == "hdf5":
        import h5py

        with h5py.File(path) as f:
            found = []
            f.visititems(lambda name, obj: found.append(obj[()]) if hasattr(obj, "dtype") else None)
            return len(found)
    if fmt == "safetensors":
        from safetensors.torch import load_file

        return load_file(path)
    uckpt.verify(path)
    return uckpt.load(path)


@pytest.mark.parametrize("source", list(SOURCES))
def test_every_source_to_every_target_and_back(tmp_path, source):
    """SRC -> each target (uckpt convert); the result is the same checkpoint (diff) and loads
    with its format's library; converted back to SRC's format, the framework that wrote SRC
    loads it (into model and optimizer) with every value equal. (The way back runs in this
    process: each of those pairs is run by the CLI for another source.)"""
    src, check = SOURCES[source](tmp_path)
    back_fmt = "pickle" if source == "dcp" else source
    back_suffix = ".pt" if source == "dcp" else "".join(src.suffixes)  # .weights.h5 stays
    # (Keras weights go to HDF5 only under a *.weights.h5 name, the one Keras' load_weights reads)
    mids = {fmt: target(tmp_path, f"mid_{fmt}" + (".weights" if fmt == "hdf5" else ""), fmt)
            for fmt in TARGETS}
    backs = {fmt: tmp_path / f"back_{fmt}{back_suffix}" for fmt in TARGETS}
    for proc in cli_many([("convert", src, mids[fmt]) for fmt in TARGETS]):
        assert_ok(proc)
        assert proc.stdout.startswith(f"converted {src} ({source}) -> ")
    for fmt in TARGETS:
        uckpt.convert(mids[fmt], backs[fmt], dst_format=back_fmt)
        report = diff(src, mids[fmt])
        assert report.identical, (fmt, [d.text() for d in report.differences])
        assert report.compared > 0
        native_load(fmt, mids[fmt])
        check(backs[fmt])
    assert not leftovers(tmp_path)


@pytest.fixture
def small(tmp_path):
    path = tmp_path / "src.npz"
    np.savez(path, **{"a/w": np.arange(6, dtype=np.float32).reshape(2, 3), "a/b": np.ones(2),
                      "step": np.int64(4)})
    return path


def test_dry_run_lists_and_writes_nothing(tmp_path, small):
    proc = cli("convert", small, tmp_path / "out.safetensors", "--dry-run")
    assert_ok(proc)
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"would convert {small} (npz) -> ") and "nothing written" in lines[0]
    assert lines[1].split() == ["ARRAY", "DTYPE", "SHAPE", "SIZE"]
    assert lines[2].split()[:3] == ["a/w", "float32", "(2,"]
    assert lines[-1] == "total: 3 arrays (48 B), 0 values"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src.npz"]
    doc = json.loads(cli("convert", small, tmp_path / "x", "-n", "--json").stdout)
    assert doc["dry_run"] and doc["dst_format"] == "uckpt" and doc["nbytes"] == 48
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("fmt", ["npz", "uckpt"])  # every file target shares the file path
def test_existing_output_needs_force(tmp_path, small, fmt):
    dst = target(tmp_path, "out", fmt)
    assert_ok(cli("convert", small, dst))
    before = sorted(dst.iterdir()) if dst.is_dir() else dst.read_bytes()
    assert_error(cli("convert", small, dst), str(dst), "--force")
    assert (sorted(dst.iterdir()) if dst.is_dir() else dst.read_bytes()) == before
    np.savez(small, **{"a/w": np.zeros(3)})  # a new source replaces the old output
    assert_ok(cli("convert", small, dst, "--force"))
    assert diff(small, dst).identical
    assert not leftovers(tmp_path)


def test_force_never_replaces_a_directory_that_is_not_a_checkpoint(tmp_path, small):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "keep.txt").write_text("mine")
    assert_error(cli("convert", small, tmp_path / "data", "--force"), "not a uckpt checkpoint")
    assert_error(cli("convert", small, tmp_path / "data", "--to", "npz", "--force"),
                 "is a directory")
    assert (tmp_path / "data" / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize("fmt", TARGETS)
def test_failure_midway_leaves_no_output(tmp_path, fmt):
    """The last array of the source is corrupt: the conversion fails after writing the
    others, and neither the output nor a temporary file is left."""
    src = tmp_path / "src"
    uckpt.save(src, {"a": np.ones(1000), "b": np.zeros(1000), "z": np.arange(1000.0)})
    entry = uckpt.manifest(src).arrays["z"]
    with open(src / "data-00000.bin", "r+b") as f:
        f.seek(entry.chunks[0].offset + 10)
        f.write(b"\xff")
    dst = target(tmp_path, "out", fmt)
    assert_error(cli("convert", src, dst), "checksum mismatch", "'z'")
    assert not dst.exists() and not leftovers(tmp_path)


@pytest.mark.parametrize("fmt", TARGETS)
def test_interrupt_leaves_no_output(tmp_path, fmt):
    """KeyboardInterrupt (what Ctrl-C raises) in the middle of writing removes everything."""
    src = tmp_path / "src"
    uckpt.save(src, {f"a{i}": np.full(1 << 16, i, np.float32) for i in range(8)})

    def interrupt(done, total):
        if done > total // 2:
            raise KeyboardInterrupt

    dst = target(tmp_path, "out", fmt)
    with pytest.raises(KeyboardInterrupt):
        uckpt.convert(src, dst, progress=interrupt)
    assert not dst.exists() and not leftovers(tmp_path)


def _pty_run(args, env=None, interrupt_on=None):
    """Run ``uckpt ARGS`` with stderr on a terminal; returns (exit status, stderr text). With
    ``interrupt_on``, send SIGINT as soon as that text appears."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "uckpt.cli.main", *map(str, args)],
                            stdout=subprocess.PIPE, stderr=slave,
                            env=dict(os.environ, PYTHONWARNINGS="ignore", **(env or {})))
    os.close(slave)
    out, deadline = b"", time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
            if interrupt_on and interrupt_on.encode() in out:
                proc.send_signal(signal.SIGINT)
                interrupt_on = None
        elif proc.poll() is not None:
            break
    proc.wait(timeout=60)
    os.close(master)
    return proc.returncode, out.decode(errors="replace")


def test_progress_bar_on_a_terminal_only(tmp_path, small):
    env = {"UCKPT_PROGRESS_BYTES": "1"}
    code, err = _pty_run(["convert", small, tmp_path / "a.h5"], env)
    assert code == 0 and "converting 100% |" in err and "MiB" in err, err
    code, err = _pty_run(["convert", small, tmp_path / "b.h5", "--quiet"], env)
    assert code == 0 and "converting" not in err, err
    proc = cli("convert", small, tmp_path / "c.h5", env=env)  # stderr is a pipe
    assert_ok(proc)
    assert proc.stderr == ""


def test_ctrl_c_in_a_real_process_leaves_no_output(tmp_path):
    src = tmp_path / "src.npz"
    np.savez(src, **{f"a{i}": np.full(4 << 20, i, np.float32) for i in range(16)})  # 256 MiB
    dst = tmp_path / "out.h5"
    code, err = _pty_run(["convert", src, dst], {"UCKPT_PROGRESS_BYTES": "1"},
                         interrupt_on="converting")
    if code == 0:  # it finished before the signal arrived: then it must be complete
        assert diff(src, dst).identical
    else:
        assert code == 130, err
        assert not dst.exists()
    assert not leftovers(tmp_path)


def test_usage_errors_exit_2(tmp_path, small):
    assert cli("convert", small).returncode == 2
    assert cli("convert", small, tmp_path / "x", "--to", "dcp").returncode == 2
    assert cli("convert", small, tmp_path / "x", "--from", "tfrecord").returncode == 2
    assert cli("diff", small).returncode == 2


def test_errors_exit_1(tmp_path, small):
    (tmp_path / "notes.txt").write_text("hello")
    assert_error(cli("convert", tmp_path / "notes.txt", tmp_path / "x"),
                 "cannot tell the format", "--from")
    assert_error(cli("convert", tmp_path / "missing.pt", tmp_path / "x"), "does not exist")
    assert_error(cli("convert", small, small, "--force"), "source and destination are the same")
    assert_error(cli("convert", small, tmp_path / "x", "--from", "hdf5"))
    assert not leftovers(tmp_path)


def test_json_report(tmp_path, small):
    proc = cli("convert", small, tmp_path / "x.pt", "--json")
    assert_ok(proc)
    doc = json.loads(proc.stdout)
    assert (doc["src_format"], doc["dst_format"], doc["dry_run"]) == ("npz", "pickle", False)
    assert [a["name"] for a in doc["arrays"]] == ["a/w", "a/b", "step"]
    assert doc["arrays"][0]["shape"] == [2, 3] and doc["warnings"] == []


def test_warnings_go_to_stderr(tmp_path):
    import ml_dtypes

    uckpt.save(tmp_path / "src", {"w": np.ones(2, ml_dtypes.bfloat16), "lr": 0.1})
    proc = cli("convert", tmp_path / "src", tmp_path / "x.safetensors")
    assert_ok(proc)
    assert "uckpt: warning: safetensors holds only tensors: 1 plain value(s) are kept in " \
           "__metadata__ only: lr" in proc.stderr
    proc = cli("convert", tmp_path / "src", tmp_path / "x.npz")
    assert "uckpt: warning: NPZ has no bfloat16: 1 array(s) stored as raw bits" in proc.stderr


MEASURE = """
import resource, subprocess, sys
proc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL)
print(proc.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def _peak_kib(*args):
    out = subprocess.run([sys.executable, "-c", MEASURE, sys.executable, "-m", "uckpt.cli.main",
                          *map(str, args)], capture_output=True, text=True, check=True).stdout
    code, kib = out.split()
    assert code == "0", out
    return int(kib)


def test_memory_stays_about_the_largest_array(tmp_path):
    """Converting 128 MiB of 16 MiB arrays needs about one array more than reading nothing:
    the peak RSS of each conversion is compared with that of a dry run (same imports)."""
    src = tmp_path / "src"
    uckpt.save(src, {f"layer{i}": np.full(4 << 20, i, np.float32) for i in range(8)})
    steps = [(src, tmp_path / "a.pt"), (tmp_path / "a.pt", tmp_path / "b.h5"),
             (tmp_path / "b.h5", tmp_path / "c.npz")]
    for a, b in steps:
        base = _peak_kib("convert", a, tmp_path / "dry", "--dry-run")
        used = _peak_kib("convert", a, b)
        print(a.name, b.name, base, used)
        assert used - base < 48 << 10, (a, b, base, used)  # one 16 MiB array + buffers
    assert diff(src, tmp_path / "c.npz").identical


def test_extension_list_is_documented():
    """Every target extension the CLI recognises is named in its help."""
    help_text = cli("convert", "--help").stdout
    for ext in set(EXT.values()) - {""}:
        assert ext in help_text, ext
