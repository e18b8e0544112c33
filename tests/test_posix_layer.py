"""The checkpoint layer (uckpt.storage.checkpoint) on a local directory through
PosixStore: the guarantees the local store gave, kept on the blob seam. Real files, real
processes."""
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import uckpt
from uckpt import errors, knobs
from uckpt.codecs.checksum import crc32c, format_checksum
from uckpt.loading.reader import CheckpointReader
from uckpt.storage.blob.posix import PosixStore
from uckpt.storage.checkpoint import BlobCheckpointStore
from uckpt.storage.readback import block_buffer, stored_checksum

from deep_tree import deep_directory


def layer(root):
    return BlobCheckpointStore(PosixStore(root), "", str(root))


def wait_for(path: Path, proc: subprocess.Popen) -> None:
    """Until ``path`` exists (the other process's signal); fails if that process ended."""
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the saving process ended early:\n{proc.stderr.read()}")
        time.sleep(0.01)


# A save whose lease file is made but not yet locked when the writer's debris removal
# runs: it stops inside PosixStore's flock of the lease until told to go on.
SAVER = textwrap.dedent("""
    import fcntl, os, sys, time
    from pathlib import Path
    import numpy as np
    from uckpt.storage.blob import posix
    from uckpt.storage.blob.posix import PosixStore
    from uckpt.storage.checkpoint import BlobCheckpointStore

    root, sig = Path(sys.argv[1]), Path(sys.argv[2])
    real, first = fcntl.flock, [True]

    class Fcntl:
        def __getattr__(self, name):
            return getattr(fcntl, name)

        def flock(self, fd, op):
            if first[0] and os.readlink(f"/proc/self/fd/{fd}").endswith(".lease"):
                first[0] = False
                (sig / "opened").touch()
                while not (sig / "go").exists():
                    time.sleep(0.01)
            return real(fd, op)

    posix.fcntl = Fcntl()
    sink = BlobCheckpointStore(PosixStore(root), "", str(root)).sink("step_1")
    sink.write_pieces("data-00000.bin", 8, [(0, np.arange(8, dtype=np.uint8))])
    (sig / "written").touch()
    while not (sig / "commit").exists():
        time.sleep(0.01)
    sink.commit(b"{}")
    """)


def test_a_save_between_making_and_locking_its_lease_is_never_debris(tmp_path):
    """The writer's debris removal runs while a save of another process has made its
    lease but not locked it yet: the save still holds a lease that later sweeps see, so
    its temporary directory survives them and it commits (before, the sweep unlinked the
    unlocked lease, the save locked the unlinked file, and the next sweep removed the
    live save's directory)."""
    root, sig = tmp_path / "root", tmp_path / "sig"
    root.mkdir()
    sig.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    saver = subprocess.Popen([sys.executable, "-c", SAVER, str(root), str(sig)], env=env,
                             stderr=subprocess.PIPE, text=True)
    try:
        wait_for(sig / "opened", saver)
        layer(root).remove_debris()  # the lease is there, unlocked
        (sig / "go").touch()
        wait_for(sig / "written", saver)
        assert layer(root).remove_debris() == []
        tmp = [p for p in root.iterdir() if p.is_dir() and ".uckpt-tmp-" in p.name]
        assert len(tmp) == 1 and (tmp[0] / "data-00000.bin").read_bytes() == bytes(range(8))
        (sig / "commit").touch()
        assert saver.wait(60) == 0, saver.stderr.read()
    finally:
        saver.kill()
        saver.wait()
    assert (root / "step_1" / "data-00000.bin").read_bytes() == bytes(range(8))
    assert layer(root).steps() == [1]
    assert sorted(p.name for p in root.iterdir()) == ["step_1"]  # no lease left behind


def test_locations_of_a_local_root_are_paths_and_listings_strings(tmp_path):
    """As a local root always gave them: ``location`` (what CheckpointManager.path and
    uckpt.convert return) a Path, an Entry's ``where`` a str."""
    store = layer(tmp_path)
    sink = store.sink("step_1")
    sink.write_pieces("data-00000.bin", 4, [(0, b"abcd")])
    sink.commit(b"{}")
    assert store.location("step_1") == tmp_path / "step_1"
    assert isinstance(store.location("step_1"), Path)
    [entry] = store.entries()
    assert entry.where == str(tmp_path / "step_1") and isinstance(entry.where, str)
    assert store.within("old").location("step_1") == tmp_path / "old" / "step_1"


def test_the_writer_lock_keeps_its_holder_in_the_lock_file(tmp_path):
    """As local roots always had it: one file, ``.uckpt-writer.lock``, locked and naming
    its holder (tools and tests look for no other file at the root), and a refusal that
    names the holder with local's hint."""
    first = layer(tmp_path).writer_lock("job1", False)
    assert first.try_acquire() is None
    try:
        assert sorted(p.name for p in tmp_path.iterdir()) == [".uckpt-writer.lock"]
        record = json.loads((tmp_path / ".uckpt-writer.lock").read_bytes())
        assert record["pid"] == os.getpid() and record["job"] == "job1"
        second = layer(tmp_path).writer_lock("job2", False)
        assert second.try_acquire()["job"] == "job1"
        err = second.refusal()
        assert isinstance(err, errors.RootLockedError) and isinstance(err, BlockingIOError)
        assert f"is held by process {os.getpid()} on host {socket.gethostname()}" in str(err)
        assert err.hint == ("only one job may write to a root while an exclusive writer "
                            "holds it: stop that writer (its lock goes with its process), use "
                            "another root, or open this one read-only (role='reader') to "
                            "restore from it")
    finally:
        first.release()
    assert layer(tmp_path).writer_lock("job2", False).try_acquire() is None


def _first_data(d):
    return next(d.glob("data-*.bin"))


def _manifest_symlink(d):
    (d.parent / "real.json").write_bytes((d / "manifest.json").read_bytes())
    (d / "manifest.json").unlink()
    (d / "manifest.json").symlink_to(d.parent / "real.json")


def _data_symlink(d):
    f = _first_data(d)
    f.rename(d.parent / "outside.bin")
    f.symlink_to(d.parent / "outside.bin")


def _data_fifo(d):
    f = _first_data(d)
    f.unlink()
    os.mkfifo(f)


def _data_directory(d):
    f = _first_data(d)
    f.unlink()
    f.mkdir()


def _manifest_directory(d):
    (d / "manifest.json").unlink()
    (d / "manifest.json").mkdir()


@pytest.mark.parametrize("damage, error, message", [
    (_manifest_symlink, errors.NotACheckpointError,
     r"manifest '.*/step_1/manifest\.json' is a symbolic link \(to '.*real\.json'\), not a "
     "regular file"),
    (_manifest_directory, errors.NotACheckpointError,
     r"manifest '.*/step_1/manifest\.json' is a directory, not a regular file"),
    (_data_symlink, errors.CorruptCheckpointError,
     r"data file '.*/step_1/data-00000\.bin' is a symbolic link \(to '.*outside\.bin'\), not a "
     "regular file"),
    (_data_fifo, errors.CorruptCheckpointError,
     r"data file '.*/step_1/data-00000\.bin' is a FIFO \(named pipe\), not a regular file"),
    (_data_directory, errors.CorruptCheckpointError,
     r"data file '.*/step_1/data-00000\.bin' is a directory, not a regular file"),
    (lambda d: shutil.rmtree(d), errors.CheckpointNotFoundError,
     r"checkpoint '.*/step_1' does not exist"),
])
def test_reads_refuse_what_is_not_a_regular_file_naming_it_as_local_did(tmp_path, damage,
                                                                        error, message):
    """Local's messages, kept: what the file is to the checkpoint (manifest, data file),
    what stands there instead, and the remedy; never read through."""
    uckpt.save(tmp_path / "step_1", {"w": np.arange(8, dtype=np.float32)})
    damage(tmp_path / "step_1")
    with pytest.raises(error, match=message) as info:
        uckpt.load(layer(tmp_path).source("step_1"))
    if error is not errors.CheckpointNotFoundError:
        assert "never through a symbolic link" in info.value.hint


def test_a_reader_never_creates_a_missing_root_and_a_writer_does(tmp_path):
    missing = tmp_path / "no" / "root"
    store = layer(missing)
    assert not store.exists() and store.steps() == [] and not store.has("step_1")
    for listed in (store.entries, store.itself):  # as Store says: the root is missing
        with pytest.raises(errors.CheckpointNotFoundError, match="/no/root' does not exist"):
            listed()
    with pytest.raises(errors.CheckpointNotFoundError, match="checkpoint '.*/step_1' does not "
                                                              "exist"):
        uckpt.load(store.source("step_1"))
    assert store.remove_debris() == []  # nothing to sweep, nothing made
    assert not (tmp_path / "no").exists()
    sink = store.sink("step_1")
    sink.write_pieces("data-00000.bin", 2, [(0, b"ok")])
    sink.commit(b"{}")
    assert store.exists() and store.steps() == [1]


class _Counting(PosixStore):
    """A PosixStore that records every key its recursive listings hand out."""

    def __init__(self, root):
        super().__init__(root)
        self.listed = []

    def list(self, prefix=""):
        for key, size in super().list(prefix):
            self.listed.append(key)
            yield key, size

    def list_tree(self, prefix=""):
        tree = super().list_tree(prefix)
        self.listed.extend(tree.keys)
        return tree


def test_steps_and_entries_read_only_the_roots_own_entries(tmp_path):
    """As local roots: one level of the root, then only what may be a checkpoint; a big
    unrelated tree beside the checkpoints is never walked."""
    uckpt.save(tmp_path / "step_1", {"w": np.arange(4, dtype=np.float32)})
    junk = tmp_path / "datasets" / "a" / "b"
    junk.mkdir(parents=True)
    for i in range(50):
        (junk / f"f{i}").write_bytes(b"x")
    blob = _Counting(tmp_path)
    store = BlobCheckpointStore(blob, "", str(tmp_path))
    assert store.steps() == [1]
    assert [e.name for e in store.entries()] == ["step_1"]
    assert blob.listed and not [k for k in blob.listed if not k.startswith("step_1/")]


class _Watching(PosixStore):
    """A PosixStore that notes, before each prefix-moving call, whether ``step_1`` is
    committed at that moment (as a reader would see it)."""

    def __init__(self, root):
        super().__init__(root)
        self.seen = []

    def _note(self, call):
        self.seen.append((call, self.exists("step_1/manifest.json")))

    def rename_prefix(self, src, dst):
        super().rename_prefix(src, dst)
        self._note("rename")

    def exchange_prefix(self, a, b):
        done = super().exchange_prefix(a, b)
        self._note("exchange")
        return done


def test_an_overwrite_swaps_so_readers_never_miss_the_checkpoint(tmp_path):
    """renameat2(RENAME_EXCHANGE), as local roots did: the old checkpoint until the swap,
    the new one after, never neither (the rename aside left a moment without step_1)."""
    blob = _Watching(tmp_path)
    store = BlobCheckpointStore(blob, "", str(tmp_path))
    for data in (b"old!", b"new!"):
        sink = store.sink("step_1", overwrite=True)
        sink.write_pieces("data-00000.bin", 4, [(0, data)])
        sink.commit(b"{}", overwrite=True)
    assert blob.seen[1:] == [("exchange", True)]
    assert (tmp_path / "step_1" / "data-00000.bin").read_bytes() == b"new!"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_1"]  # the old one removed


def test_re_verification_reads_a_local_file_from_the_medium(tmp_path):
    """As local roots read before the layer: O_DIRECT where the file system takes it, else
    the cached pages dropped first (tmpfs), never the page cache's answer alone ("store
    read")."""
    uckpt.save(tmp_path / "step_1", {"w": np.arange(4096, dtype=np.float32)})
    source = layer(tmp_path).source("step_1")
    reader = source.medium_reader("data-00000.bin")
    try:
        assert reader.how in ("O_DIRECT", "fadvise(DONTNEED) read")
        buf = block_buffer()
        data = (tmp_path / "step_1" / "data-00000.bin").read_bytes()
        assert stored_checksum(reader, 100, 5000, buf) == format_checksum(crc32c(data[100:5100]))
    finally:
        reader.close()
        source.close()
    with pytest.raises(errors.CheckpointNotFoundError, match="data file .* is missing"):
        source.medium_reader("data-00001.bin")


def _cached_pages(path: Path) -> tuple:
    """(pages of ``path`` in the page cache, pages of it): mincore(2) of a read-only map."""
    import ctypes
    import mmap
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = path.stat().st_size
    pages = -(-size // mmap.PAGESIZE)
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
        try:
            vec = ctypes.create_string_buffer(pages)
            assert libc.mincore(addr, size, vec) == 0, ctypes.get_errno()
            return sum(b & 1 for b in vec.raw), pages
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def test_a_saved_manifest_stays_in_the_page_cache_for_the_load_after(tmp_path):
    """A small object (here the manifest) goes in one buffered write, not O_DIRECT: the
    load or verify that follows a save reads it from memory, not from the disk."""
    uckpt.save(tmp_path / "step_1", {"w": np.arange(40000, dtype=np.float32)})
    cached, pages = _cached_pages(tmp_path / "step_1" / "manifest.json")
    assert pages >= 1 and cached == pages
    PosixStore(tmp_path / "blobs").write("a/small", b"x" * 20000)
    assert _cached_pages(tmp_path / "blobs" / "a" / "small") == (5, 5)


def test_a_base_whose_manifest_is_a_symlink_is_not_committed(tmp_path):
    """As local roots judged it before the layer: an incremental checkpoint's base is
    committed only by a regular manifest; a symlinked one is named, never followed."""
    uckpt.save(tmp_path / "step_1", {"w": np.arange(4, dtype=np.float32)})
    base = tmp_path / "step_1"
    os.rename(base / "manifest.json", tmp_path / "real.json")
    os.symlink(tmp_path / "real.json", base / "manifest.json")
    (tmp_path / "step_2").mkdir()
    with pytest.raises(errors.CorruptCheckpointError,
                       match=r"base checkpoint '.*step_1' that the manifest refers to is not "
                             r"committed: manifest '.*step_1/manifest\.json' is a symbolic link "
                             r"\(to '.*real\.json'\), not a regular file"):
        layer(tmp_path).source("step_2").sibling("step_1")


def test_a_listing_names_symlinked_steps_and_odd_entries_as_local_roots_did(tmp_path):
    """A symlink named like a step is a LINK entry (never followed); a checkpoint whose
    manifest or data file is a FIFO, or whose manifest is a directory, is a damaged
    checkpoint naming what stands there, not a save in progress."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    for ck in (root / "step_00000001", root / "step_00000002", outside):
        uckpt.save(ck, {"w": np.arange(4, dtype=np.float32)})
    os.symlink(outside, root / "step_00000005")
    data = root / "step_00000001" / "data-00000.bin"
    data.unlink()
    os.mkfifo(data)
    manifest = root / "step_00000002" / "manifest.json"
    manifest.unlink()
    manifest.mkdir()
    store = layer(root)
    entries = {e.name: e for e in store.entries()}
    link = entries["step_00000005"]
    assert link.kind == "link" and link.step == 5
    assert link.reason == (f"a symbolic link (to {str(outside)!r}), not a checkpoint "
                           "directory: not followed")
    assert entries["step_00000001"].kind == "checkpoint"
    assert entries["step_00000001"].not_plain == {"data-00000.bin": "a FIFO (named pipe)"}
    assert entries["step_00000002"].kind == "checkpoint"
    assert entries["step_00000002"].not_plain == {"manifest.json": "a directory"}
    assert store.has("step_00000002") and store.steps() == [1, 2]


def test_a_listing_walks_a_tree_deeper_than_pythons_recursion_limit(tmp_path):
    with deep_directory(str(tmp_path), sys.getrecursionlimit() + 100) as deep:
        with open(os.path.join(deep, "x"), "wb") as f:
            f.write(b"12345")
        ((key, size),) = PosixStore(tmp_path).list()
        assert key.endswith("/d/x") and key.count("d/") == sys.getrecursionlimit() + 100
        assert size == 5


def test_a_reader_of_a_local_checkpoint_names_it_by_a_path(tmp_path):
    uckpt.save(tmp_path / "step_1", {"w": np.arange(4, dtype=np.float32)})
    with CheckpointReader(layer(tmp_path).source("step_1")) as reader:
        assert reader.directory == tmp_path / "step_1"


@pytest.fixture
def tiny_fs(tmp_path):
    from conftest import mount_tmpfs

    yield from mount_tmpfs(tmp_path / "tiny", "1m")


def test_a_held_writer_lock_lets_its_file_system_be_remounted_read_only(tiny_fs):
    """The lock keeps no file open for writing (its holder's record was written and the
    file closed again): a tier remounted read-only under a live writer is not "busy"."""
    lock = layer(tiny_fs / "root").writer_lock("job1", shared=False)
    assert lock.try_acquire() is None
    try:
        assert json.loads((tiny_fs / "root" / ".uckpt-writer.lock").read_bytes())["job"] == "job1"
        subprocess.run(["mount", "-o", "remount,ro", str(tiny_fs)], check=True)
        subprocess.run(["mount", "-o", "remount,rw", str(tiny_fs)], check=True)
    finally:
        lock.release()


def _moved_away(base):
    away = base.parent.parent / "elsewhere"
    shutil.move(base, away)
    os.symlink(away, base)


@pytest.mark.parametrize("damage, error, message", [
    (shutil.rmtree, errors.CheckpointNotFoundError,
     r"base checkpoint '.*/step_00000001' does not exist"),
    (_moved_away, errors.NotACheckpointError,
     r"'.*/step_00000001' is a symbolic link \(to '.*elsewhere'\), not a base checkpoint "
     "directory"),
], ids=["deleted", "symlink"])
def test_a_missing_or_symlinked_base_is_named_as_local_roots_named_it(tmp_path, damage, error,
                                                                      message):
    root = tmp_path / "root"
    w = {"w": np.arange(4096, dtype=np.float32)}
    with uckpt.CheckpointManager(root, incremental=True) as mgr:
        mgr.save(1, w)
        mgr.save(2, dict(w, b=np.ones(3)))
    assert uckpt.manifest(root / "step_00000002").bases
    damage(root / "step_00000001")
    with pytest.raises(error, match=message):
        uckpt.load(layer(root).source("step_00000002"))


def test_ranks_sharing_a_node_local_root_are_one_replica(tmp_path):
    """Ranks whose checkpoint directories differ (node-local storage) each make their own
    temporary prefix; those that share one directory, through separate store objects,
    are one replica (else each would commit it: "two savers wrote the same step")."""
    coordinator = layer(tmp_path / "node0").sink("c", shared=True)
    joined = [layer(tmp_path / "node1").join_sink("c", coordinator.token) for _ in range(2)]
    try:
        assert coordinator.replica() == "coordinator"
        first, second = (sink.replica() for sink in joined)
        assert first == second != "coordinator"
        assert layer(tmp_path / "node0").join_sink("c", coordinator.token).replica() \
            == "coordinator"
    finally:
        for sink in [coordinator] + joined:
            sink.abort()


class _Locking(PosixStore):
    """A PosixStore that counts the locks asked of it."""

    def __init__(self, root):
        super().__init__(root)
        self.asked = 0

    def lock(self, key, *, shared=False):
        self.asked += 1
        return super().lock(key, shared=shared)


def test_a_node_mate_takes_the_copy_as_one_replica_at_the_first_try(tmp_path):
    """The second rank of a node finds the save's lease on the node's copy held by the
    first: one try tells it so (it used to retry 100 times, 10 ms apart, before taking
    the copy as its node-mate's: about 1 s of every node-local save with 2 ranks per node)."""
    coordinator = layer(tmp_path / "node0").sink("c", shared=True)
    blob = _Locking(tmp_path / "node1")
    store = BlobCheckpointStore(blob, "", str(tmp_path / "node1"))
    first, second = (store.join_sink("c", coordinator.token) for _ in range(2))
    try:
        assert first.replica() == second.replica() != "coordinator"
        assert blob.asked == 2
    finally:
        for sink in (coordinator, first, second):
            sink.abort()


def test_an_oversized_manifest_is_refused_by_its_size_unread(tmp_path):
    uckpt.save(tmp_path / "c", {"w": np.arange(4, dtype=np.float32)})
    os.truncate(tmp_path / "c" / "manifest.json", 2 << 30)  # sparse: 2 GiB of zeros
    with pytest.raises(errors.ManifestError, match=r"manifest '.*/c/manifest\.json' holds "
                       rf"{2 << 30} bytes, more than {1 << 30} bytes, the most uckpt reads"):
        uckpt.load(layer(tmp_path).source("c"))


def test_delete_prefix_counts_what_others_removed_meanwhile_as_removed(tmp_path):
    """Ranks sharing a directory remove their own files while one rank deletes the prefix
    (an error reaching every rank of a save): a file gone before it is unlinked is
    removed, not an error, and the directory moved aside for the removal is gone too."""
    store = PosixStore(tmp_path)
    files = [f"data-{i:05d}.bin" for i in range(2000)]
    os.mkdir(tmp_path / "tmp")
    for name in files:
        (tmp_path / "tmp" / name).touch()
    dir_fd = os.open(tmp_path / "tmp", os.O_RDONLY | os.O_DIRECTORY)  # a rank's, held on
    started, failures = threading.Event(), []

    def other_rank():
        try:
            for i, name in enumerate(reversed(files)):
                if i == 100:
                    started.set()
                try:
                    os.unlink(name, dir_fd=dir_fd)
                except FileNotFoundError:
                    pass
        except BaseException as e:  # noqa: BLE001 - reported by the test
            failures.append(e)
        finally:
            started.set()

    other = threading.Thread(target=other_rank)
    other.start()
    try:
        started.wait()
        store.delete_prefix("tmp/")
    finally:
        other.join()
        os.close(dir_fd)
    assert failures == [] and os.listdir(tmp_path) == []


def test_what_killed_deletions_and_writes_left_is_the_writers_debris(tmp_path):
    """A deletion killed between moving a directory aside and removing it, or a write
    killed before its file was moved into place, left a name no listing shows, for
    good: the root's writer removes them with the debris (a write's file once it is
    older than knobs.debris_expiry_s: it may be live)."""
    m = uckpt.CheckpointManager(tmp_path)
    m.save(1, {"w": np.arange(4)})
    m.close()
    aside = tmp_path / ".uckpt-part-del-0badf00d"
    aside.mkdir()
    (aside / "manifest.json").write_bytes(b"{}")
    dead, live = tmp_path / ".uckpt-part-w-0badf00d", tmp_path / ".uckpt-part-w-0000cafe"
    dead.write_bytes(b"x")
    live.write_bytes(b"y")
    os.utime(dead, (time.time() - knobs.debris_expiry_s - 60,) * 2)
    m = uckpt.CheckpointManager(tmp_path, role="writer")  # removes debris
    assert m.steps() == [1]
    m.close()
    assert sorted(p.name for p in tmp_path.glob(".uckpt-part-*")) == [live.name]


def test_a_lease_file_back_after_a_crash_is_the_writers_debris(tmp_path):
    """A save removes its lease file without a directory fsync: one that comes back
    after a crash (its save committed, its temporary directory renamed into place) is a
    dead save's lease, which the root's next writer removes; the checkpoint stays."""
    root = tmp_path / "root"
    with uckpt.CheckpointManager(root) as mgr:
        mgr.save(1, {"a": np.arange(6.0)})
    back = root / ".step_00000001.uckpt-tmp-0123abcd.lease"
    back.touch()
    uckpt.CheckpointManager(root, role="reader").close()
    assert back.exists()  # a reader removes nothing
    with uckpt.CheckpointManager(root, role="writer") as mgr:  # a writer at once
        assert not back.exists() and mgr.steps() == [1]
    np.testing.assert_array_equal(uckpt.load(root / "step_00000001")["a"], np.arange(6.0))
