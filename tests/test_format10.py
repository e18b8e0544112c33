"""Format 1.0 as uckpt writes and reads it: the root, its chunk table, codec pipelines, parts.

* the golden checkpoints of tests/data/golden_1.0 load to the states they were made from,
  verify, and hold the same checkpoints (data files, chunks, Merkle roots) as golden_v6;
* uckpt writes a root alone for one rank and a root with one part per rank otherwise, and
  reads parts through the checkpoint's storage, refusing a damaged, torn or missing one;
* every rule of a chunk table, of the root's members and of the part entries is refused
  with a ManifestError naming the member and the row (or part);
* an incremental save may take a pre-release (version 6) checkpoint as its base.
"""
import base64
import dataclasses
import json
import shutil
import subprocess
import sys
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest

import uckpt
from uckpt import errors
from uckpt.format import ArrayEntry, Chunk, FileEntry, Manifest, chunk_table
from uckpt.format import encode_manifest, parse_manifest
from grid_listing import doc_of, golden, sealed

DATA = Path(__file__).resolve().parent / "data"
G10 = DATA / "golden_1.0"
V6 = DATA / "golden_v6"
NAMES = ["all_types", "example", "sharded", "codecs", "chain/step_00000001",
         "chain/step_00000002"]
EXPECTED = {"all_types": lambda: golden.expected_loaded(golden.golden_state()),
            "example": lambda: golden.expected_loaded(golden.example_state()),
            "sharded": lambda: sharded_expected(), "codecs": golden.codecs_expected}


def same(got, want):
    """Equal values of equal types; arrays bitwise."""
    assert type(got) is type(want), (type(got), type(want))
    if isinstance(want, dict):
        assert list(got) == list(want)
        for k in want:
            same(got[k], want[k])
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for a, b in zip(got, want):
            same(a, b)
    elif isinstance(want, (np.ndarray, np.generic)):
        assert (got.dtype, got.shape, got.tobytes()) == (want.dtype, want.shape, want.tobytes())
    elif isinstance(want, float):
        assert np.float64(got).tobytes() == np.float64(want).tobytes()
    else:
        assert got == want, (got, want)


def sharded_expected():
    want = golden.sharded_expected()
    return {"layer": {"weight": want["layer/weight"], "bias": want["layer/bias"]}}


# --- golden files -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_golden_loads_bitwise(name):
    same(uckpt.load(G10 / name), EXPECTED[name]())


@pytest.mark.parametrize("name", NAMES)
def test_golden_holds_the_checkpoints_of_golden_v6(name):
    """Same data files, same chunks (as pipelines), same Merkle roots: format 1.0 changed
    the manifest only."""
    new, old = uckpt.verify(G10 / name), uckpt.verify(V6 / name)
    assert new.format_version == "1.0" and old.format_version == 6
    for f in old.files:
        assert (G10 / name / f).read_bytes() == (V6 / name / f).read_bytes()
    assert new.merkle_root == old.merkle_root
    assert list(new.arrays) == list(old.arrays) or name in ("all_types",)
    for path, a in old.arrays.items():
        b = new.arrays[path]
        assert (b.dtype, b.shape) == (a.dtype, a.shape)
        assert sorted(b.chunks, key=lambda c: c.start) == sorted(a.chunks, key=lambda c: c.start)
        assert b.recorded_root() == a.recorded_root()


def test_golden_sharded_has_a_part_per_rank_and_codecs_every_pipeline():
    doc = doc_of(G10 / "sharded")
    assert doc["chunks"]["count"] == 0 and doc["world_size"] == 2
    assert [p["file"] for p in doc["parts"]] == ["manifest.part-00000.json",
                                                 "manifest.part-00001.json"]
    m = uckpt.manifest(G10 / "sharded")
    assert m.parts_pending == [] and sum(len(a.chunks) for a in m.arrays.values()) == 5
    codecs = doc_of(G10 / "codecs")["codecs"]
    assert sorted(codecs) == [[], ["bytegroup", "zstd"], ["zstd"]]


@pytest.mark.parametrize("command", ["verify", "inspect"])
@pytest.mark.parametrize("name", NAMES)
def test_cli_verifies_and_inspects_golden(command, name):
    out = subprocess.run([sys.executable, "-m", "uckpt", command, str(G10 / name)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert ("OK:" in out.stdout) if command == "verify" else ("uckpt v1.0" in out.stdout)


def test_resave_of_a_state_keeps_its_merkle_root(tmp_path):
    """The same state saved now (1.0) and as version 6 (golden_v6) has the same root."""
    options, _ = golden.options_and_knobs(golden.EXAMPLE_KNOBS)
    path = uckpt.save(tmp_path / "e", golden.example_state(), step=7, options=options)
    assert doc_of(path)["merkle_root"] == doc_of(V6 / "example")["merkle_root"]


# --- what uckpt writes ------------------------------------------------------------------------
def test_one_rank_writes_a_root_alone(tmp_path):
    rng = np.random.default_rng(0)
    state = {f"t{i}": rng.standard_normal((i % 3 + 1, 4)).astype(np.float32) for i in range(20)}
    state["empty"] = np.zeros((0, 3))
    path = uckpt.save(tmp_path / "c", state, step=3)
    doc = doc_of(path)
    assert list(doc)[:3] == ["format", "format_version", "extensions"]
    assert doc["arrays"]["paths"] == list(state) and doc["parts"] == []
    assert doc["codecs"] == [[]] and doc["chunks"]["count"] == 20  # the empty array: no row
    assert sorted(p.name for p in path.iterdir()) == ["data-00000.bin", "manifest.json"]
    m = uckpt.verify(path)
    assert parse_manifest(encode_manifest(m)).arrays == m.arrays  # written again: the same
    same(uckpt.load(path), state)


def test_compression_alias_writes_the_bytegroup_pipeline(tmp_path):
    state = {"w": np.linspace(0, 1, 4096, dtype=np.float32), "b": np.zeros(4096, np.uint8)}
    for alias, want in (("zstd+bytegroup", [["bytegroup", "zstd"]]),
                        ("zstd", [["bytegroup", "zstd"], ["zstd"]])):
        path = uckpt.save(tmp_path / alias, state, compression=alias)
        assert doc_of(path)["codecs"] == want
        same(uckpt.load(path), state)


def shard_of(state, rank, n):
    """Rank ``rank``'s share of ``state`` cut along the first axis among ``n`` ranks (the
    rows of sharded arrays are in their writer's part)."""
    return {k: uckpt.Shard(a[rank * len(a) // n:(rank + 1) * len(a) // n], a.shape,
                           (rank * len(a) // n,) + (0,) * (a.ndim - 1)) for k, a in state.items()}


def save_ranks(path, state, n=2, **kw):
    """``state``'s arrays saved by ``n`` thread ranks, sharded (:func:`shard_of`)."""
    from uckpt.testing import run_ranks

    for outcome in run_ranks(n, lambda comm: uckpt.save(path, shard_of(state, comm.rank, n),
                                                        comm=comm, **kw)):
        assert not isinstance(outcome, BaseException), outcome
    return path


def sharded_state():
    rng = np.random.default_rng(1)
    return {f"layer{i}": rng.standard_normal((64, 8)).astype(np.float32) for i in range(6)}


def test_ranks_write_one_part_each_and_it_reads_back(tmp_path):
    """Sharded arrays: a part per rank, written by it (replicated arrays: the root's rows,
    test_a_replicated_save_is_a_root_alone in test_split_manifest.py)."""
    state = sharded_state()
    path = save_ranks(tmp_path / "c", state, n=3)
    doc = doc_of(path)
    assert doc["chunks"]["count"] == 0 and len(doc["parts"]) == 3
    for k, entry in enumerate(doc["parts"]):
        data = (path / entry["file"]).read_bytes()
        assert entry["file"] == f"manifest.part-{k:05d}.json" and entry["size"] == len(data)
        part = json.loads(data)
        assert list(part) == ["format", "format_version", "chunks"]
        assert part["chunks"]["sources"] == [[None, f"data-{k:05d}.bin"]]
    # the committer finished merkle_root from the parts' roots (section 13.2); verify
    # recomputes it from the bytes
    assert doc["extensions"]["part-roots"] == {"required": True}
    assert uckpt.verify(path).merkle_root == doc["merkle_root"]
    same(uckpt.load(path), state)


def _symlinked(part):
    """``part`` moved out of the checkpoint, a symbolic link to it left in its place."""
    outside = part.parent.parent / "outside.json"
    part.rename(outside)
    part.symlink_to(outside)


def _directory(part):
    part.unlink()
    part.mkdir()


@pytest.mark.parametrize("damage, error, words", [
    (lambda p: p.write_bytes(p.read_bytes()[:-1]), errors.CorruptCheckpointError,
     "manifest part of"),
    (_symlinked, errors.CorruptCheckpointError,
     "manifest part '.*' is a symbolic link .*, not a regular file"),
    (_directory, errors.CorruptCheckpointError, "manifest part '.*' is a directory, not a "
                                                "regular file"),
    (lambda p: p.write_bytes(p.read_bytes().replace(b'"count"', b'"cOunt"')),
     errors.CorruptCheckpointError, "a part of another save, or a damaged or torn one"),
    (lambda p: p.unlink(), errors.CorruptCheckpointError, "manifest part listed in the root "
                                                          "manifest is missing"),
])
def test_a_damaged_or_missing_part_is_refused_and_the_manager_falls_back(tmp_path, damage,
                                                                         error, words):
    state = sharded_state()
    root = tmp_path / "root"
    save_ranks(root / "step_00000001", state, step=1)
    save_ranks(root / "step_00000002", {k: v + 1 for k, v in state.items()}, step=2)
    damage(root / "step_00000002" / "manifest.part-00001.json")
    with pytest.raises(error, match=words) as info:
        uckpt.load(root / "step_00000002")
    assert "manifest.part-00001.json" in str(info.value)
    dest = {k: np.zeros_like(v) for k, v in state.items()}
    with pytest.warns(RuntimeWarning, match="skipping checkpoint step 2"):
        assert uckpt.CheckpointManager(root).restore(dest) == 1
    same(dest, state)


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_a_tier_copy_carries_the_parts(tmp_path, compression):
    """Two ranks save to a fast tier; the copy to the durable tier (its chunks re-encoded
    with ``compression``) has its own parts, and both tiers verify and load."""
    from uckpt.testing import run_ranks

    state = sharded_state()

    def body(comm):
        tiers = [uckpt.Tier(tmp_path / "fast"), uckpt.Tier(tmp_path / "durable",
                                                          compression=compression)]
        with uckpt.CheckpointManager(tiers=tiers, comm=comm) as m:
            m.save(1, shard_of(state, comm.rank, 2))
            m.wait()

    assert run_ranks(2, body) == [None, None]
    for tier in ("fast", "durable"):
        path = tmp_path / tier / "step_00000001"
        assert sorted(p.name for p in path.iterdir()) == [
            "data-00000.bin", "data-00001.bin", "manifest.json", "manifest.part-00000.json",
            "manifest.part-00001.json"]
        m = uckpt.verify(path)
        assert {c.codec for a in m.arrays.values() for c in a.chunks} == \
            ({("bytegroup", "zstd")} if compression and tier == "durable" else {()})
        same(uckpt.load(path), state)


def test_incremental_save_on_a_version_6_base(tmp_path):
    """Bases refer to files: a 1.0 save may refer to a pre-release checkpoint's data."""
    options, _ = golden.options_and_knobs(golden.CHAIN_KNOBS)
    shutil.copytree(V6 / "chain" / "step_00000001", tmp_path / "step_00000001")
    first, second = golden.chain_states()
    second["w"][0, 0] = 7.0
    path = uckpt.save(tmp_path / "step_00000002", second, base=tmp_path / "step_00000001",
                      options=options)
    doc = doc_of(path)
    assert doc["format_version"] == "1.0" and list(doc["bases"]) == ["step_00000001"]
    m = uckpt.verify(path)
    assert {c.base for c in m.arrays["w"].chunks} == {None, "step_00000001"}
    same(uckpt.load(path), second)


def test_many_rows_round_trip():
    """200,000 rows with two sources and every pipeline: written and read back the same."""
    n = 200_000
    rng = np.random.default_rng(1)
    crcs = rng.integers(0, 2 ** 32, n, dtype=np.uint64).tolist()
    hashes = rng.integers(0, 256, (n, 16), dtype=np.uint8)
    pipes = [(), ("zstd",), ("bytegroup", "zstd")]
    chunks = tuple(
        Chunk("data-00000.bin", 16 * k, 16 if k % 3 == 0 else 9, (k, 0), (1, 4), pipes[k % 3],
              "crc32c:%08x" % crcs[k], "xxh3-128:" + hashes[k].tobytes().hex(),
              None if k % 2 else "step_00000001")
        for k in range(n))
    m = Manifest(world_size=1, tree={"type": "dict", "items": {"w": {"type": "array",
                                                                       "path": "w"}}},
                 arrays={"w": ArrayEntry("w", "float32", (n, 4), chunks)},
                 files={"data-00000.bin": FileEntry("data-00000.bin", 0, 16 * n)},
                 bases={"step_00000001": {"data-00000.bin": 16 * n}},
                 created="2026-01-01T00:00:00Z")
    data = encode_manifest(m)
    assert len(data) < 35 * n
    back = parse_manifest(data)
    assert back.arrays["w"].chunks == chunks


# --- malformed roots, chunk tables and parts ---------------------------------------------------
def base_doc(tmp_path):
    """A valid root: arrays a (4 x 4 float32, two rows of 2 x 4) and b (3 int16, one row)."""
    state = {"a": np.arange(16, dtype=np.float32).reshape(4, 4), "b": np.arange(3, dtype=np.int16)}
    path = uckpt.save(tmp_path / "c", state, options=uckpt.SaveOptions(chunk_bytes=32))
    doc = doc_of(path)
    assert doc["chunks"]["count"] == 3
    return doc


def rows_of(doc):
    m = parse_manifest(sealed(doc))
    return [(i, c) for i, a in enumerate(m.arrays.values()) for c in a.chunks]


def with_rows(doc, rows, codecs=None):
    index = {tuple(p): k for k, p in enumerate(doc["codecs"])} if codecs is None else codecs
    doc["chunks"] = chunk_table.encode(rows, index)
    return doc


def refused(doc, *words, cls=errors.ManifestError):
    with pytest.raises(cls) as info:
        parse_manifest(sealed(doc), where="m.json")
    text = str(info.value)
    assert isinstance(info.value, cls) and text.startswith("m.json: "), text
    for w in words:
        assert w in text, text
    return text


def edit_row(k, **change):
    def edit(doc):
        rows = rows_of(doc)
        i, c = rows[k]
        i = change.pop("array", i)
        rows[k] = (i, dataclasses.replace(c, **change))
        with_rows(doc, rows)
    return edit


def edit_layout(fn):
    """Change the inflated layout bytes with ``fn(bytearray)``."""
    def edit(doc):
        raw = bytearray(zlib.decompress(base64.b64decode(doc["chunks"]["layout"])))
        raw = fn(raw)
        doc["chunks"]["layout"] = base64.b64encode(zlib.compress(bytes(raw))).decode()
    return edit


CASES = {
    "array index": (edit_row(0, array=2), "chunks.layout", "row 0", "array 2 is not an index"),
    "box outside": (edit_row(2, start=(1,)), "chunks.layout", "row 2 (array 'b')",
                    "do not lie inside"),
    "zero extent": (edit_row(0, shape=(0, 4), length=0), "row 0 (array 'a')", "at least 1"),
    "overlap": (edit_row(1, start=(1, 0)), "chunks: array 0 ('a')", "overlap"),
    "raw length": (edit_row(2, length=5), "row 2 (array 'b')", "a raw chunk of 5 bytes"),
    "compressed ratio": (lambda d: (d.update(codecs=[[], ["zstd"]]),
                                    edit_row(2, codec=("zstd",), length=0)(d)),
                         "row 2 (array 'b')", "a compressed chunk of 0 bytes cannot hold"),
    "outside file": (edit_row(2, offset=10 ** 6), "row 2", "lie outside 'data-00000.bin'"),
    "codec index": (edit_layout(lambda r: r[:24 * 3] + b"\x05" + r[24 * 3 + 1:]),
                    "row 0", "codec 5 is not an index of the 1 codecs"),
    "layout long": (edit_layout(lambda r: r + b"\0"), "chunks.layout", "more than"),
    "layout short": (edit_layout(lambda r: r[:-1]), "chunks.layout", "only"),
    "digests length": (lambda d: d["chunks"].update(digests=d["chunks"]["digests"][4:]),
                       "chunks.digests", "characters of Base64"),
    "source twice": (lambda d: d["chunks"]["sources"].append([None, "data-00000.bin"]),
                     "chunks.sources[1]", "listed twice"),
    "unlisted source": (lambda d: d["chunks"].update(sources=[[None, "data-00009.bin"]]),
                        "chunks.sources[0][1]", "not listed in 'files'"),
    "unknown member": (lambda d: d.update(extra=1), "<top>", "unknown field(s) 'extra'"),
    "undeclared extension member": (lambda d: d.update({"x-y:z": 1}), "unknown field(s)"),
    "codec name": (lambda d: d.update(codecs=[["lz4"]]), "codecs[0][0]", "unknown codec 'lz4'"),
    "codec order": (lambda d: d.update(codecs=[["zstd", "bytegroup"]]), "codecs[0]",
                    "is not one of format 1.0's"),
    "codecs twice": (lambda d: d.update(codecs=[[], []]), "codecs[1]", "listed twice"),
    "no codecs": (lambda d: d.update(codecs=[]), "codecs", "at least one"),
    "paths twice": (lambda d: d["arrays"].update(paths=["a", "a"]), "arrays.paths[1]",
                    "listed twice"),
    "dtypes short": (lambda d: d["arrays"]["dtypes"].pop(), "arrays.dtypes", "1 items for 2"),
    "array without rows": (lambda d: with_rows(d, rows_of(d)[:2]),
                           "chunks: array 1 ('b')", "chunks cover 0 elements, the array has 3"),
    "part is a data file": (lambda d: d.update(parts=[{"file": "data-00000.bin", "size": 1,
                                                      "checksum": "crc32c:00000000",
                                                      "arrays": [[0, 1]]}]),
                            "parts[0].file", "a part has a file of its own"),
    "runs touch": (lambda d: d.update(parts=[{"file": "p.json", "size": 1,
                                              "checksum": "crc32c:00000000",
                                              "arrays": [[0, 1], [1, 1]]}]),
                   "parts[0].arrays[1]", "neither overlap nor touch"),
    "run beyond": (lambda d: d.update(parts=[{"file": "p.json", "size": 1,
                                              "checksum": "crc32c:00000000",
                                              "arrays": [[1, 2]]}]),
                   "parts[0].arrays[0]", "reaches beyond the 2 arrays"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_root_is_refused(tmp_path, case):
    mutate, *words = CASES[case]
    doc = base_doc(tmp_path)
    mutate(doc)
    refused(doc, *words)


def test_valid_root_parses(tmp_path):
    doc = base_doc(tmp_path)
    m = parse_manifest(sealed(doc))
    assert [len(a.chunks) for a in m.arrays.values()] == [2, 1]
    doc["extensions"] = {"part-index": {"required": False}}
    doc["part-index:boxes"] = [1, 2]  # a member of a declared optional extension: ignored
    parse_manifest(sealed(doc))


def test_a_required_extension_is_refused_by_name(tmp_path):
    doc = base_doc(tmp_path)
    doc["extensions"] = {"sparse-rows": {"required": True}}
    text = refused(doc, "extensions['sparse-rows']", "requires extension 'sparse-rows'",
                   cls=errors.UnsupportedExtensionError)
    assert "hint: upgrade uckpt" in text
    doc["extensions"] = {"Bad_Name": {"required": False}}
    refused(doc, "extensions['Bad_Name']", "an extension name")


def test_huge_count_is_refused_before_allocating(tmp_path):
    doc = base_doc(tmp_path)
    doc["chunks"]["count"] = 2 ** 40
    tracemalloc.start()
    try:
        refused(doc, "chunks.digests", "characters of Base64")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20


def test_a_part_row_outside_its_runs_and_a_run_without_rows_are_refused(tmp_path):
    from uckpt.testing import run_ranks

    path = tmp_path / "c"  # "extra" replicated (rows in the root), layer0..5 sharded (parts)
    state = sharded_state()
    assert run_ranks(2, lambda comm: uckpt.save(
        path, {**shard_of(state, comm.rank, 2), "extra": np.ones(3)}, comm=comm)) == [path] * 2
    doc = doc_of(path)
    assert doc["arrays"]["paths"][0] == "extra" and doc["parts"][1]["arrays"] == [[1, 6]]
    data = (path / doc["parts"][0]["file"]).read_bytes()
    for runs, words in ((((0, 7),), "is in the part's runs in the root, but the part has no row"),
                        (((1, 3),), "is of an array outside the part's runs")):
        root = parse_manifest(sealed(doc))
        assert root.parts_pending == [0, 1]
        root.parts[0] = dataclasses.replace(root.parts[0], arrays=tuple(map(tuple, runs)))
        with pytest.raises(errors.ManifestError,
                           match=r"parts\[0\] \(manifest.part-00000.json\)") as info:
            root.attach_part(0, data)
        assert words in str(info.value)


# --- checkpoints written from the spec alone (tests/format10_writer.py) ------------------------
@pytest.mark.parametrize("kind", [k for k in __import__("format10_writer").KINDS
                                  if k != "ext_required"])
def test_uckpt_reads_what_an_independent_writer_wrote(tmp_path, kind):
    """Every checkpoint the spec's own writer builds (root only, parts, every pipeline and
    dtype, an incremental pair, an optional extension) is read and verified by uckpt."""
    import format10_writer as fw

    expected = fw.build(kind, tmp_path / "c")
    from uckpt.loading.reader import CheckpointReader

    with CheckpointReader(tmp_path / "c") as r:
        got = r.read_arrays({p: None for p in r.manifest.arrays})
        r.verify()
    assert list(got) == list(expected)
    for path, want in expected.items():  # (bfloat16 as float32, float8 as its bits there)
        have, want = np.asarray(got[path]), np.asarray(want)
        if have.dtype != want.dtype:
            have = have.view(want.dtype) if have.dtype.itemsize == want.dtype.itemsize \
                and want.dtype == np.uint8 else have.astype(want.dtype)
        assert (have.dtype, have.shape, have.tobytes()) == (want.dtype, want.shape,
                                                             want.tobytes()), path


def test_an_independent_writers_required_extension_is_refused_by_name(tmp_path):
    import format10_writer as fw

    fw.build("ext_required", tmp_path / "c")
    with pytest.raises(errors.UnsupportedExtensionError, match="requires extension 'x-test'"):
        uckpt.load(tmp_path / "c")


def test_ls_shows_a_checkpoint_with_a_missing_part_as_damaged(tmp_path):
    """A root manifest whose part is gone is damage to list, not a checkpoint that vanished."""
    from uckpt.cli.found import COMMITTED, DAMAGED
    from uckpt.cli.scan import scan

    root = tmp_path / "root"
    save_ranks(root / "step_00000001", sharded_state(), step=1)
    save_ranks(root / "step_00000002", sharded_state(), step=2)
    (root / "step_00000002" / "manifest.part-00000.json").unlink()
    found = {f.step: f for f in scan(root)}
    assert found[1].status == COMMITTED
    assert found[2].status == DAMAGED and "manifest part" in found[2].reason
