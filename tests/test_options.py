"""Options, not globals: uckpt.SaveOptions shapes what a save writes, the manager's
keywords come in option groups, and the old UCKPT_ layout variables change nothing."""
import os
import subprocess
import threading

import numpy as np
import pytest

import uckpt
from uckpt import errors
from uckpt.testing import run_ranks
from conftest import PYTHON, REPO

STATE = {"w": np.arange(4096, dtype=np.float32).reshape(256, 16),  # 16 KiB: rows of 64 B
         "b": np.arange(3, dtype=np.int8), "step": 3}


def first_offsets(path):
    """Each array's first chunk offset in its data file, by path."""
    return {p: min(c.offset for c in e.chunks)
            for p, e in uckpt.manifest(path).arrays.items() if e.chunks}


def chunk_counts(path):
    return {p: len(e.chunks) for p, e in uckpt.manifest(path).arrays.items()}


# --- the objects ---------------------------------------------------------------------------
def test_defaults_are_what_a_save_without_options_writes():
    assert uckpt.SaveOptions() == uckpt.SaveOptions(
        chunk_bytes=64 << 20, incremental_chunk_bytes=1 << 20, alignment=64,
        compression=None, compression_level=None)
    assert uckpt.SaveOptions().codec is None
    assert uckpt.RetentionOptions() == uckpt.RetentionOptions(keep=None, durable_every=1)
    assert uckpt.AsyncOptions() == uckpt.AsyncOptions(max_inflight=1, late_snapshot=None)
    assert uckpt.IncrementalOptions() == uckpt.IncrementalOptions(full_every=10,
                                                                  reverify_every=10)


@pytest.mark.parametrize("kwargs, message", [
    ({"chunk_bytes": 0}, "SaveOptions.chunk_bytes must be a positive int, got 0"),
    ({"chunk_bytes": 1.5}, "SaveOptions.chunk_bytes must be a positive int, got 1.5"),
    ({"incremental_chunk_bytes": True},
     "SaveOptions.incremental_chunk_bytes must be a positive int, got True"),
    ({"alignment": 48}, "SaveOptions.alignment must be a power of two, got 48"),
    ({"alignment": -64}, "SaveOptions.alignment must be a positive int, got -64"),
])
def test_save_options_refuse_bad_fields_by_name(kwargs, message):
    with pytest.raises(errors.OptionsError) as ei:
        uckpt.SaveOptions(**kwargs)
    assert isinstance(ei.value, ValueError)
    assert str(ei.value).startswith(message) and ei.value.hint


def test_save_options_refuse_bad_compression():
    with pytest.raises(errors.CompressionError, match="unknown compression 'lz4'"):
        uckpt.SaveOptions(compression="lz4")
    with pytest.raises(errors.CompressionError, match="compression_level=3 given without"):
        uckpt.SaveOptions(compression_level=3)


@pytest.mark.parametrize("cls, kwargs, message", [
    ("RetentionOptions", {"durable_every": 0},
     "RetentionOptions.durable_every must be a positive int, got 0"),
    ("AsyncOptions", {"max_inflight": 0}, "AsyncOptions.max_inflight must be a positive int"),
    ("IncrementalOptions", {"full_every": -1},
     "IncrementalOptions.full_every must be a positive int, got -1"),
    ("IncrementalOptions", {"reverify_every": "10"},
     "IncrementalOptions.reverify_every must be a positive int, got '10'"),
])
def test_manager_option_groups_refuse_bad_fields_by_name(cls, kwargs, message):
    with pytest.raises(errors.OptionsError, match=message):
        getattr(uckpt, cls)(**kwargs)


def test_retention_options_refuse_a_bad_policy_when_made():
    with pytest.raises(TypeError, match="retention must be None, an int"):
        uckpt.RetentionOptions(keep="all")


# --- saves ---------------------------------------------------------------------------------
def test_save_options_shape_the_layout(tmp_path):
    """Chunk size and alignment as asked, visible in the manifest; knobs untouched."""
    plain = uckpt.save(tmp_path / "plain", STATE)
    assert chunk_counts(plain) == {"w": 1, "b": 1}
    assert first_offsets(plain) == {"w": 0, "b": 16384}  # b follows w, 64-byte aligned
    shaped = uckpt.save(tmp_path / "shaped", STATE,
                        options=uckpt.SaveOptions(chunk_bytes=1024, alignment=65536))
    assert chunk_counts(shaped) == {"w": 16, "b": 1}  # 16 KiB in slabs of 1 KiB
    assert first_offsets(shaped) == {"w": 0, "b": 65536}
    out = uckpt.load(shaped)
    assert np.array_equal(out["w"], STATE["w"]) and np.array_equal(out["b"], STATE["b"])


def test_save_options_compress(tmp_path):
    path = uckpt.save(tmp_path / "z", {"z": np.zeros(1 << 16, np.float32)},
                      options=uckpt.SaveOptions(compression="zstd", compression_level=3))
    assert [c.codec for c in uckpt.manifest(path).arrays["z"].chunks] == [("bytegroup", "zstd")]


def test_incremental_chunk_bytes_cut_incremental_saves(tmp_path):
    opts = uckpt.SaveOptions(incremental_chunk_bytes=2048)
    one = uckpt.save(tmp_path / "one", STATE, incremental=True, options=opts)
    assert chunk_counts(one) == {"w": 8, "b": 1}
    state = dict(STATE, w=STATE["w"].copy())
    state["w"][200] = -1  # in the 7th slab of 32 rows
    two = uckpt.save(tmp_path / "two", state, base=one, options=opts)
    written = [c for c in uckpt.manifest(two).arrays["w"].chunks if c.base is None]
    assert [c.start for c in written] == [(192, 0)]
    assert np.array_equal(uckpt.load(two)["w"], state["w"])


def test_options_and_compression_keywords_are_not_given_together(tmp_path):
    with pytest.raises(errors.OptionsError,
                       match="uckpt.save: compression given both as a keyword and in "
                             "SaveOptions") as ei:
        uckpt.save(tmp_path / "c", STATE, compression="zstd", options=uckpt.SaveOptions())
    assert "inside SaveOptions" in ei.value.hint
    with pytest.raises(errors.OptionsError, match="options must be a uckpt.SaveOptions, got dict"):
        uckpt.save(tmp_path / "c", STATE, options={"chunk_bytes": 1024})
    assert not (tmp_path / "c").exists()


def test_two_saves_at_once_keep_their_own_layouts(tmp_path):
    """Threads saving at the same time with different options: each checkpoint is laid out
    as its own options say (a process-wide setting would leak from one to the other)."""
    layouts = {"a": uckpt.SaveOptions(chunk_bytes=1024, alignment=4096),
               "b": uckpt.SaveOptions(chunk_bytes=8192, alignment=8)}
    start = threading.Barrier(2)
    failed = []

    def saves(name):
        try:
            for i in range(20):
                start.wait()
                uckpt.save(tmp_path / f"{name}{i}", STATE, options=layouts[name])
        except BaseException as e:  # noqa: BLE001 - reported below
            failed.append(e)
            start.abort()

    threads = [threading.Thread(target=saves, args=(n,)) for n in layouts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failed, failed
    for i in range(20):
        assert chunk_counts(tmp_path / f"a{i}") == {"w": 16, "b": 1}
        assert first_offsets(tmp_path / f"a{i}") == {"w": 0, "b": 16384}
        assert chunk_counts(tmp_path / f"b{i}") == {"w": 2, "b": 1}
        assert first_offsets(tmp_path / f"b{i}") == {"w": 0, "b": 16384}


def test_several_ranks_honour_a_chunk_size_below_1_mib(tmp_path):
    """Ranks spread a save in chunks of at least 1 MiB, unless the options ask for less."""
    opts = uckpt.SaveOptions(chunk_bytes=2048)
    for outcome in run_ranks(2, lambda comm: uckpt.save(tmp_path / "c", STATE, comm=comm,
                                                        options=opts)):
        assert not isinstance(outcome, BaseException), outcome
    m = uckpt.manifest(tmp_path / "c")
    assert len(m.arrays["w"].chunks) == 8 and {c.file for c in m.arrays["w"].chunks} == \
        {"data-00000.bin", "data-00001.bin"}


def test_old_layout_environment_variables_change_nothing(tmp_path):
    """UCKPT_CHUNK_BYTES, UCKPT_ALIGNMENT and UCKPT_INCREMENTAL_CHUNK_BYTES are gone: a
    save laid out by the environment would differ from run to run of the same code."""
    code = ("import sys, numpy as np, uckpt\n"
            "w = np.arange(4096, dtype=np.float32)\n"
            "uckpt.save(sys.argv[1], {'w': w, 'b': np.arange(3, dtype=np.int8)})\n"
            "uckpt.save(sys.argv[2], {'w': w}, incremental=True)\n")
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), UCKPT_CHUNK_BYTES="1024",
               UCKPT_ALIGNMENT="4096", UCKPT_INCREMENTAL_CHUNK_BYTES="1024")
    subprocess.run([PYTHON, "-c", code, tmp_path / "full", tmp_path / "inc"], env=env,
                   check=True, timeout=120)
    assert chunk_counts(tmp_path / "full") == {"w": 1, "b": 1}
    assert first_offsets(tmp_path / "full") == {"w": 0, "b": 16384}
    assert chunk_counts(tmp_path / "inc") == {"w": 1}


def test_consolidate_takes_options(tmp_path):
    src = uckpt.save(tmp_path / "src", STATE)
    dst = uckpt.consolidate(src, tmp_path / "dst",
                            options=uckpt.SaveOptions(chunk_bytes=4096, alignment=8192))
    assert chunk_counts(dst) == {"w": 4, "b": 1}
    assert first_offsets(dst) == {"w": 0, "b": 16384}
    assert np.array_equal(uckpt.load(dst)["w"], STATE["w"])


# --- the manager ---------------------------------------------------------------------------
def test_manager_saves_with_its_save_options(tmp_path):
    opts = uckpt.SaveOptions(chunk_bytes=4096, alignment=32768, compression="zstd")
    with uckpt.CheckpointManager(tmp_path, save_options=opts,
                                 retention=uckpt.RetentionOptions(keep=1),
                                 async_save=uckpt.AsyncOptions(max_inflight=2)) as m:
        for step in (1, 2, 3):
            m.save(step, STATE)
        m.wait()
        assert m.steps() == [3]
        assert m.options.async_save.max_inflight == 2
    man = uckpt.manifest(m.path(3))
    assert len(man.arrays["w"].chunks) == 4
    assert {c.codec for c in man.arrays["w"].chunks} == {("bytegroup", "zstd")}
    assert min(c.offset for c in man.arrays["b"].chunks) % 32768 == 0


def test_compressed_copies_to_a_durable_tier_keep_the_alignment(tmp_path):
    opts = uckpt.SaveOptions(alignment=32768)
    with uckpt.CheckpointManager(tiers=[tmp_path / "fast", uckpt.Tier(
            tmp_path / "durable", compression="zstd")], save_options=opts) as m:
        m.save(1, STATE)
        m.wait()
    copied = uckpt.manifest(m.path(1, tier=1))
    assert {c.codec for c in copied.arrays["w"].chunks} == {("bytegroup", "zstd")}
    assert first_offsets(m.path(1, tier=1))["b"] == 32768


def test_manager_incremental_options(tmp_path):
    with uckpt.CheckpointManager(tmp_path, incremental=uckpt.IncrementalOptions(full_every=2),
                                 save_options=uckpt.SaveOptions(incremental_chunk_bytes=4096)
                                 ) as m:
        state = dict(STATE, w=STATE["w"].copy())
        for step in (1, 2, 3):
            state["w"][0] = step
            m.save(step, state)
        assert m.incremental and m.full_every == 2
        assert [bool(m.manifest(s).bases) for s in (1, 2, 3)] == [False, True, False]
        assert len(m.manifest(2).arrays["w"].chunks) == 4


@pytest.mark.parametrize("kwargs, message", [
    ({"retention": uckpt.RetentionOptions(keep=2), "keep_last": 3},
     "keep_last given both as a keyword and in RetentionOptions"),
    ({"async_save": uckpt.AsyncOptions(), "max_inflight": 2},
     "max_inflight given both as a keyword and in AsyncOptions"),
    ({"incremental": uckpt.IncrementalOptions(), "full_every": 3, "reverify_every": 2},
     "full_every, reverify_every given both as a keyword and in IncrementalOptions"),
    ({"save_options": uckpt.SaveOptions(), "compression": "zstd"},
     "CheckpointManager: compression given both as a keyword and in SaveOptions"),
    ({"max_inflight": 0, "async_save": True}, "AsyncOptions.max_inflight must be a positive"),
    ({"durable_every": 0}, "RetentionOptions.durable_every must be a positive int, got 0"),
])
def test_manager_refuses_a_keyword_and_its_group_together(tmp_path, kwargs, message):
    with pytest.raises(errors.OptionsError, match=message) as ei:
        uckpt.CheckpointManager(tmp_path / "root", **kwargs)
    assert ei.value.hint
    assert not (tmp_path / "root").exists()


def test_manager_shorthands_build_the_groups(tmp_path):
    with uckpt.CheckpointManager(tmp_path, keep_last=2, durable_every=1, async_save=True,
                                 max_inflight=3, incremental=True, full_every=4,
                                 compression="zstd", compression_level=2) as m:
        o = m.options
    assert o.retention == uckpt.RetentionOptions(keep=2, durable_every=1)
    assert o.async_save == uckpt.AsyncOptions(max_inflight=3)
    assert o.incremental == uckpt.IncrementalOptions(full_every=4)
    assert o.save == uckpt.SaveOptions(compression="zstd", compression_level=2)


# --- convert -------------------------------------------------------------------------------
def test_convert_to_uckpt_takes_save_options(tmp_path):
    src = tmp_path / "w.npz"
    np.savez(src, w=STATE["w"], b=STATE["b"])
    report = uckpt.convert(src, tmp_path / "out", save_options=uckpt.SaveOptions(
        chunk_bytes=2048, alignment=32768), compress="zstd")
    assert report.dst_format == "uckpt"
    man = uckpt.manifest(tmp_path / "out")
    assert len(man.arrays["w"].chunks) == 8
    assert {c.codec for c in man.arrays["w"].chunks} == {("bytegroup", "zstd")}
    assert first_offsets(tmp_path / "out")["b"] % 32768 == 0
    assert np.array_equal(uckpt.load(tmp_path / "out")["w"], STATE["w"])


def test_convert_refuses_save_options_it_cannot_honour(tmp_path):
    from uckpt.conversion.options import OptionError

    src = tmp_path / "w.npz"
    np.savez(src, w=STATE["w"])
    with pytest.raises(OptionError, match="save_options lay out a uckpt checkpoint, not a "
                                          "safetensors target"):
        uckpt.convert(src, tmp_path / "w.safetensors", save_options=uckpt.SaveOptions())
    with pytest.raises(OptionError, match="compress given both as a keyword and in "
                                          "save_options"):
        uckpt.convert(src, tmp_path / "out", compress="zstd",
                      save_options=uckpt.SaveOptions(compression="zstd"))
    assert not (tmp_path / "out").exists()

