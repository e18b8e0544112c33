"""The memory budgets of docs/memory.md (issue 29 item 1), each measured in a fresh process
(:func:`uckpt.testing.peaks.peak`: the peak resident memory, ``VmHWM``, above what the
process held before the operation, so a state it saves or arrays it loads into are not
counted). Each asserts the budget the docs promise plus ``SLACK``.

The quick ones use a 192 MiB state, as 48 arrays of 4 MiB ("many") or two arrays of
96 MiB ("two"). ``test_6_gib_converted_and_consolidated_under_2_gib`` proves the streaming ones
on a checkpoint three times larger than the address space the process may use."""
import functools
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import uckpt
from conftest import REPO
from uckpt.conversion import convert
from uckpt.testing.peaks import peak

MIB = 1 << 20
STATE_MIB = 192
#: what every budget allows beyond its terms: the interpreter's and the allocators' slack,
#: read blocks, thread stacks as they are touched (docs/memory.md "the constant")
SLACK = 64 * MIB
#: arrays in the state; the largest is STATE_MIB / arrays. Two large arrays show an
#: operation that holds one array while it reads the next (two arrays, not the largest)
SHAPES = {"many": 48, "two": 2}

_ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(  # the uckpt this test imported
    [str(Path(uckpt.__file__).resolve().parent.parent), str(REPO / "adapters")]))
STATE = """
import numpy as np, uckpt
n, k = int(mib) << 18, int(arrays)
state = {f"a{i:03d}": np.full(n // k, i, np.float32) for i in range(k)}
"""


def _state(arrays: int) -> dict:
    n = STATE_MIB << 18
    return {f"a{i:03d}": np.full(n // arrays, i, np.float32) for i in range(arrays)}


@pytest.fixture(scope="module", params=list(SHAPES))
def saved(request, tmp_path_factory):
    """(shape name, arrays, the state saved raw, the largest array's bytes)."""
    arrays = SHAPES[request.param]
    where = tmp_path_factory.mktemp(request.param)
    yield request.param, arrays, uckpt.save(where / "src", _state(arrays)), \
        (STATE_MIB * MIB) // arrays
    shutil.rmtree(where)  # the session's other tests need the disk


def _measure(setup, op, arrays, **args):
    got = peak(setup, op, env=_ENV, mib=str(STATE_MIB), arrays=str(arrays), **args)
    assert got.error is None, got.error
    return got.peak


def test_sync_save_needs_a_constant(saved, tmp_path):
    """A synchronous save writes from the arrays' own memory: no copy of the state."""
    _, arrays, _, _ = saved
    used = _measure(STATE, "uckpt.save(out, state)", arrays, out=str(tmp_path / "c"))
    assert used < SLACK, used / MIB


def test_async_save_stages_the_state_once(saved, tmp_path):
    """An asynchronous save snapshots the state into one staging arena (max_inflight=1):
    the state once, never twice."""
    _, arrays, _, _ = saved
    used = _measure(STATE, "uckpt.save(out, state, blocking=False).wait()", arrays,
                    out=str(tmp_path / "c"))
    assert used < STATE_MIB * MIB + SLACK, used / MIB


def test_load_into_existing_arrays_needs_a_constant(saved):
    _, arrays, src, _ = saved
    used = _measure(STATE, "uckpt.load(src, state)", arrays, src=str(src))
    assert used < SLACK, used / MIB


def test_allocating_load_needs_the_result_and_a_constant(saved):
    _, arrays, src, _ = saved
    used = _measure("import uckpt", "got = uckpt.load(src)", arrays, src=str(src))
    assert used < STATE_MIB * MIB + SLACK, used / MIB


def test_verify_needs_a_constant(saved):
    _, arrays, src, _ = saved
    assert _measure("import uckpt", "uckpt.verify(src)", arrays, src=str(src)) < SLACK


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_consolidate_needs_the_largest_array_and_a_constant(saved, tmp_path, compression):
    """Pieces (an array, or a slab of a large one) encoded on ``knobs.compress_threads``
    threads ahead of the writing: up to 2 per thread (and, compressed, their encoded
    bytes too), or more while they total ``knobs.compress_ahead_bytes`` (32 MiB); never
    the state (48 arrays of 4 MiB: 192 MiB)."""
    _, arrays, src, largest = saved
    used = _measure("import uckpt", "uckpt.consolidate(src, out, compression=how or None)",
                    arrays, src=str(src), out=str(tmp_path / "c"), how=compression or "")
    assert used < consolidate_budget(largest, bool(compression)) + SLACK, used / MIB


def consolidate_budget(largest: int, compressed: bool) -> int:
    """docs/memory.md's budget of ``uckpt.consolidate`` (not the issue's target): up to 2
    pieces (an array, or a slab of at most 2 x chunk_bytes) per compress thread, their
    encoded bytes too where compressed, or 32 MiB of them."""
    from uckpt import knobs
    from uckpt.options import DEFAULT_CHUNK_BYTES

    piece = min(largest, 2 * DEFAULT_CHUNK_BYTES)
    return max(2 * knobs.compress_threads * piece * (2 if compressed else 1), 32 * MIB)


FORMATS = {"uckpt": "", "npz": ".npz", "pickle": ".pt", "hdf5": ".h5",
           "safetensors": ".safetensors"}


@pytest.fixture(scope="module")
def sources(saved, tmp_path_factory):
    """The saved state in every format ``uckpt convert`` writes as a file or directory."""
    name, arrays, src, largest = saved
    where = tmp_path_factory.mktemp(f"{name}-formats")
    files = {"uckpt": str(src)}
    for fmt, ext in FORMATS.items():
        if fmt != "uckpt":
            files[fmt] = str(where / f"src{ext}")
            convert(src, files[fmt])
    yield arrays, files, largest
    shutil.rmtree(where)


@pytest.mark.parametrize("src_format,dst_format", [
    (a, b) for a in FORMATS for b in FORMATS if a != b])
def test_convert_needs_the_largest_array_and_a_constant(sources, tmp_path, src_format,
                                                        dst_format):
    """Every pair of formats: a writer reads one array at a time; an NPZ source reads up
    to 256 MiB of arrays ahead (at least the next one) while one is written."""
    arrays, files, largest = sources
    ahead = max(largest, 256 * MIB) if src_format == "npz" and arrays > 1 else largest
    used = _measure("from uckpt.conversion import convert", "convert(src, out)", arrays,
                    src=files[src_format], out=str(tmp_path / f"out{FORMATS[dst_format]}"))
    assert used < largest + (ahead if src_format == "npz" else 0) + SLACK, used / MIB


# -- a checkpoint larger than the process may use ---------------------------------------------
BIG_ARRAYS, BIG_ELEMENTS = 24, 64 << 20  # 24 float32 arrays of 256 MiB: 6 GiB
LIMIT = 2 << 30  # RLIMIT_AS of the converting and consolidating processes
PIECE = 16 << 20  # elements written or compared at a time (64 MiB)
#: disk the test needs free: two copies of the state at a time, and room for the tests
#: that run beside it
BIG_DISK = 16 << 30


@functools.lru_cache(maxsize=1)
def _base() -> np.ndarray:
    return np.arange(PIECE, dtype=np.float32) % 65521


def _piece(i: int, start: int) -> np.ndarray:
    """Elements ``start:start + PIECE`` of big array ``i``: no two arrays, no two pieces alike."""
    return _base() + np.float32(100_000 * i + start // PIECE)


def _write_big_safetensors(path: Path) -> None:
    """The 6 GiB state as a safetensors file, written a piece at a time."""
    size = BIG_ELEMENTS * 4
    header = {f"t{i:02d}": {"dtype": "F32", "shape": [BIG_ELEMENTS],
                            "data_offsets": [i * size, (i + 1) * size]} for i in range(BIG_ARRAYS)}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        for i in range(BIG_ARRAYS):
            for start in range(0, BIG_ELEMENTS, PIECE):
                f.write(_piece(i, start).tobytes())


def _check_big_safetensors(path: Path) -> None:
    """Every byte of every array of ``path`` is the state's (compared a piece at a time)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        header.pop("__metadata__", None)
        assert sorted(header) == [f"t{i:02d}" for i in range(BIG_ARRAYS)]
        for i in range(BIG_ARRAYS):
            entry = header[f"t{i:02d}"]
            assert entry["dtype"] == "F32" and entry["shape"] == [BIG_ELEMENTS], entry
            for start in range(0, BIG_ELEMENTS, PIECE):
                f.seek(8 + n + entry["data_offsets"][0] + start * 4)
                got = np.frombuffer(f.read(PIECE * 4), np.float32)
                assert np.array_equal(got, _piece(i, start)), (i, start)


def test_6_gib_converted_and_consolidated_under_2_gib(tmp_path):
    """A 6 GiB state (24 arrays of 256 MiB), each step in a process whose address space is
    limited to 2 GiB (``RLIMIT_AS``, which counts everything it maps, not only what it
    touches): safetensors -> uckpt (``uckpt convert``), consolidated, uckpt -> safetensors;
    the result is the state bit for bit, and each step's peak resident memory is within
    its budget of docs/memory.md (a convert: the largest array and a constant; consolidate:
    its pieces ahead of the writing, see consolidate_budget). Writes up to 12 GiB
    to tmp_path, removed as it goes and when it fails (skipped with less than BIG_DISK
    free; the module is in conftest.SLOW_MODULES)."""
    largest = BIG_ELEMENTS * 4
    free = shutil.disk_usage(tmp_path).free
    if free < BIG_DISK:  # a full disk would fail every test that runs beside this one
        pytest.skip(f"needs {BIG_DISK >> 30} GiB free in {tmp_path}, "
                    f"has {free / (1 << 30):.1f} GiB")
    gen, a, b, c = (tmp_path / n for n in ("gen.safetensors", "a", "b", "c.safetensors"))
    try:
        _write_big_safetensors(gen)
        steps = [("convert(gen, a)", gen), ("uckpt.consolidate(a, b)", a), ("convert(b, c)", b)]
        for op, done in steps:
            got = peak("import uckpt\nfrom uckpt.conversion import convert", op, limit=LIMIT,
                       env=_ENV, gen=str(gen), a=str(a), b=str(b), c=str(c))
            assert got.error is None, (op, got.error)
            budget = consolidate_budget(largest, False) if "consolidate" in op else \
                largest + 32 * MIB  # a convert: the largest array and a constant
            assert got.peak < budget + SLACK, (op, got.peak / MIB)
            assert got.vmpeak <= LIMIT, got.vmpeak
            shutil.rmtree(done) if done.is_dir() else done.unlink()
        _check_big_safetensors(c)
    finally:  # a failed run's 12 GiB would fill the disk for the tests after it
        for left in (gen, a, b, c):
            shutil.rmtree(left) if left.is_dir() else left.unlink(missing_ok=True)
