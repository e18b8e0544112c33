"""`uckpt verify --all` and `uckpt ls` beside a writer whose retention deletes checkpoints: a
checkpoint deleted while it is read is gone, not damaged (as restore treats it).

The race is made reproducible by running the real writer's save (its retention deletes the
oldest step) at the exact moment: between the listing and the read, or between reading the
manifest and the data files; the stress test runs a real writer process beside the commands."""
import subprocess
import sys
import time

import numpy as np

import uckpt
import uckpt.cli.scan as scan_module
import uckpt.cli.verify as verify_module
from uckpt.cli.main import main
from s3_server import s3_bucket, s3_server  # noqa: F401

STATE = {"w": np.arange(4096, dtype=np.float32)}


def writer(root, **kw):
    """A root's writer keeping the last 2 steps, with steps 1 and 2 saved."""
    m = uckpt.CheckpointManager(root, keep=uckpt.KeepLast(2), **kw)
    m.save(1, STATE)
    m.save(2, STATE)
    return m


def rows(out: str) -> list:
    """(step, status) of each row of `uckpt ls`'s table."""
    return [tuple(line.split()[:2]) for line in out.splitlines()[1:] if line.strip()]


def test_ls_skips_a_checkpoint_deleted_while_it_is_examined(tmp_path, monkeypatch, capsys):
    m = writer(tmp_path)
    real = scan_module.read_manifest

    def manifest_then_retention(source, where):
        manifest = real(source, where)
        if "step_00000001" in where:
            m.save(3, STATE)  # retention deletes step 1 before its data files are looked at
        return manifest

    monkeypatch.setattr(scan_module, "read_manifest", manifest_then_retention)
    assert main(["ls", str(tmp_path)]) == 0
    assert rows(capsys.readouterr().out) == [("2", "committed")]
    assert m.steps() == [2, 3]
    m.close()


def test_verify_all_skips_a_checkpoint_deleted_while_it_is_read(tmp_path, monkeypatch, capsys):
    m = writer(tmp_path)

    class Reader(verify_module.CheckpointReader):
        def verify(self, *args, **kw):
            if self.directory.name == "step_00000001":
                m.save(3, STATE)  # its manifest was read; retention deletes it now
            return super().verify(*args, **kw)

    monkeypatch.setattr(verify_module, "CheckpointReader", Reader)
    assert main(["verify", "--all", str(tmp_path)]) == 0
    out = capsys.readouterr()
    lines = out.out.splitlines()
    assert lines[0] == (f"skipped: {tmp_path / 'step_00000001'}: deleted while it was "
                        "verified (the root's writer removed it)")
    assert lines[1].startswith("OK: ") and lines[1].endswith(str(tmp_path / "step_00000002"))
    assert len(lines) == 2 and out.err == ""
    m.close()


def test_verify_all_skips_a_checkpoint_deleted_after_the_listing(tmp_path, monkeypatch, capsys):
    m = writer(tmp_path)
    real = verify_module.targets

    def listed_then_retention(args):
        found = real(args)
        m.save(3, STATE)  # deletes step 1, listed but not yet read
        return found

    monkeypatch.setattr(verify_module, "targets", listed_then_retention)
    assert main(["verify", "--all", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"skipped: {tmp_path / 'step_00000001'}: deleted while")
    assert lines[1].startswith("OK: ") and len(lines) == 2
    m.close()


def test_ls_of_a_bucket_skips_a_checkpoint_deleted_after_the_listing(s3_server, s3_bucket,
                                                                    monkeypatch, capsys):
    root, opts = f"s3://{s3_bucket}/run", s3_server.storage_options
    m = writer(root, storage_options=opts)
    real = scan_module.examine

    def retention_then_examine(entry, source):
        if entry.name == "step_00000001":
            m.save(3, STATE)  # listed with its manifest; retention deletes it now
        return real(entry, source)

    monkeypatch.setattr(scan_module, "examine", retention_then_examine)
    assert main(["ls", root, "--endpoint-url", opts["endpoint_url"]] +
                [f"--storage-option={k}={v}" for k, v in opts.items()
                 if k != "endpoint_url"]) == 0
    assert rows(capsys.readouterr().out) == [("2", "committed")]
    m.close()


WRITER = """
import sys, numpy as np, uckpt
root, n = sys.argv[1], int(sys.argv[2])
with uckpt.CheckpointManager(root, keep=uckpt.KeepLast(2)) as m:
    for s in range(1, n + 1):
        m.save(s, {"w": np.full(1 << 16, s, np.float32)})
"""


def test_verify_all_and_ls_beside_a_real_writer(tmp_path, capsys):
    """Bounded stress: up to 40 runs of each command while a writer process saves 300
    steps keeping the last 2; none may exit 1 or list anything as damaged."""
    root = tmp_path / "root"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(root), "300"])
    try:
        for _ in range(1200):  # until its first commit (bounded)
            if proc.poll() is not None or uckpt.CheckpointManager(root).steps():
                break
            time.sleep(0.05)
        runs = 0
        for _ in range(40):
            if proc.poll() is not None:
                break
            assert main(["verify", "--all", str(root)]) == 0, capsys.readouterr()
            assert main(["ls", str(root)]) == 0
            out = capsys.readouterr().out
            assert "damaged" not in out, out
            runs += 1
        assert runs > 0
    finally:
        proc.kill()
        proc.wait()
