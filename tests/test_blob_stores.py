"""Every blob store passes StoreTests (uckpt.testing.store_tests): in memory, in local
directories (plain, and the shared-memory store of shm:// roots), through fsspec's local
and memory file systems, and on S3 (the SeaweedFS server of tests/s3_server.py). Then
what only one backend can show: a POSIX store never leaves its root nor blocks on what it
finds there, and leaves no debris visible."""
from __future__ import annotations

import os
import uuid
from functools import partial

import pytest

from uckpt.codecs.checksum import crc32c
from uckpt.errors import CheckpointNotFoundError, CorruptCheckpointError, RootLockedError
from uckpt.storage.blob import FsspecStore, MemoryStore, PosixStore, S3Store
from uckpt.storage.blob.base import RESERVED
from uckpt.storage.s3 import S3Client
from uckpt.storage.s3_config import MIN_PART_BYTES
from uckpt.testing.store_tests import StoreTests, pattern

fsspec = pytest.importorskip("fsspec")


class TestMemoryStore(StoreTests):
    @pytest.fixture
    def store(self):
        return MemoryStore()


class TestPosixStore(StoreTests):
    @pytest.fixture
    def store(self, tmp_path):
        return PosixStore(tmp_path / "root", buffer_bytes=4096)  # 3 buffers and a bit


class TestShmStore(StoreTests):
    @pytest.fixture
    def store(self, tmp_path):
        from uckpt.storage.blob.shm import ShmStore

        return ShmStore(tmp_path / "root", "shm://test")


class TestFsspecLocal(StoreTests):
    @pytest.fixture
    def store(self, tmp_path):
        return FsspecStore(fsspec.filesystem("file"), str(tmp_path / "root"))


class TestFsspecMemory(StoreTests):
    @pytest.fixture
    def store(self):
        fs = fsspec.filesystem("memory")
        root = f"/uckpt-test-{uuid.uuid4().hex}"  # fsspec's memory file system is global
        yield FsspecStore(fs, root)
        if fs.exists(root):
            fs.rm(root, recursive=True)


@pytest.fixture(scope="module")
def blob_client(s3_server):
    """One bucket and client for the module (making either costs a second or two)."""
    options = dict(s3_server.storage_options, part_bytes=MIN_PART_BYTES)
    with S3Client(s3_server.new_bucket(), options) as client:
        yield client


class TestS3Store(StoreTests):
    #: more than two of the smallest parts S3 takes: a multipart upload of three parts
    large_size = 2 * MIN_PART_BYTES + 4099
    threads = 4

    @pytest.fixture
    def store(self, s3_server, blob_client):
        return S3Store(blob_client, f"root-{uuid.uuid4().hex}")  # empty: a prefix per test


def test_s3_large_objects_go_up_in_parts_and_an_abort_leaves_no_upload(s3_bucket, s3_options):
    client = S3Client(s3_bucket, dict(s3_options, part_bytes=MIN_PART_BYTES))
    with client:
        store = S3Store(client, "r")
        data = pattern(2 * MIN_PART_BYTES + 1, seed=5)
        with store.open_writer("streamed") as out:
            for at in range(0, len(data), 1 << 20):
                out.write(data[at:at + (1 << 20)])
        store.write("whole", data)
        for key in ("r/streamed", "r/whole"):
            assert client.head(key).etag.strip('"').endswith("-3"), key
            assert client.crc32c_of(key, len(data)) == crc32c(data)
        out = store.open_writer("aborted")
        out.write(data)  # two parts sent, the third gathered
        assert [k for k, _, _ in client.incomplete_uploads("r/")] == ["r/aborted"]
        out.abort()
        assert client.incomplete_uploads("r/") == [] and not store.exists("aborted")


# --- POSIX only -------------------------------------------------------------------------
@pytest.fixture
def posix(tmp_path):
    return PosixStore(tmp_path / "root", buffer_bytes=4096)


def test_posix_never_reads_through_a_symlink(posix, tmp_path):
    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "secret").write_bytes(b"secret")
    (outside / "dir" / "x").write_bytes(b"x")
    posix.write("in/real", b"real")
    os.symlink(outside / "secret", posix.root / "in" / "link")
    os.symlink(outside / "dir", posix.root / "in" / "dirlink")
    os.symlink(posix.root / "in" / "real", posix.root / "in" / "samedir")
    for key, kind in (("in/link", "symbolic link"), ("in/samedir", "symbolic link"),
                      ("in/dirlink/x", "symbolic link")):
        for call in (partial(posix.read_into, key, 0, bytearray(8)), partial(posix.size, key)):
            with pytest.raises(CorruptCheckpointError, match=kind):
                call()
    assert sorted(posix.list()) == [("in/real", 4)]
    assert posix.list_dir("in") == (["in/real"], [])
    posix.delete_prefix("in")
    assert (outside / "secret").read_bytes() == b"secret" and (outside / "dir" / "x").exists()


def test_posix_does_not_block_on_a_fifo(posix):
    posix.write("d/real", b"1")
    os.mkfifo(posix.root / "d" / "fifo")
    with pytest.raises(CorruptCheckpointError, match="FIFO"):
        posix.read_into("d/fifo", 0, bytearray(4))
    with pytest.raises(CorruptCheckpointError, match="FIFO"):
        posix.size("d/fifo")
    assert sorted(posix.list()) == [("d/real", 1)]


def test_posix_debris_of_a_crashed_writer_stays_invisible(posix):
    out = posix.open_writer("d/k")
    out.write(pattern(10000))  # more than one buffer: a temporary file on disk
    temporaries = [n for n in os.listdir(posix.root / "d") if n.startswith(RESERVED)]
    assert len(temporaries) == 1
    assert list(posix.list()) == [] and posix.list_dir("d") == ([], [])
    with pytest.raises(CheckpointNotFoundError):
        posix.size("d/k")
    posix.delete_prefix("d")  # takes the debris with it
    assert not (posix.root / "d").exists()
    out.abort()


def test_posix_locks_hold_across_processes(posix):
    import subprocess
    import sys

    held = posix.lock("writer")
    code = ("import sys; from uckpt.storage.blob import PosixStore\n"
            "from uckpt.errors import RootLockedError\n"
            "try:\n    PosixStore(sys.argv[1]).lock('writer')\n"
            "except RootLockedError:\n    sys.exit(3)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    assert subprocess.run([sys.executable, "-c", code, str(posix.root)], env=env, check=False).returncode == 3
    held.release()
    assert subprocess.run([sys.executable, "-c", code, str(posix.root)], env=env, check=False).returncode == 0
    with pytest.raises(RootLockedError), posix.lock("writer"):
        posix.lock("writer")


def test_posix_writes_with_o_direct_where_the_file_system_takes_it(posix, tmp_path):
    data = pattern(3 * 4096 + 5)
    posix.write("k", data)
    assert (posix.root / "k").read_bytes() == data
    assert oct((posix.root / "k").stat().st_mode & 0o777) == "0o644"


def test_posix_writer_killed_mid_object_leaves_the_old_one_whole(posix):
    import signal
    import subprocess
    import sys

    old = pattern(5000, seed=1)
    posix.write("d/k", old)
    code = ("import signal, sys\nfrom uckpt.storage.blob import PosixStore\n"
            "out = PosixStore(sys.argv[1], buffer_bytes=4096).open_writer('d/k')\n"
            "out.write(b'n' * 10000)\nprint('written', flush=True)\nsignal.pause()\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    with subprocess.Popen([sys.executable, "-c", code, str(posix.root)], env=env,
                          stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout.readline() == "written\n"
        finally:
            proc.send_signal(signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
    debris = [n for n in os.listdir(posix.root / "d") if n.startswith(RESERVED)]
    assert len(debris) == 1 and (posix.root / "d" / debris[0]).stat().st_size >= 8192
    assert posix.read("d/k", 1 << 20) == old and list(posix.list()) == [("d/k", 5000)]
    posix.delete_prefix("d")
    assert list(posix.list()) == [] and os.listdir(posix.root) == []


def test_posix_write_failing_mid_object_raises_its_os_error_and_leaves_nothing(posix,
                                                                              monkeypatch):
    """A full disk at a writer's buffered write surfaces as that OSError (the abort used
    to fail on the staging buffer still exported by the failed write: BufferError); the
    old object stays whole and no temporary file is left."""
    import errno

    old = pattern(5000, seed=2)
    posix.write("d/k", old)
    real = os.pwrite

    def full(*args):
        monkeypatch.setattr(os, "pwrite", real)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(OSError, match="No space left on device") as info:
        posix.write("d/k", pattern(3 * 4096 + 5))
    assert info.value.errno == errno.ENOSPC
    assert posix.read("d/k", 1 << 20) == old
    assert os.listdir(posix.root / "d") == ["k"]


def test_posix_listing_skips_a_file_removed_while_it_walks(posix):
    """A listing is lazy: a file removed between the directory's read and its stat (a
    writer removing debris meanwhile) is left out, not a FileNotFoundError."""
    for name in ("a", "b", "c"):
        posix.write(f"d/{name}", name.encode())
    listing = posix.list("d")
    first, _ = next(listing)
    for name in "abc":
        if f"d/{name}" != first:
            posix.delete(f"d/{name}")
    assert list(listing) == []


def test_fsspec_memory_reads_on_two_threads_do_not_move_each_other():
    """fsspec's memory file system gives every opener the same file object: reads by
    open + seek + read on two threads read at each other's offsets (a load on two read
    threads found a base's data file 'ending' early). Range reads are independent."""
    import sys
    import threading

    from uckpt.storage.blob.fsspec_store import FsspecStore

    fsspec = pytest.importorskip("fsspec")
    root = f"race-{os.getpid()}-{threading.get_ident()}"
    store = FsspecStore(fsspec.filesystem("memory"), root)
    data = bytes(range(256)) * 64
    store.write("blob", data)
    bad = []

    def reader(first):
        buf = bytearray(256)
        for i in range(20000):
            at = ((first + i) % 64) * 256
            if store.read_into("blob", at, buf) != 256 or bytes(buf) != data[at:at + 256]:
                bad.append(at)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=reader, args=(k * 32,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
        fsspec.filesystem("memory").rm(root, recursive=True)
    assert not bad, bad[:5]
