"""Reading in bounded memory (DESIGN invariant 9, issue 25 section 3): decompression bombs
under verify / inspect / ls, declared sizes beyond the memory a process may use, the
``max_bytes`` limit of load and restore, and an oversized manifest refused unread.

Peak memory is measured in a fresh process (``VmHWM`` after ``clear_refs``, so Zstandard's
own allocations count too), each operation on its own."""
import json
import os
import subprocess
import sys
import tracemalloc
import warnings
from pathlib import Path

import numpy as np
import pytest

import uckpt
from uckpt.conversion.diff import compare_arrays
from uckpt.errors import ManifestError, MemoryLimitError
from bombs import write_bomb
from conftest import REPO

GiB = 1 << 30
#: resident memory a streaming operation may add, whatever the sizes declared: read
#: blocks, Zstandard's windows and buffers, the interpreter's slack
STREAMING_BOUND = 64 << 20

_ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(  # the uckpt this test imported
    [str(Path(uckpt.__file__).resolve().parent.parent), str(REPO / "adapters"),
     str(REPO / "tests")]))

_PEAKS = r"""
import json, os, resource, subprocess, sys
import uckpt, uckpt.cli.main
from uckpt.loading.reader import CheckpointReader

def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024

def cli(*argv):
    from contextlib import redirect_stdout
    import io
    with redirect_stdout(io.StringIO()):
        return uckpt.cli.main.main(list(argv))

path, root, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
if limit:
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
def diff(other):
    from uckpt.conversion import diff
    return [[d.path, d.kind, d.differing, d.max_abs_diff] for d in diff(path, other).differences]

ops = {"verify": lambda: uckpt.verify(path), "manifest": lambda: uckpt.manifest(path),
       "cli_verify": lambda: cli("verify", path), "cli_verify_all": lambda: cli("verify", "--all", root),
       "inspect": lambda: cli("inspect", path), "ls": lambda: cli("ls", "--json", root),
       "load": lambda: uckpt.load(path),
       "diff": diff, "cli_diff": lambda other: cli("diff", path, other)}
out = {}
for arg in sys.argv[4:]:
    name, _, other = arg.partition("=")  # "diff=B": an operation on the path and B
    open("/proc/self/clear_refs", "w").write("5")
    before = status("VmRSS")
    try:
        result = ops[name](other) if other else ops[name]()
        out[name] = {"ok": result if isinstance(result, (int, list)) else 0}
    except BaseException as e:
        out[name] = {"error": type(e).__name__, "uckpt": isinstance(e, uckpt.errors.UckptError),
                     "memory": isinstance(e, MemoryError), "message": str(e)[:400]}
    out[name]["peak"] = status("VmHWM") - before
print(json.dumps(out))
"""


def peaks(path, *ops, limit: int = 0):
    """Each operation's outcome and peak resident memory beyond what the process held
    before it, in a fresh process (with ``RLIMIT_AS`` = ``limit`` when given); an
    operation ``"diff=B"`` compares the checkpoint at ``path`` with B."""
    r = subprocess.run([sys.executable, "-c", _PEAKS, str(path), str(path.parent), str(limit),
                        *ops], capture_output=True, text=True, env=_ENV, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_decompression_bomb_is_verified_inspected_and_listed_in_bounded_memory(tmp_path):
    """A 32 KiB checkpoint whose one chunk decodes to 1 GiB (32,768x) is valid: verify
    (API and CLI, and --all), inspect and ls go through it in a constant, never holding
    the decoded chunk (today's verify held all 1 GiB of it)."""
    ckpt = write_bomb(tmp_path / "step_00000001", GiB, step=1)
    assert os.path.getsize(ckpt / "data-00000.bin") <= 33 << 10
    got = peaks(ckpt, "verify", "cli_verify", "cli_verify_all", "inspect", "ls", "manifest")
    for op, r in got.items():
        assert "error" not in r, (op, r)
        assert r["peak"] < STREAMING_BOUND, (op, r["peak"] >> 20)
    assert got["cli_verify"]["ok"] == got["cli_verify_all"]["ok"] == 0
    # a frame that declares 256 MiB but holds half of it (padded to a valid length):
    # verify streams until it ends early and reports the chunk as damaged
    hostile = write_bomb(tmp_path / "step_00000002", 256 << 20, hostile=True, step=2)
    r = peaks(hostile, "verify")["verify"]
    assert r["error"] == "CorruptCheckpointError", r
    assert "compressed chunk of leaf 'w' at byte offset 0 (zstd) is damaged" in r["message"]
    assert r["peak"] < STREAMING_BOUND, r["peak"] >> 20


def test_a_byte_grouped_bomb_is_verified_in_bounded_memory(tmp_path):
    """The same for a zstd+bytegroup chunk of float64 (256 MiB), whose content hash is of
    the elements, not of the planes: one streaming decoder per plane."""
    ckpt = write_bomb(tmp_path / "step_00000001", 256 << 20, dtype="float64",
                      codec="zstd+bytegroup", step=1)
    r = peaks(ckpt, "verify")["verify"]
    assert "error" not in r, r
    assert r["peak"] < STREAMING_BOUND, r["peak"] >> 20


def test_4_gib_declared_under_rlimit_as(tmp_path):
    """A 128 KiB checkpoint declaring 4 GiB, read by a process limited to 2 GiB of
    address space: load is refused up front with a MemoryLimitError (today: NumPy's
    _ArrayMemoryError); ``uckpt verify`` streams it and finds it intact."""
    ckpt = write_bomb(tmp_path / "step_00000001", 4 * GiB, step=1)
    assert os.path.getsize(ckpt / "data-00000.bin") <= 129 << 10
    got = peaks(ckpt, "load", "cli_verify", limit=2 * GiB)
    load = got["load"]
    assert load["error"] == "MemoryLimitError" and load["uckpt"] and load["memory"], load
    assert f"declares {4 * GiB} bytes of new arrays ('w'), more than the memory available " \
           "to this process" in load["message"]
    assert "max_bytes=" in load["message"]
    assert got["cli_verify"] == {"ok": 0, "peak": got["cli_verify"]["peak"]}, got


def test_cli_reports_memory_refusal_without_traceback(tmp_path):
    """``uckpt verify`` of a hostile 4 GiB declaration under ``ulimit -v`` 2 GiB: exit 1,
    one error line naming the chunk, no traceback (today: a NumPy traceback)."""
    ckpt = write_bomb(tmp_path / "step_00000001", 4 * GiB, hostile=True, step=1)
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30)); "
            "from uckpt.cli.main import main; sys.exit(main(sys.argv[1:]))")
    r = subprocess.run([sys.executable, "-c", code, "verify", str(ckpt)], capture_output=True,
                       text=True, env=_ENV, timeout=300)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    assert "uckpt: error:" in r.stderr and "leaf 'w'" in r.stderr and "damaged" in r.stderr


def test_load_refuses_more_than_max_bytes_and_names_the_remedy(tmp_path):
    ckpt = write_bomb(tmp_path / "c", 64 << 20)
    with pytest.raises(MemoryLimitError) as info:
        uckpt.load(ckpt, max_bytes=1 << 20)
    e = info.value
    assert isinstance(e, MemoryError)
    assert e.need == 64 << 20 and e.limit == 1 << 20
    assert f"declares {64 << 20} bytes of new arrays ('w'), more than max_bytes " \
           f"({1 << 20} bytes); refused before allocating" in str(e)
    assert "max_bytes=" in e.hint
    # the remedies the hint names work: a larger limit, or an in-place load
    assert not uckpt.load(ckpt, max_bytes=64 << 20)["w"].any()
    target = np.ones(64 << 20, np.uint8)
    uckpt.load(ckpt, {"w": target}, max_bytes=1 << 20)  # allocates nothing new
    assert not target.any()


def test_restore_falls_back_past_a_hostile_declaration(tmp_path):
    """The newest step declares 1 GiB its frame does not hold: refused for memory, then
    verified (streaming), found damaged, skipped; the step before is restored."""
    root = tmp_path / "root"
    with uckpt.CheckpointManager(root) as m:
        m.save(1, {"w": np.arange(64, dtype=np.uint8)})
    write_bomb(root / "step_00000002", GiB, hostile=True, step=2)
    state = {"w": None}
    with uckpt.CheckpointManager(root) as m, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert m.restore(state, max_bytes=1 << 20) == 1
    assert np.array_equal(state["w"], np.arange(64, dtype=np.uint8))
    said = [str(w.message) for w in caught]
    assert any("skipping checkpoint step 2" in s and "damaged" in s for s in said), said


def test_restore_raises_for_an_intact_checkpoint_too_large_for_the_process(tmp_path):
    """The rule: an intact checkpoint that is only too large is not damage. restore
    raises the MemoryLimitError rather than silently restoring an older step."""
    root = tmp_path / "root"
    with uckpt.CheckpointManager(root) as m:
        m.save(1, {"w": np.arange(64, dtype=np.uint8)})
    write_bomb(root / "step_00000002", GiB, step=2)
    state = {"w": None}
    with uckpt.CheckpointManager(root) as m, pytest.raises(MemoryLimitError) as info:
        m.restore(state, max_bytes=1 << 20)
    assert "step_00000002" in str(info.value) and "max_bytes" in str(info.value)
    assert state["w"] is None


def test_an_oversized_manifest_is_refused_by_its_size_unread(tmp_path):
    """A 2 GiB (sparse) manifest.json is refused from the size fstat reports, before a
    byte of it is read (today: 1 GiB + 1 bytes read first)."""
    ckpt = tmp_path / "c"
    uckpt.save(ckpt, {"w": np.zeros(4)})
    with open(ckpt / "manifest.json", "r+b") as f:
        f.truncate(2 * GiB)
    tracemalloc.start()
    try:
        with pytest.raises(ManifestError) as info:
            uckpt.manifest(ckpt)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert f"holds {2 * GiB} bytes, more than {1 << 30} bytes, the most uckpt reads for a " \
        "manifest" in str(info.value)
    assert peak < 1 << 20, peak


_RESTORE = r"""
import resource, sys, warnings
import uckpt
root, headroom = sys.argv[1], int(sys.argv[2])
vm = [int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize:")][0]
resource.setrlimit(resource.RLIMIT_AS, (vm + headroom, vm + headroom))
state = {"n": None}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        step = uckpt.CheckpointManager(root).restore(state)
    except BaseException as e:
        print("raised", type(e).__name__, e)
        raise SystemExit(0)
print("restored", step, state["n"].tolist() if hasattr(state["n"], "tolist") else state["n"])
for w in caught:  # whole: the message names the root twice, as long as tmp_path is
    print("warning", w.category.__name__, w.message)
"""


def test_restore_falls_back_past_a_manifest_too_large_to_parse(tmp_path):
    """Step 2's manifest (a version-6 table of 20,000 arrays, 1.8 MB) cannot be parsed in
    the memory the process has left: it is refused before parsing (MemoryLimitError,
    today a bare MemoryError out of json), and restore falls back to step 1."""
    root = tmp_path / "root"
    with uckpt.CheckpointManager(root) as m:
        m.save(1, {"n": np.arange(3)})
        m.save(2, {"n": {f"a{i}": np.full(2, i, np.int16) for i in range(20_000)}})
    size = os.path.getsize(root / "step_00000002" / "manifest.json")
    assert size > 1_700_000
    r = subprocess.run([sys.executable, "-c", _RESTORE, str(root), str(24 << 20)],
                       capture_output=True, text=True, env=_ENV, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("restored 1 [0, 1, 2]"), r.stdout
    assert "warning RuntimeWarning uckpt: skipping checkpoint step 2" in r.stdout
    assert f"parsing this manifest of {size} bytes may take up to" in r.stdout, r.stdout


def test_the_frame_walk_finds_the_frame_end_however_the_bytes_arrive():
    """Streaming verify follows a frame's block headers as its bytes pass
    (codec_stream.FrameWalk); a header split across reads is followed exactly as the
    in-memory walk of the loader does."""
    import random

    import zstandard
    from uckpt.codecs import pipeline as codecs
    from uckpt.codecs.stream import FrameWalk

    rng = np.random.default_rng(1)
    data = np.concatenate([rng.integers(0, 4, 300_000, dtype=np.uint8),
                           np.zeros(400_000, np.uint8)]).tobytes()
    frame = zstandard.ZstdCompressor(level=1, write_content_size=True).compress(data)
    params, header = zstandard.get_frame_parameters(frame), zstandard.frame_header_size(frame)
    want = codecs._frame_end(frame, header, params.has_checksum, 1000)
    assert want == len(frame)
    pick = random.Random(5)
    for trial in range(100):
        walk = FrameWalk(header, params.has_checksum, 1000, ValueError)
        at = 0
        while at < len(frame):
            n = pick.randint(1, 5) if trial % 2 else pick.randint(1, 70_000)
            walk.feed(memoryview(frame)[at:at + n])
            at += n
        assert walk.end == want and walk.blocks > 3
    with pytest.raises(ValueError, match="more than 2 blocks"):
        FrameWalk(header, params.has_checksum, 2, ValueError).feed(frame)


# -- uckpt diff: two streams of blocks ----------------------------------------------------------
def test_diff_of_decompression_bombs_streams_in_bounded_memory(tmp_path):
    """``uckpt diff`` of two 32 KiB checkpoints that each decode to 1 GiB compares them in
    a constant, both chunks decoded as streams (today: refused by max_ratio when opened,
    and with the ratio raised, both arrays allocated whole: 2 GiB); a frame declaring more
    than it holds is reported damaged, as verify does, within the same bound."""
    a = write_bomb(tmp_path / "a", GiB, step=1)
    b = write_bomb(tmp_path / "b", GiB, step=1)
    got = peaks(a, f"diff={b}", f"cli_diff={b}")
    for op, r in got.items():
        assert "error" not in r, (op, r)
        assert r["peak"] < STREAMING_BOUND, (op, r["peak"] >> 20)
    assert got["diff"]["ok"] == [] and got["cli_diff"]["ok"] == 0
    hostile = write_bomb(tmp_path / "h", GiB, hostile=True, step=1)
    r = peaks(a, f"diff={hostile}")["diff"]
    assert r["error"] == "CorruptCheckpointError", r
    assert f"{tmp_path / 'h' / 'data-00000.bin'}: compressed chunk of leaf 'w' at byte " \
           "offset 0 (zstd) is damaged" in r["message"], r
    assert r["peak"] < STREAMING_BOUND, r["peak"] >> 20


@pytest.fixture(scope="module")
def large_pair(tmp_path_factory):
    """Two 256 MiB float32 arrays differing in 4 elements (in different slabs), saved raw
    (A) and compressed (B: zstd+bytegroup slabs), and A's values saved again (C)."""
    where = tmp_path_factory.mktemp("large")
    n = 64 << 20
    a = np.arange(n, dtype=np.float32) % 4096
    b = a.copy()
    b[0] = -0.0  # bits differ, values do not
    b[3] += 0.25
    b[40_000_001] += 1e6
    b[-1] = -b[-1]
    uckpt.save(where / "a", {"w": a})
    uckpt.save(where / "b", {"w": b}, compression="zstd")
    uckpt.save(where / "c", {"w": a})
    want = compare_arrays("w", a, b)
    return where, want


def test_diff_of_two_large_arrays_holds_a_constant(large_pair):
    """The report of a 256 MiB raw array against its compressed twin with 4 elements
    changed is the in-memory comparison's, exactly, in a constant (today: both arrays
    read whole, 512 MiB)."""
    where, want = large_pair
    chunks = uckpt.manifest(where / "b").arrays["w"].chunks
    assert len(chunks) > 2 and {c.codec for c in chunks} == {("bytegroup", "zstd")}
    assert len(uckpt.manifest(where / "a").arrays["w"].chunks) > 2
    r = peaks(where / "a", f"diff={where / 'b'}")["diff"]
    assert "error" not in r, r
    assert r["peak"] < STREAMING_BOUND, r["peak"] >> 20
    assert want.differing == 4 and want.max_abs_diff >= 1e6 - 1
    assert r["ok"] == [["w", "values", want.differing, want.max_abs_diff]], (r, want)


def test_diff_names_a_flipped_bit_in_a_raw_chunk(large_pair):
    """A bit flipped in the second raw slab of a 256 MiB array: diff raises the reader's
    ChecksumMismatchError naming the file, leaf and offset, having held a constant."""
    where, _ = large_pair
    chunk = sorted(uckpt.manifest(where / "c").arrays["w"].chunks, key=lambda c: c.start)[1]
    data = where / "c" / chunk.file
    with open(data, "r+b") as f:
        f.seek(chunk.offset + 12345)
        byte = f.read(1)[0]
        f.seek(chunk.offset + 12345)
        f.write(bytes([byte ^ 0x10]))
    r = peaks(where / "a", f"diff={where / 'c'}")["diff"]
    assert r["error"] == "ChecksumMismatchError", r
    assert f"{data}: checksum mismatch in leaf 'w', chunk at byte offset {chunk.offset} " \
           f"(length {chunk.length})" in r["message"], r
    assert r["peak"] < STREAMING_BOUND, r["peak"] >> 20
