"""The memory parsing and listing a large valid manifest takes, per byte of the manifest
(issue 25, section 3; docs/architecture.md's table of bounds).

Each manifest is written by ``uckpt.save`` (real files, format 1.0: every chunk one row
of the root's chunk table); ``parse_manifest`` and ``uckpt ls --json`` (the CLI's main,
in-process) are then traced with ``tracemalloc`` and their peak compared with the
manifest's size. The bounds are those docs/benchmarks.md states for each kind of manifest.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import uckpt
from uckpt.cli.main import main as cli_main
from uckpt.format.manifest import Manifest
from uckpt.format import parse_manifest
from conftest import REPO

N = 10_000  # arrays (rows, slabs): the ratios hardly change from here to 100,000


def _peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _manifest_bytes(ckpt, rows: int) -> bytes:
    """The 1.0 manifest of ``ckpt``, checked to list its ``rows`` chunks in the root."""
    data = (ckpt / "manifest.json").read_bytes()
    doc = json.loads(data)
    assert doc["format_version"] == "1.0" and doc["parts"] == []
    assert doc["chunks"]["count"] == rows
    return data


def _ls_json(root) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli_main(["ls", "--json", str(root)]) == 0
    listing = json.loads(out.getvalue())
    assert "committed" in json.dumps(listing), listing


def test_a_table_manifest_is_parsed_within_8x_and_listed_within_9x_its_size(tmp_path):
    """10,000 2-D arrays of one chunk each: parsing peaks at most 8 times the manifest's
    size, listing (which also holds the file's bytes it read) 9 times (a Chunk object per
    row: 12.2 times; the rows kept as columns: 7.9)."""
    root = tmp_path / "root"
    uckpt.save(root / "step_00000001", {
        f"layer{i // 10}/w{i % 10}.weight": np.full((i % 5 + 1, 3), i, np.float32)
        for i in range(N)})
    data = _manifest_bytes(root / "step_00000001", N)
    parsed = []
    peak = _peak(lambda: parsed.append(parse_manifest(data)))
    assert len(parsed[0].arrays) == N
    assert {e.chunks[0].shape for e in parsed[0].arrays.values()} == \
        {(k, 3) for k in range(1, 6)}
    assert peak <= 8 * len(data), f"parse peaked at {peak / len(data):.2f}x"
    del parsed
    peak = _peak(lambda: _ls_json(root))
    assert peak <= 9 * len(data), f"ls peaked at {peak / len(data):.2f}x"


def test_a_table_of_one_element_arrays_is_parsed_within_12x_its_size(tmp_path):
    """The densest manifest (two-character paths, one int8 each: 86 bytes an array) peaks
    at most 12 times its size (a Chunk object per row: 16.3 times; the rows kept as
    columns: 11.3): each array's path, shape and entry are objects, not columns."""
    ckpt = tmp_path / "c"
    uckpt.save(ckpt, {f"a{i}": np.full(1, i % 100, np.int8) for i in range(N)})
    data = _manifest_bytes(ckpt, N)
    parsed = []
    peak = _peak(lambda: parsed.append(parse_manifest(data)))
    assert {e.dtype for e in parsed[0].arrays.values()} == {"int8"}
    assert len(parsed[0].arrays) == N
    assert peak <= 12 * len(data), f"parse peaked at {peak / len(data):.2f}x"


def test_an_array_of_many_slabs_is_parsed_within_8x_its_size(tmp_path):
    """An array cut into 10,000 slabs (27 bytes of manifest a slab) peaks at most 8 times
    its size (25.1 times with a Chunk object with its own strings for every row; 7.0 with
    the rows kept as columns, made into chunks when read)."""
    ckpt = tmp_path / "c"
    uckpt.save(ckpt, {"g": np.arange(N * 64, dtype=np.int64).astype(np.int8)},
               options=uckpt.SaveOptions(chunk_bytes=64))
    data = _manifest_bytes(ckpt, N)
    parsed = []
    peak = _peak(lambda: parsed.append(parse_manifest(data)))
    assert peak <= 8 * len(data), f"parse peaked at {peak / len(data):.2f}x"
    chunks = parsed[0].arrays["g"].chunks
    assert len(chunks) == N and chunks[-1].start == ((N - 1) * 64,)
    assert chunks[-1].shape == (64,) and chunks[5].offset < chunks[6].offset
    loaded = uckpt.load(ckpt)
    assert np.array_equal(loaded["g"], np.arange(N * 64, dtype=np.int64).astype(np.int8))


_PARSE_UNDER_LIMIT = r"""
import resource, sys
import uckpt
path, headroom = sys.argv[1], int(sys.argv[2])
vm = [int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize:")][0]
resource.setrlimit(resource.RLIMIT_AS, (vm + headroom, vm + headroom))
try:
    uckpt.manifest(path)
    print("parsed")
except MemoryError as e:
    print(type(e).__name__, str(e)[:300])
"""


def test_metadata_of_nested_lists_is_refused_before_parsing(tmp_path):
    """Metadata of nested empty lists takes about 49 times its bytes to parse: more than
    the flat 40 times the guard assumed, so under a limit between the two the parse ran
    out of memory (under a cgroup limit: the process killed). The estimate counts the
    manifest's containers and refuses it before parsing."""
    nested = []
    for _ in range(100):
        nested = [nested]
    ckpt = tmp_path / "c"
    uckpt.save(ckpt, {"w": np.zeros(2)}, metadata={"x": [nested] * 5_000})
    size = os.path.getsize(ckpt / "manifest.json")
    headroom = 44 * size  # above the old guard's 40x, below what the parse takes
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(  # the uckpt this test imported
        [str(Path(uckpt.__file__).resolve().parent.parent), str(REPO / "adapters")]))
    r = subprocess.run([sys.executable, "-c", _PARSE_UNDER_LIMIT, str(ckpt), str(headroom)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("MemoryLimitError"), r.stdout
    assert f"parsing this manifest of {size} bytes may take up to" in r.stdout, r.stdout
    assert "refused before parsing" in r.stdout


def test_a_chunk_table_too_large_to_decode_is_refused_before_decoding(tmp_path):
    """A 64-dimensional array cut into 14,000 one-element slabs: a 0.5 MB manifest whose
    deflated layout holds 128 box values a row, so decoding its rows takes far more than
    the manifest's bytes suggest (about 60 MB; ``memory.parse_bytes`` estimates 3 MB).
    Under a limit of 45 MB it is refused before its columns are inflated
    (``memory.table_bytes`` counts rows and box values), not run out of memory midway
    (under a cgroup limit: the process killed)."""
    ckpt = tmp_path / "c"
    uckpt.save(ckpt, {"w": np.zeros((14_000,) + (1,) * 63, np.int8)},
               options=uckpt.SaveOptions(chunk_bytes=1))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(  # the uckpt this test imported
        [str(Path(uckpt.__file__).resolve().parent.parent), str(REPO / "adapters")]))
    r = subprocess.run([sys.executable, "-c", _PARSE_UNDER_LIMIT, str(ckpt), str(45 << 20)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("MemoryLimitError"), r.stdout
    assert "chunks: decoding this chunk table of 14000 rows may take up to" in r.stdout
    assert "refused before decoding" in r.stdout, r.stdout
