"""A save that fails at its commit (the manifest, its fsync, the rename into place) cleans up
after itself: its own temporary directory is gone when the error is raised, the last
committed checkpoint is untouched and loads, and the error is the specific uckpt one."""
import contextlib
import errno
import os
import stat
from pathlib import Path

import numpy as np
import pytest

import uckpt
from uckpt import errors
from uckpt.storage.blob import posix
from uckpt.storage.blob.posix import PosixStore
from conftest import mount_tmpfs
from test_bad_inputs import digest

FIRST = {"w": np.ones(1000, np.float32)}
SECOND = {"w": np.arange(16384, dtype=np.float32)}  # one data file of 64 KiB


def leftovers(root) -> list:
    """Hidden entries of saves under ``root`` (temporary or replaced checkpoints)."""
    return sorted(p.name for p in root.iterdir() if p.name.startswith(".step_"))


@pytest.fixture
def tiny_fs(tmp_path):
    """A 1 MiB tmpfs (needs root); skipped where mounting is not allowed."""
    yield from mount_tmpfs(tmp_path / "tiny", "1m")


def fill_but(fs, free: int) -> None:
    """Fill the file system ``fs`` with a file, then give back ``free`` bytes of it."""
    fd = os.open(fs / "filler", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        block, size = b"\1" * 4096, 0
        try:
            while True:
                size += os.write(fd, block)
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
        os.ftruncate(fd, size - free)
    finally:
        os.close(fd)


def test_disk_full_at_the_manifest_leaves_no_debris(tiny_fs):
    """Room for the data file but not for the manifest: the failing save removes its
    temporary directory (with the manifest cut short in it) itself, not a later writer."""
    root = tiny_fs / "root"
    m = uckpt.CheckpointManager(root, keep=uckpt.KeepLast(3))
    first = m.save(1, FIRST)
    before = digest(first)
    fill_but(tiny_fs, SECOND["w"].nbytes)  # exactly the data file's pages
    with pytest.raises(errors.StorageFullError) as ei:
        m.save(2, SECOND)
    assert leftovers(root) == []  # no .step_00000002.uckpt-tmp-* with a 0-byte manifest
    text = str(ei.value)
    assert "(commit): writing its manifest of" in text and "bytes free there" in text
    assert str(root / "step_00000002") in text and ei.value.errno == errno.ENOSPC
    assert m.steps() == [1] and digest(first) == before
    np.testing.assert_array_equal(uckpt.load(first)["w"], FIRST["w"])
    m.close()


def _is_tmp(path, *_):
    return ".uckpt-tmp-" in os.fspath(path)


def _second_save_fails_cleanly(m, root, first, before, err, message, met=lambda: True):
    """``m.save(2, SECOND)`` raises uckpt's error matching ``message`` (after the fault
    was ``met``), leaves no temporary directory and the first checkpoint intact, and the
    same writer then saves the step."""
    expected = errors.StorageFullError if err == errno.EDQUOT else errors.SaveError
    with pytest.raises(expected, match=message):
        m.save(2, SECOND)
    assert met()
    assert leftovers(root) == []
    assert m.steps() == [1] and digest(first) == before
    np.testing.assert_array_equal(uckpt.load(first)["w"], FIRST["w"])
    m.save(2, SECOND)  # the same writer saves the step again
    assert m.steps() == [1, 2]
    m.close()


# -- faults injected at the blob seam (PosixStore), where the checkpoint layer's commit
# calls the store ------------------------------------------------------------------------
class _Faulty(PosixStore):
    """A PosixStore whose next call named by ``fail`` raises ``err``: ``"manifest"`` (its
    write), ``"manifest fsync"`` (the fsync of the directory it was written into, which
    the rename of that temporary directory makes before moving it) or ``"rename"`` (of
    a temporary prefix into place)."""

    def __init__(self, root):
        super().__init__(root)
        self.fail, self.err = None, 0

    def _raise(self, what, path):
        if self.fail == what:
            self.fail = None
            raise OSError(self.err, os.strerror(self.err), path)

    def write(self, key, data):
        if key.endswith("/manifest.json") and _is_tmp(key):
            self._raise("manifest", self.where(key))
        return super().write(key, data)

    def rename_prefix(self, src, dst):
        if _is_tmp(src):
            self._raise("rename", self.where(src))
            if self.fail == "manifest fsync":
                self.fail = None
                with _fsync_fails_once(self.err):
                    return super().rename_prefix(src, dst)
        return super().rename_prefix(src, dst)


@contextlib.contextmanager
def _fsync_fails_once(err):
    real, armed = posix.os.fsync, [True]

    def fsync(fd):
        if armed[0] and stat.S_ISDIR(os.fstat(fd).st_mode):
            armed[0] = False
            raise OSError(err, os.strerror(err))
        return real(fd)

    posix.os.fsync = fsync
    try:
        yield
    finally:
        posix.os.fsync = real


@pytest.mark.parametrize("fail, err, message", [
    ("manifest fsync", errno.EIO, r"save of step 2 \(commit\) failed: .*Input/output"),
    ("rename", errno.EIO, r"save of step 2 \(commit\) failed: .*Input/output.*step_00000002"),
    ("manifest", errno.EDQUOT, r"no space left .* save of step 2 \(commit\)"),
], ids=["fsync-EIO", "rename-EIO", "write-EDQUOT"])
def test_layer_commit_failure_removes_its_temporary_prefix(tmp_path, monkeypatch, fail, err,
                                                          message):
    """Every way out of the commit after the manifest was (partly) written: the error is
    uckpt's, the save's temporary directory is gone, the checkpoint before it intact."""
    root = tmp_path / "root"
    blob = _Faulty(root)
    monkeypatch.setattr(posix, "PosixStore",
                        lambda where: blob if Path(where) == root else PosixStore(where))
    m = uckpt.CheckpointManager(root, keep=uckpt.KeepLast(3))
    first = m.save(1, FIRST)
    before = digest(first)
    blob.fail, blob.err = fail, err
    _second_save_fails_cleanly(m, root, first, before, err, message,
                               met=lambda: blob.fail is None)


def test_layer_overwrite_whose_rename_fails_keeps_the_committed_checkpoint(tmp_path,
                                                                           monkeypatch):
    """Where the file system takes no exchange the old checkpoint goes aside first, and
    comes back at once when moving the new one in fails."""
    blob = _Faulty(tmp_path)
    monkeypatch.setattr(blob, "exchange_prefix", lambda a, b: False)
    monkeypatch.setattr(posix, "PosixStore", lambda where: blob)
    first = uckpt.save(tmp_path / "ck", FIRST)
    before = digest(first)
    blob.fail, blob.err = "rename", errno.EIO
    with pytest.raises(errors.SaveError, match="Input/output error"):
        uckpt.save(tmp_path / "ck", SECOND, overwrite=True)
    assert blob.fail is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]
    assert digest(first) == before
    np.testing.assert_array_equal(uckpt.load(first)["w"], FIRST["w"])
