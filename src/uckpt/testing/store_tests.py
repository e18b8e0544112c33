"""The conformance suite of the blob layer: :class:`StoreTests`, a pytest base class every
:class:`~uckpt.storage.blob.base.BlobStore` passes (zarr's pattern).

Subclass it in a test module and give it a ``store`` fixture returning a fresh, empty
store::

    class TestMyStore(StoreTests):
        @pytest.fixture
        def store(self, tmp_path):
            return MyStore(tmp_path)

Every method is tested, and every operation a capability flag promises (a flag that is
False skips its tests and checks that the operation is refused). ``large_size`` is the
size of the object written in odd pieces to cross the store's buffer, block or
multipart boundaries: lower the store's thresholds in the fixture rather than raise it.
"""
from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar

import pytest

from ..errors import (CheckpointExistsError, CheckpointNotFoundError, CorruptCheckpointError,
                      InvalidKeyError, RootLockedError, SaveError, StoreCapabilityError,
                      UnsupportedObjectError)

if TYPE_CHECKING:
    from ..storage.blob.base import BlobStore

ODD_KEYS = ["a b/c d.bin", "ünï/ｋｅｙ.bin", "100%/#1?x=2&y+z", "t~/@:;,=!$'()[]{}", "-",
            ".hidden/.x", "x.y.z", "deep/" * 10 + "leaf"]
BAD_KEYS: list[Any] = ["", "/abs", "a/../b", "..", "../up", "a//b", "./a", "a/.", "a\0b",
                       ".uckpt-part-x", "a/.uckpt-part-w-1", 5, None, b"bytes"]


def pattern(n: int, seed: int = 0) -> bytes:
    """``n`` bytes that differ from those at other offsets (and of other seeds)."""
    import numpy as np

    i = np.arange(n, dtype=np.uint64)
    return ((i * 131 + seed * 17 + (i >> 8)) & 0xFF).astype(np.uint8).tobytes()


def run_threads(n: int, body: Callable[[int], Any]) -> list[Any]:
    """``body(i)`` on ``n`` threads started together; their results, or the first error."""
    results: list[Any] = [None] * n
    errors: list[BaseException] = []
    start = threading.Barrier(n)

    def run(i: int) -> None:
        try:
            start.wait()
            results[i] = body(i)
        except BaseException as e:  # noqa: BLE001 (pytest's outcomes too): re-raised below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


class StoreTests:
    """Tests of one blob store class; the subclass provides the ``store`` fixture."""

    large_size: ClassVar[int] = 3 * 4096 + 17
    threads: ClassVar[int] = 8

    @pytest.fixture
    def store(self) -> BlobStore:
        raise NotImplementedError("a subclass of StoreTests provides the `store` fixture")

    def get(self, store: BlobStore, key: str) -> bytes:
        return store.read(key, 1 << 30)

    # --- reading and writing ------------------------------------------------------------
    def test_write_then_read(self, store: BlobStore) -> None:
        data = pattern(1000)
        store.write("k", data)
        buf = bytearray(1000)
        assert store.read_into("k", 0, buf) == 1000 and bytes(buf) == data
        assert store.size("k") == 1000 and store.exists("k")
        assert self.get(store, "k") == data

    def test_ranges_and_reads_past_the_end(self, store: BlobStore) -> None:
        data = pattern(100)
        store.write("k", data)
        buf = bytearray(b"\xee" * 30)
        assert store.read_into("k", 10, buf) == 30 and bytes(buf) == data[10:40]
        buf = bytearray(b"\xee" * 30)
        assert store.read_into("k", 90, buf) == 10
        assert bytes(buf) == data[90:] + b"\xee" * 20  # beyond the end: untouched
        assert store.read_into("k", 100, bytearray(5)) == 0
        assert store.read_into("k", 1000, bytearray(5)) == 0

    def test_empty_object(self, store: BlobStore) -> None:
        store.write("e", b"")
        assert store.size("e") == 0 and store.exists("e")
        assert store.read_into("e", 0, bytearray(8)) == 0
        assert list(store.list()) == [("e", 0)]
        assert self.get(store, "e") == b""

    def test_pieces_of_any_buffer_type(self, store: BlobStore) -> None:
        import array

        import numpy as np

        floats = np.arange(10, dtype=np.float64)
        pieces = [b"ab", bytearray(b"cd"), memoryview(b"ef"), floats, array.array("i", [7]),
                  np.zeros((2, 3), np.uint8)]
        store.write("p", iter(pieces))  # type: ignore[arg-type]  # (arrays: Buffer from 3.12)
        expected = b"abcdef" + floats.tobytes() + array.array("i", [7]).tobytes() + bytes(6)
        assert self.get(store, "p") == expected
        out = np.empty(10, np.float64)
        assert store.read_into("p", 6, out) == 80  # type: ignore[arg-type]
        assert (out == floats).all()

    def test_overwrite_replaces_the_whole_object(self, store: BlobStore) -> None:
        store.write("k", pattern(5000))
        store.write("k", b"short")
        assert self.get(store, "k") == b"short" and store.size("k") == 5

    # --- the fast paths a store may override (write_pieces, write_image, readers) ---------
    def test_write_pieces_with_gaps_of_zeros(self, store: BlobStore) -> None:
        data = pattern(self.large_size, seed=4)
        n = len(data)
        spans = [(0, 5), (9, 4100), (4100, 4101), (8200, n - 7)]
        want = bytearray(n)
        for a, b in spans:
            want[a:b] = data[a:b]
        pieces = [(a, memoryview(data)[a:b]) for a, b in spans]
        store.write_pieces("sized", iter(pieces), n)  # zeros up to size
        store.write_pieces("reserved", iter(pieces), None, reserve=n + 4096)
        store.write_pieces("streamed", iter(pieces))
        assert self.get(store, "sized") == bytes(want)
        for key in ("reserved", "streamed"):  # each ends with its last piece
            assert self.get(store, key) == bytes(want[:n - 7]), key
        store.write_pieces("none", iter(()), None)
        assert self.get(store, "none") == b""
        assert sorted(k for k, _ in store.list()) == ["none", "reserved", "sized", "streamed"]

    def test_write_image_keeps_only_its_size(self, store: BlobStore) -> None:
        import mmap

        size = 2 * 4096 + 5
        image = mmap.mmap(-1, 3 * 4096)  # page-aligned, padded to whole pages
        image[:] = pattern(3 * 4096, seed=6)
        store.write_image("img", image, size)
        assert self.get(store, "img") == pattern(3 * 4096, seed=6)[:size]
        store.write_image("empty", image, 0)
        assert self.get(store, "empty") == b""

    def test_a_reader_reads_ranges_and_many_buffers_at_once(self, store: BlobStore) -> None:
        data = pattern(10_000, seed=7)
        store.write("r", data)
        reader = store.open_reader("r")
        try:
            assert reader.size == len(data)
            buf = bytearray(100)
            assert reader.read_into(50, buf) == 100 and bytes(buf) == data[50:150]
            bufs = [bytearray(3), bytearray(0), bytearray(4096), bytearray(7)]
            assert reader.read_vectored(11, bufs) == 3 + 4096 + 7
            assert b"".join(bufs) == data[11:11 + 3 + 4096 + 7]
            tail = [bytearray(40), bytearray(40)]  # short only where the object ends
            assert reader.read_vectored(len(data) - 50, tail) == 50
            assert bytes(tail[0]) + bytes(tail[1][:10]) == data[-50:]
        finally:
            reader.close()
            reader.close()  # a second close does nothing
        with pytest.raises(CheckpointNotFoundError):
            store.open_reader("missing")

    def test_copy_in_from_a_reader_of_any_store(self, store: BlobStore) -> None:
        from ..storage.blob.memory import MemoryStore

        data = pattern(self.large_size, seed=8)
        other = MemoryStore()
        other.write("src", data)
        store.write("src", data)
        for source, key in ((other, "from-other"), (store, "from-self")):
            reader = source.open_reader("src")
            try:
                assert store.copy_in(key, reader, len(data) - 3) == len(data) - 3
                assert self.get(store, key) == data[:-3]
                # a source shorter than asked: the bytes it had, and nothing written
                assert store.copy_in(key + "-short", reader, len(data) + 10) == len(data)
            finally:
                reader.close()
            assert not store.exists(key + "-short")
        assert not [k for k, _ in store.list() if "short" in k]

    def test_large_object_in_odd_pieces(self, store: BlobStore) -> None:
        data = pattern(self.large_size, seed=3)
        n = len(data)
        cuts = sorted({min(c, n) for c in (0, 1, 4095, 4097, 8191, n // 2, n - 1, n)})
        with store.open_writer("big") as out:
            for a, b in itertools.pairwise(cuts):
                out.write(memoryview(data)[a:b])
        assert store.size("big") == len(data)
        for offset in (0, 4095, 4096, 4097, len(data) // 2 + 1, len(data) - 3):
            buf = bytearray(5000)
            n = store.read_into("big", offset, buf)
            assert n == min(5000, len(data) - offset)
            assert bytes(buf[:n]) == data[offset:offset + n]
        assert self.get(store, "big") == data

    def test_large_object_from_one_buffer(self, store: BlobStore) -> None:
        data = pattern(self.large_size, seed=4)
        store.write("big", data)
        assert self.get(store, "big") == data

    def test_writer_commit_abort_and_visibility(self, store: BlobStore) -> None:
        out = store.open_writer("w")
        out.write(b"half")
        assert not store.exists("w") and list(store.list()) == []
        out.abort()
        assert not store.exists("w") and list(store.list()) == []
        with pytest.raises(RuntimeError, match="boom"), store.open_writer("w") as out:
            out.write(b"x")
            raise RuntimeError("boom")
        assert not store.exists("w") and list(store.list()) == []
        out = store.open_writer("w")
        out.write(b"done")
        out.commit()
        out.commit()  # a second commit does nothing
        assert self.get(store, "w") == b"done"
        with pytest.raises(SaveError, match="closed"):
            out.write(b"more")
        assert self.get(store, "w") == b"done"

    def test_odd_keys(self, store: BlobStore) -> None:
        for i, key in enumerate(ODD_KEYS):
            store.write(key, pattern(10 + i, seed=i))
        assert sorted(store.list()) == sorted((k, 10 + i) for i, k in enumerate(ODD_KEYS))
        for i, key in enumerate(ODD_KEYS):
            assert self.get(store, key) == pattern(10 + i, seed=i)
        for key in ODD_KEYS:
            store.delete(key)
        assert list(store.list()) == []

    # --- errors -------------------------------------------------------------------------
    def test_missing_keys(self, store: BlobStore) -> None:
        store.write("there/x", b"1")
        for key in ("nothing", "there/y", "there", "there/x/deeper", "no/such/dir/k"):
            for call in (partial(store.read_into, key, 0, bytearray(4)),
                         partial(store.read_into, key, 0, bytearray(0)),
                         partial(store.size, key), partial(store.read, key, 10)):
                with pytest.raises(CheckpointNotFoundError) as info:
                    call()
                assert isinstance(info.value, FileNotFoundError) and key in str(info.value)
            assert not store.exists(key)
            store.delete(key)  # no error
        assert list(store.list()) == [("there/x", 1)]

    def test_keys_escaping_the_root_are_refused(self, store: BlobStore) -> None:
        store.write("k", b"1")
        for key in BAD_KEYS:
            calls: list[Callable[[], object]] = [
                partial(store.read_into, key, 0, bytearray(4)), partial(store.size, key),
                partial(store.write, key, b"x"), partial(store.create_if_absent, key, b"x"),
                partial(store.delete, key), partial(store.open_writer, key)]
            for call in calls:
                with pytest.raises(InvalidKeyError, match="key") as info:
                    call()
                assert isinstance(info.value, ValueError)
        for prefix in ("/abs", "../up", "a/../..", "a//b"):
            calls = [partial(store.list, prefix), partial(store.list_dir, prefix),
                     partial(store.delete_prefix, prefix)]
            for call in calls:
                with pytest.raises(InvalidKeyError):
                    call()
        assert list(store.list()) == [("k", 1)]

    def test_bad_offsets_and_buffers(self, store: BlobStore) -> None:
        store.write("k", b"12345")
        for offset in (-1, 1.5, True, "0"):
            with pytest.raises(InvalidKeyError, match="offset"):
                store.read_into("k", offset, bytearray(2))  # type: ignore[arg-type]
        with pytest.raises(UnsupportedObjectError, match="writable"):
            store.read_into("k", 0, b"read-only")
        with pytest.raises(UnsupportedObjectError, match="buffers"):
            store.write("k", ["not a buffer"])  # type: ignore[list-item]
        assert self.get(store, "k") == b"12345"

    def test_read_is_capped(self, store: BlobStore) -> None:
        store.write("k", b"x" * 100)
        assert store.read("k", 100) == b"x" * 100
        with pytest.raises(CorruptCheckpointError, match="more than 99 bytes"):
            store.read("k", 99)

    # --- listing and deleting -----------------------------------------------------------
    def _tree(self, store: BlobStore) -> None:
        for key in ("a/1", "a/2/3", "ab/4", "b", "a/2/5"):
            store.write(key, key.encode())

    def test_list(self, store: BlobStore) -> None:
        self._tree(store)
        sizes = {k: len(k) for k in ("a/1", "a/2/3", "ab/4", "b", "a/2/5")}
        assert dict(store.list()) == sizes
        assert sorted(store.list("a")) == sorted(store.list("a/")) == \
            [("a/1", 3), ("a/2/3", 5), ("a/2/5", 5)]
        assert list(store.list("a/2/3/")) == [] and list(store.list("missing")) == []

    def test_list_dir(self, store: BlobStore) -> None:
        self._tree(store)
        assert store.list_dir() == (["b"], ["a/", "ab/"])
        assert store.list_dir("a") == (["a/1"], ["a/2/"])
        assert store.list_dir("a/2/") == (["a/2/3", "a/2/5"], [])
        assert store.list_dir("missing") == ([], [])

    def test_list_level_and_list_tree_agree_with_the_listings(self, store: BlobStore) -> None:
        """The batched listings a listing of many checkpoints uses say what the plain
        calls say, from one look."""
        self._tree(store)
        level = store.list_level("", holding="1")
        assert (level.keys, level.prefixes) == tuple(store.list_dir())
        assert level.others == store.others() and level.holding == ["a/"]
        assert store.list_level("a/", holding="3").holding == ["a/2/"]
        assert store.list_level("missing/", holding="1") == ([], [], {}, [])
        tree = store.list_tree("a/")
        assert tree.keys == dict(store.list("a/")) and tree.prefixes == ["a/2/"]
        assert tree.others == store.others("a/") and store.list_tree("missing").keys == {}
        assert store.occupied("a/1") and not store.occupied("a/9")
        assert store.occupied("a/2") == store.local_files  # a directory of its own

    def test_delete_and_delete_prefix(self, store: BlobStore) -> None:
        self._tree(store)
        store.delete("a/1")
        store.delete_prefix("a/2")
        assert dict(store.list()) == {"ab/4": 4, "b": 1}
        store.delete_prefix("nothing/here")
        with pytest.raises(InvalidKeyError, match="whole store"):
            store.delete_prefix("")
        assert dict(store.list()) == {"ab/4": 4, "b": 1}

    # --- create-if-absent ---------------------------------------------------------------
    def test_create_if_absent(self, store: BlobStore) -> None:
        assert store.create_if_absent("c/m", b"first") is True
        assert store.create_if_absent("c/m", b"second") is False
        assert self.get(store, "c/m") == b"first"

    def test_create_if_absent_race_has_one_winner(self, store: BlobStore) -> None:
        if not store.conditional_create:
            pytest.skip(f"{type(store).__name__} has no atomic create_if_absent")
        for round_ in range(3):
            key = f"race/{round_}"
            won = run_threads(self.threads, partial(self._create, store, key))
            assert won.count(True) == 1, won
            winner = won.index(True)
            assert self.get(store, key) == pattern(64 + winner, seed=winner)

    @staticmethod
    def _create(store: BlobStore, key: str, i: int) -> bool:
        return store.create_if_absent(key, pattern(64 + i, seed=i))

    # --- versions (a lease lock's object), copies ------------------------------------------
    def test_versions(self, store: BlobStore) -> None:
        tag = store.create_versioned("v/lock", b"one")
        assert tag is not None and store.create_versioned("v/lock", b"two") is None
        seen = store.read_versioned("v/lock", 100)
        assert seen.data == b"one" and seen.tag == tag
        assert (seen.modified is None) == (seen.now is None)
        new = store.replace_if("v/lock", b"three", tag)
        assert new is not None and new != tag
        assert store.replace_if("v/lock", b"four", tag) is None  # a stale version
        assert store.delete_if("v/lock", tag) is False
        assert self.get(store, "v/lock") == b"three"
        assert store.delete_if("v/lock", new) is True and not store.exists("v/lock")
        assert store.replace_if("v/lock", b"five", new) is None  # gone

    def test_copy(self, store: BlobStore) -> None:
        data = pattern(self.large_size, seed=3)
        store.write("c/src", data)
        store.copy("c/src", "c/dst")
        assert self.get(store, "c/dst") == data and self.get(store, "c/src") == data
        with pytest.raises(CheckpointNotFoundError):
            store.copy("c/none", "c/dst2")

    # --- concurrency --------------------------------------------------------------------
    def test_concurrent_writers_and_readers(self, store: BlobStore) -> None:
        size, rounds = 4096 + 100, 6
        store.write("shared", bytes([0]) * size)

        def body(i: int) -> None:
            for r in range(rounds):
                if i % 2:  # a writer: its own keys, and whole versions of a shared one
                    store.write(f"own/{i}/{r}", pattern(300 + r, seed=i))
                    store.write("shared", bytes([i * rounds + r + 1 & 0xFF]) * size)
                else:  # a reader: always one whole version
                    buf = bytearray(size)
                    assert store.read_into("shared", 0, buf) == size
                    assert buf.count(buf[0]) == size, "a reader saw a mix of two versions"

        run_threads(self.threads, body)
        for i in range(1, self.threads, 2):
            for r in range(rounds):
                assert self.get(store, f"own/{i}/{r}") == pattern(300 + r, seed=i)
        last = self.get(store, "shared")
        assert len(last) == size and last.count(last[0]) == size

    # --- optional operations ------------------------------------------------------------
    def test_capability_flags(self, store: BlobStore) -> None:
        for flag in ("atomic_rename", "conditional_create", "advisory_locks", "direct_io",
                     "multipart", "durable"):
            assert isinstance(getattr(store, flag), bool), flag
        if not store.atomic_rename:
            with pytest.raises(StoreCapabilityError, match="atomic_rename") as info:
                store.rename_prefix("a", "b")
            assert isinstance(info.value, NotImplementedError)
        if not store.advisory_locks:
            with pytest.raises(StoreCapabilityError, match="advisory_locks"):
                store.lock("lock")

    def test_rename_prefix(self, store: BlobStore) -> None:
        if not store.atomic_rename:
            pytest.skip(f"{type(store).__name__} has no atomic rename")
        self._tree(store)
        store.rename_prefix("a", "moved/here")
        assert dict(store.list()) == {"moved/here/1": 3, "moved/here/2/3": 5,
                                      "moved/here/2/5": 5, "ab/4": 4, "b": 1}
        assert self.get(store, "moved/here/2/3") == b"a/2/3"

    def test_staged_prefix_is_whole_after_its_rename(self, store: BlobStore) -> None:
        """What a store object writes, replaces and deletes below a prefix it staged is
        there, as written, after the rename (or gone with ``delete_prefix``); staging ends
        with ``unstage``, and nothing outside the prefix changes."""
        store.write("b", b"b")
        store.stage("tmp/")
        store.write("tmp/x", b"first")
        store.write("tmp/x", b"x")
        store.write_pieces("tmp/sub/y", [(0, b"yy")], 3)
        store.write("tmp/gone", b"g")
        store.delete("tmp/gone")
        if store.atomic_rename:
            store.rename_prefix("tmp", "final")
            assert dict(store.list()) == {"b": 1, "final/x": 1, "final/sub/y": 3}
            assert self.get(store, "final/sub/y") == b"yy\0"
        else:
            store.delete_prefix("tmp")
            assert dict(store.list()) == {"b": 1}
        store.unstage("tmp/")
        store.unstage("never/")  # nothing staged there: no error
        store.delete("b", durable=False)
        assert not store.exists("b")

    def test_rename_prefix_never_replaces(self, store: BlobStore) -> None:
        if not store.atomic_rename:
            pytest.skip(f"{type(store).__name__} has no atomic rename")
        self._tree(store)
        before = dict(store.list())
        for dst in ("ab", "a/2", "b"):  # holds keys; is a key
            with pytest.raises(CheckpointExistsError) as info:
                store.rename_prefix("a/2" if dst != "a/2" else "ab", dst)
            assert isinstance(info.value, FileExistsError)
        for src in ("missing", "x/missing", "b"):  # nothing below; a key, not a prefix
            with pytest.raises(CheckpointNotFoundError, match="nothing below"):
                store.rename_prefix(src, "elsewhere")
        for src, dst in (("a", "a/2/x"), ("a/2", "a"), ("a", "a"), ("", "x"), ("a", "")):
            with pytest.raises(InvalidKeyError, match="rename_prefix"):
                store.rename_prefix(src, dst)
        assert dict(store.list()) == before

    def test_rename_race_has_one_winner(self, store: BlobStore) -> None:
        if not store.atomic_rename:
            pytest.skip(f"{type(store).__name__} has no atomic rename")
        for i in range(self.threads):
            store.write(f"tmp{i}/data", pattern(10, seed=i))

        def rename(i: int) -> bool:
            try:
                store.rename_prefix(f"tmp{i}", "final")
            except CheckpointExistsError:
                return False
            return True

        won = run_threads(self.threads, rename)
        assert won.count(True) == 1, won
        winner = won.index(True)
        assert self.get(store, "final/data") == pattern(10, seed=winner)

    def test_exchange_prefix(self, store: BlobStore) -> None:
        if not store.atomic_exchange:
            pytest.skip(f"{type(store).__name__} has no atomic exchange")
        store.write("swap/a/x", b"from a")
        store.write("other/b/y", b"from b")
        if not store.exchange_prefix("swap/a", "other/b/"):
            pytest.skip("this file system does not take an atomic exchange")
        assert sorted(store.list("swap/a")) == [("swap/a/y", 6)]
        assert store.read("other/b/x", 10) == b"from a"
        with pytest.raises(CheckpointNotFoundError):
            store.exchange_prefix("swap/a", "missing")
        with pytest.raises(InvalidKeyError):
            store.exchange_prefix("swap", "swap/a")

    def test_locks(self, store: BlobStore) -> None:
        if not store.advisory_locks:
            pytest.skip(f"{type(store).__name__} has no advisory locks")
        first = store.lock("locks/writer")
        with pytest.raises(RootLockedError, match="held") as info:
            store.lock("locks/writer")
        assert isinstance(info.value, BlockingIOError)
        with pytest.raises(RootLockedError):
            store.lock("locks/writer", shared=True)
        first.release()
        first.release()  # a second release does nothing
        with store.lock("locks/writer", shared=True), \
                store.lock("locks/writer", shared=True), pytest.raises(RootLockedError):
            store.lock("locks/writer")
        store.lock("locks/writer").release()
        store.lock("locks/other").release()

    def test_a_lock_keeps_its_record_in_place(self, store: BlobStore) -> None:
        """:meth:`BlobLock.note`: the record is the lock key's object, and the lock stays
        held (on a file: the locked file itself, not one renamed over it)."""
        if not store.advisory_locks:
            pytest.skip(f"{type(store).__name__} has no advisory locks")
        with store.lock("locks/rec") as held:
            held.note(b"first record")
            held.note(b"second")
            assert store.read("locks/rec", 100) == b"second"
            with pytest.raises(RootLockedError):
                store.lock("locks/rec")
        store.lock("locks/rec").release()
