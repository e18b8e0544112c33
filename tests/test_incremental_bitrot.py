"""Incremental saves refer only to verified bytes (issue 25, section 2): a bit flipped in
a base's data file after it was written is found by the background re-read, logged with
every step that refers to it, and the next save is full; every save acknowledged after
that restores bitwise; a chunk that failed its read-back is never referred to."""
import logging
import os
import platform
import sys
import threading

import numpy as np
import pytest

import uckpt
from uckpt import errors, knobs
from incremental_common import CHUNK_BYTES, check, empty_state, manager, state

_IOPRIO_GET = {"x86_64": 252, "aarch64": 31}.get(platform.machine())


def flip_bit(path, offset: int) -> None:
    """Flip the lowest bit of one byte of a file in place, durably (bit rot)."""
    fd = os.open(path, os.O_RDWR)
    try:
        byte = os.pread(fd, 1, offset)
        os.pwrite(fd, bytes([byte[0] ^ 1]), offset)
        os.fsync(fd)
    finally:
        os.close(fd)


def settle(mgr) -> None:
    """Wait for the manager's background reads queued so far (none before issue 25)."""
    verifier = getattr(mgr, "_verifier", None)
    if verifier is not None:
        verifier.join()


def referenced_chunk(mgr, step: int, base: int):
    """A chunk of leaf 'table' of ``step`` that ``step`` refers to in ``base``."""
    name = mgr.path(base).name
    return next(c for c in mgr.manifest(step).arrays["table"].chunks if c.base == name)


def restored(mgr, step=None):
    out = empty_state()
    got = mgr.restore(out, step)
    return got, out


def damage_warnings(caplog):
    return [r.getMessage() for r in caplog.records
            if r.name == "uckpt.saving.reverify" and r.levelno == logging.WARNING]


def test_flipped_bit_in_a_base_is_found_logged_and_the_next_save_is_full(tmp_path, caplog):
    """Defaults (re-read every 10 saves that refer to a base): the bit flipped after save
    2 is found after save 11, the 10th referring to step 1; steps 1-11 are named, step 12
    refers to nothing, and steps 12-14 restore bitwise."""
    caplog.set_level(logging.INFO, logger="uckpt")
    root = tmp_path / "ck"
    with manager(root, incremental=True, full_every=100) as mgr:
        mgr.save(1, state(1))
        mgr.save(2, state(2))
        chunk = referenced_chunk(mgr, 2, 1)
        flip_bit(mgr.path(1) / chunk.file, chunk.offset + 100)
        for s in range(3, 12):
            mgr.save(s, state(s))
            assert mgr.path(1).name in mgr.manifest(s).bases  # refers to the damaged base
        settle(mgr)
        for s in range(12, 15):
            mgr.save(s, state(s))
        assert mgr.manifest(12).bases == {}  # a full save
        assert set(mgr.manifest(13).bases) == {mgr.path(12).name}
    warned = damage_warnings(caplog)
    assert len(warned) == 1
    assert f"{mgr.path(1)}/{chunk.file}: leaf 'table', chunk at byte offset {chunk.offset}" \
        in warned[0]
    assert "committed steps that refer to it (they may not restore): " \
        f"{list(range(1, 12))}" in warned[0]
    mgr = manager(root)
    for s in (12, 13, 14):  # every save acknowledged after the detection
        got, out = restored(mgr, s)
        assert got == s
        check(out, s)
    assert restored(mgr)[0] == 14
    with pytest.raises(errors.ChecksumMismatchError, match="checksum mismatch in leaf 'table'"):
        uckpt.load(mgr.path(11))


def test_a_chunk_damaged_before_its_read_back_is_never_referenced(tmp_path, caplog):
    """The bit flips between the write of step 1 and its read-back (a hook of the
    verifier, run on its thread just before the read): step 2 refers to nothing."""
    caplog.set_level(logging.INFO, logger="uckpt")
    root = tmp_path / "ck"
    flipped = []

    def rot(name, file):
        if name == "step_00000001" and not flipped:
            flipped.append(file)
            flip_bit(root / name / file, 3 * CHUNK_BYTES + 5)

    with manager(root, incremental=True) as mgr:
        mgr._verifier.before_read = rot
        mgr.save(1, state(1))
        mgr.save(2, state(2))
        mgr.save(3, state(3))
        assert flipped == ["data-00000.bin"]
        assert mgr.manifest(2).bases == {}
        assert set(mgr.manifest(3).bases) == {"step_00000002"}
    warned = damage_warnings(caplog)
    assert len(warned) == 1 and "step_00000001/data-00000.bin: leaf 'table'" in warned[0]
    assert "committed steps that refer to it (they may not restore): [1]" in warned[0]
    for s in (2, 3):
        got, out = restored(manager(root), s)
        check(out, s)


def test_an_unreadable_read_back_leaves_chunks_unverified(tmp_path, caplog):
    """A read-back that fails (here the data file is gone) verifies nothing, so the next
    save writes every chunk anew rather than refer to bytes nobody read."""
    caplog.set_level(logging.INFO, logger="uckpt")
    root = tmp_path / "ck"
    hidden = tmp_path / "hidden.bin"

    def hide(name, file):
        if name == "step_00000001":
            os.rename(root / name / file, hidden)

    with manager(root, incremental=True) as mgr:
        mgr._verifier.before_read = hide
        mgr.save(1, state(1))
        mgr._verifier.join()
        mgr._verifier.before_read = None
        os.rename(hidden, root / "step_00000001" / "data-00000.bin")
        mgr.save(2, state(2))
        assert mgr.manifest(2).bases == {}
    assert any("step_00000001/data-00000.bin could not be read back" in r.getMessage()
               for r in caplog.records)
    assert not damage_warnings(caplog)


@pytest.mark.parametrize("every", [1, 3])
def test_reverify_every_sets_how_often_a_base_is_read_again(tmp_path, every):
    """Step 1 stays the base of most chunks; saves 2-7 refer to it: it is read back once
    after its save, then once every ``every`` saves that refer to it."""
    reads = []
    with manager(tmp_path / "ck", incremental=True, full_every=100,
                                 reverify_every=every) as mgr:
        mgr._verifier.before_read = lambda name, file: reads.append(name)
        for s in range(1, 8):
            mgr.save(s, state(s))
            settle(mgr)
    assert reads.count("step_00000001") == 1 + 6 // every
    assert reads.count("step_00000007") == 1  # its own read-back; nothing refers to it yet


def test_reverify_every_must_be_a_positive_int(tmp_path):
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="reverify_every must be a positive int"):
            manager(tmp_path, incremental=True, reverify_every=bad)


def _io_class() -> int:
    """This thread's I/O priority class (Linux ioprio_get; 0: none set)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(_IOPRIO_GET, 1, threading.get_native_id()) >> 13


@pytest.mark.parametrize("async_save", [False, True])
def test_reads_run_off_the_callers_thread_at_low_io_priority(tmp_path, async_save):
    seen = {}

    def record(name, file):
        t = threading.current_thread()
        seen.setdefault(t.name, set()).add(
            (t is not threading.main_thread(),
             _io_class() if sys.platform == "linux" and _IOPRIO_GET else None))

    with manager(tmp_path / "ck", incremental=True, async_save=async_save,
                                 reverify_every=1) as mgr:
        mgr._verifier.before_read = record
        for s in range(1, 4):
            mgr.save(s, state(s))
            mgr.wait()
            settle(mgr)
    linux = sys.platform == "linux" and _IOPRIO_GET is not None
    # best-effort (2) for read-backs, idle (3) for re-reads of bases
    assert seen == {"uckpt-readback": {(True, 2 if linux else None)},
                    "uckpt-reverify": {(True, 3 if linux else None)}}


@pytest.mark.parametrize("async_save", [False, True])
def test_a_save_committed_after_the_damage_was_recorded_is_saved_again_in_full(
        tmp_path, caplog, async_save):
    """Damage recorded while step 3 is written, after step 3 took its baseline (which
    refers to the damaged chunk): step 3 is committed, refused (DamagedBaseError) and, in
    one process, saved again over itself in full; it restores bitwise. Hooks order the
    two threads."""
    caplog.set_level(logging.INFO, logger="uckpt")
    root = tmp_path / "ck"
    took_baseline = threading.Event()
    with manager(root, incremental=True, full_every=100, reverify_every=1,
                                 async_save=async_save) as mgr:
        verifier = mgr._verifier
        mgr.save(1, state(1))
        mgr.wait()
        settle(mgr)
        chunk = mgr.manifest(1).arrays["table"].chunks[0]  # no step here changes it
        usable, committed = verifier.usable, verifier.committed
        refusals = []

        def rot(name, file):  # the re-read of step 1 queued by the commit of step 2
            if name == "step_00000001":
                flip_bit(root / name / file, chunk.offset + 7)
                assert took_baseline.wait(60)

        def usable_then_tell(baseline):
            out = usable(baseline)
            if baseline is not None and baseline.name == "step_00000002":
                took_baseline.set()
            return out

        def committed_after_the_record(m, name):
            if name == "step_00000003" and not refusals:
                verifier.join()  # the re-read of step 1 is done and recorded
                with pytest.raises(errors.DamagedBaseError) as refused:
                    committed(m, name)
                refusals.append(refused.value)
            committed(m, name)

        verifier.usable, verifier.committed = usable_then_tell, committed_after_the_record
        verifier.before_read = rot
        mgr.save(2, state(2))
        mgr.save(3, state(3))
        mgr.wait()
        assert mgr.manifest(3).bases == {}  # saved again, in full
        mgr.save(4, state(4))
        mgr.wait()
        assert set(mgr.manifest(4).bases) == {"step_00000003"}
    assert len(refusals) == 1 and str(refusals[0]).startswith(
        f"{root}/step_00000003 was committed referring to {root}/step_00000001/data-00000.bin "
        f"(leaf 'table', byte offset {chunk.offset}), which was found damaged while it was "
        "written")
    assert any(r.name == "uckpt.saving.collective" and r.levelno == logging.WARNING and
               r.getMessage().endswith("; saving it again, in full") for r in caplog.records)
    warned = damage_warnings(caplog)
    assert len(warned) == 1 and "refer to it (they may not restore): [1, 2" in warned[0]
    mgr = manager(root)
    for s in (3, 4):
        got, out = restored(mgr, s)
        check(out, s)


def test_medium_reads_check_unaligned_chunks_across_blocks(tmp_path, monkeypatch):
    """The read-back's aligned block reads (O_DIRECT where the file system takes them)
    give the CRC of exactly a chunk's bytes, at any offset and length, across blocks;
    a chunk past the end of the file reads as None (truncated)."""
    from uckpt.storage import readback
    from uckpt.codecs.checksum import of
    from uckpt.storage import open_source

    monkeypatch.setattr(knobs, "read_block_bytes", 2 * readback.ALIGN)
    data = np.random.default_rng(0).integers(0, 256, 5 * readback.ALIGN + 123, np.uint8)
    (tmp_path / "data-00000.bin").write_bytes(data.tobytes())
    with open_source(tmp_path) as source:
        reader = source.medium_reader("data-00000.bin")
        buf = readback.block_buffer()
        try:
            assert reader.how in ("O_DIRECT", "fadvise(DONTNEED) read")
            for offset, length in [(0, 1), (5, 4091), (4095, 2), (100, 3 * readback.ALIGN + 7),
                                   (0, len(data)), (len(data) - 10, 10)]:
                assert readback.stored_checksum(reader, offset, length, buf) == \
                    of(data[offset:offset + length])
            assert readback.stored_checksum(reader, len(data) - 10, 11, buf) is None
        finally:
            reader.close()
