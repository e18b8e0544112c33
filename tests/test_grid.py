"""Pre-release version 5's compact listing of evenly cut arrays (docs/format-legacy.md),
read by the legacy parser (uckpt writes format 1.0: tests/test_format10.py).

* uckpt reads each grid of golden_v5 as the chunks the spec's own decoder
  (make_golden.chunk_list) finds (test_format.py checks that golden_v5 holds the
  checkpoints of golden_v4);
* a malformed grid is refused with a ManifestError naming the leaf and what is wrong, and
  a grid declaring a huge count is refused before anything is decoded or allocated.
"""
import base64
import copy
import json
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest

import uckpt
from uckpt import errors
from uckpt.format import Chunk, Manifest
from uckpt.format import parse_manifest
from uckpt.format.legacy import PIPELINE_OF
from grid_listing import doc_of, golden, listed, sealed

DATA = Path(__file__).resolve().parent / "data"
V5 = DATA / "golden_v5"
NAMES = ["all_types", "example", "sharded", "codecs", "chain/step_00000001",
         "chain/step_00000002"]


# --- golden files ---------------------------------------------------------------------------
def test_golden_v5_has_grids_with_references_and_without():
    assert "grid" in doc_of(V5 / "all_types")["arrays"]["big"]
    grid = doc_of(V5 / "chain" / "step_00000002")["arrays"]["w"]["grid"]
    assert grid["sources"] == [["step_00000001", "data-00000.bin"], [None, "data-00000.bin"]]
    assert all("chunks" in a for a in doc_of(V5 / "sharded")["arrays"].values())


@pytest.mark.parametrize("name", NAMES)
def test_uckpt_reads_golden_grids_as_the_spec_decoder_does(name):
    doc = doc_of(V5 / name)
    m = uckpt.manifest(V5 / name)
    for path, entry in listed(doc)["arrays"].items():
        want = [Chunk(c["file"], c["offset"], c["length"], tuple(c["start"]), tuple(c["shape"]),
                      PIPELINE_OF[c["codec"]], c["checksum"], c["hash"], c.get("base"))
                for c in entry["chunks"]]
        assert sorted(m.arrays[path].chunks, key=lambda c: c.start) == \
            sorted(want, key=lambda c: c.start), path


# --- malformed grids ------------------------------------------------------------------------
N, ROWS, COLS = 6, 1, 4  # a float32 array of 6 x 4, one row a slab


def planes(values, width):
    raw = np.array(values, dtype=f"<u{width}").view(np.uint8).reshape(len(values), width)
    return raw.T.tobytes()


def layout(offsets, lengths, sources, codecs, level=6) -> str:
    data = planes(offsets, 8) + planes(lengths, 8) + planes(sources, 4) + bytes(codecs)
    return base64.b64encode(zlib.compress(data, level)).decode()


def valid_doc(n=N):
    """A version-5 manifest of one array (n x 4 float32) listed as a grid."""
    size = 16 * n
    grid = {"axis": 0, "rows": ROWS, "count": n, "sources": [[None, "data-00000.bin"]],
            "layout": layout([16 * k for k in range(n)], [16] * n, [0] * n, [0] * n),
            "digests": base64.b64encode(bytes(20 * n)).decode()}
    chunks = golden.chunk_list({"shape": [n, COLS], "grid": grid})
    root = golden.merkle_roots({"w": {"dtype": "float32", "shape": [n, COLS],
                                      "chunks": chunks}})
    return {"format": "uckpt", "format_version": 5, "generator": "test",
            "created": "2026-01-01T00:00:00Z", "world_size": 1, "step": None, "metadata": {},
            "files": {"data-00000.bin": {"rank": 0, "size": size}},
            "tree": {"type": "dict", "items": {"w": {"type": "array", "path": "w"}}},
            "arrays": {"w": {"dtype": "float32", "shape": [n, COLS], "grid": grid,
                             "root": root[0]["w"]}},
            "bases": {}, "merkle_root": root[1]}


def refused(doc, *fragments):
    with pytest.raises(errors.ManifestError) as info:
        parse_manifest(sealed(doc), where="m.json")
    text = str(info.value)
    assert type(info.value) is errors.ManifestError, text
    assert "arrays['w']" in text, text  # names the leaf
    for fragment in fragments:
        assert fragment in text, text
    return text


def grid_of(doc):
    return doc["arrays"]["w"]["grid"]


def test_the_valid_grid_parses():
    m = parse_manifest(sealed(valid_doc()))
    chunks = m.arrays["w"].chunks
    assert [c.start for c in chunks] == [(k, 0) for k in range(N)]
    assert all(c.shape == (1, 4) and c.length == 16 for c in chunks)
    assert m.arrays["w"].merkle_root().hex() == m.arrays["w"].root[9:]


def _mutated(mutate):
    doc = valid_doc()
    mutate(grid_of(doc))
    return doc


CASES = {
    "digests truncated": (lambda g: g.update(digests=g["digests"][:-4]),
                          ".grid.digests", "characters of Base64"),
    "digests not base64": (lambda g: g.update(digests="*" + g["digests"][1:]),
                           ".grid.digests", "not Base64"),
    "digests padding inside": (lambda g: g.update(digests="AA==" + g["digests"][4:]),
                               ".grid.digests", ""),
    "layout truncated": (lambda g: g.update(layout=base64.b64encode(
        base64.b64decode(g["layout"])[:-6]).decode()), ".grid.layout", ""),
    "layout not zlib": (lambda g: g.update(layout=base64.b64encode(b"hello world").decode()),
                        ".grid.layout", "not a zlib stream"),
    "layout too long": (lambda g: g.update(layout=layout([0] * 7, [16] * 7, [0] * 7, [0] * 7)),
                        ".grid.layout", "more than"),
    "layout too short": (lambda g: g.update(layout=layout([0] * 5, [16] * 5, [0] * 5, [0] * 5)),
                         ".grid.layout", "only"),
    "bytes after the stream": (lambda g: g.update(layout=base64.b64encode(
        base64.b64decode(g["layout"]) + b"xx").decode()), ".grid.layout", "follow the end"),
    "count mismatch": (lambda g: g.update(count=N + 1), ".grid.count", "slabs"),
    "rows mismatch": (lambda g: g.update(rows=2), ".grid.count", "cut every 2"),
    "rows zero": (lambda g: g.update(rows=0), ".grid.rows", "at least 1"),
    "axis out of range": (lambda g: g.update(axis=2), ".grid.axis", "not below"),
    "offset past the file end": (lambda g: g.update(layout=layout(
        [16 * k for k in range(N - 1)] + [16 * N], [16] * N, [0] * N, [0] * N)),
        ".grid", "slab 5: bytes 96..112 lie outside 'data-00000.bin' (96 bytes)"),
    "offset beyond int64": (lambda g: g.update(layout=layout(
        [2 ** 64 - 1] + [0] * (N - 1), [16] * N, [0] * N, [0] * N)), ".grid.layout",
        "exceeds 2**63-1"),
    "raw length wrong": (lambda g: g.update(layout=layout(
        [0] * N, [8] * N, [0] * N, [0] * N)), ".grid.layout", "slab 0: a raw chunk of 8 bytes"),
    "compressed ratio": (lambda g: g.update(layout=layout(
        [0] * N, [0] * N, [0] * N, [1] * N)), ".grid.layout", "cannot hold"),
    "source index": (lambda g: g.update(layout=layout(
        [16 * k for k in range(N)], [16] * N, [0] * (N - 1) + [1], [0] * N)),
        ".grid.layout", "not an index of the 1 sources"),
    "codec number": (lambda g: g.update(layout=layout(
        [16 * k for k in range(N)], [16] * N, [0] * N, [0] * (N - 1) + [3])),
        ".grid.layout", "codec number 3"),
    "source file unknown": (lambda g: g.update(sources=[[None, "data-00001.bin"]]),
                            ".grid.sources[0][1]", "not listed in 'files'"),
    "source base unknown": (lambda g: g.update(sources=[["step_1", "data-00000.bin"]]),
                            ".grid.sources[0][0]", "not listed in 'bases'"),
    "source twice": (lambda g: g.update(sources=[[None, "data-00000.bin"]] * 2),
                     ".grid.sources[1]", "listed twice"),
    "source not a pair": (lambda g: g.update(sources=[["data-00000.bin"]]),
                          ".grid.sources[0]", "pair"),
    "no sources": (lambda g: g.update(sources=[]), ".grid.sources", "0 sources"),
    "unknown grid field": (lambda g: g.update(order="C"), ".grid", "unknown field(s) 'order'"),
    "missing grid field": (lambda g: g.pop("digests"), ".grid", "missing field(s) digests"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_grid_is_refused(case):
    mutate, where, fragment = CASES[case]
    refused(_mutated(mutate), "arrays['w']" + where, fragment)


def test_unused_source_is_refused():
    doc = valid_doc()
    doc["files"]["data-00001.bin"] = {"rank": 0, "size": 0}
    doc["files"]["data-00001.bin"]["rank"] = 0
    doc["world_size"] = 2
    doc["files"]["data-00001.bin"]["rank"] = 1
    grid_of(doc)["sources"].append([None, "data-00001.bin"])
    refused(doc, ".grid.sources[1]", "no slab is stored there")


def test_grid_with_chunks_or_in_version_4_is_refused():
    doc = valid_doc()
    doc["arrays"]["w"]["chunks"] = []
    refused(doc, "'chunks' or 'grid', not both")
    doc = valid_doc()
    doc["format_version"] = 4
    refused(doc, ".grid: a grid listing is a field of format version 5; this manifest is "
                 "version 4")


def test_grid_of_an_empty_or_0d_array_is_refused():
    doc = valid_doc()
    doc["arrays"]["w"]["shape"] = [N, 0]
    refused(doc, ".grid.count", "an empty array is listed with 'chunks'")
    doc["arrays"]["w"]["shape"] = []
    refused(doc, "0-d array")


def test_huge_declared_count_is_refused_before_allocating():
    """A grid claiming 2**40 slabs over a few bytes of text costs no memory."""
    doc = valid_doc()
    rows = 2 ** 40
    doc["arrays"]["w"]["shape"] = [rows, COLS]
    grid_of(doc).update(count=rows)
    data = sealed(doc)
    tracemalloc.start()
    try:
        with pytest.raises(errors.ManifestError, match=r"grid\.digests.*characters of Base64"):
            parse_manifest(data, where="m.json")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_layout_inflating_beyond_its_size_stops_there():
    """A zlib bomb in ``layout`` inflates no further than the grid's 21 bytes a slab."""
    doc = valid_doc()
    grid_of(doc)["layout"] = base64.b64encode(zlib.compress(bytes(64 << 20), 9)).decode()
    tracemalloc.start()
    try:
        refused(doc, ".grid.layout", "more than")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20


def test_schema_accepts_grids_and_rejects_malformed_ones():
    import importlib.resources

    import jsonschema

    schema = json.loads(importlib.resources.files("uckpt.format.legacy").joinpath("schema.json")
                        .read_text("utf-8"))
    validator = jsonschema.Draft202012Validator(schema)
    good = dict(valid_doc(), manifest_checksum="crc32c:00000000")
    validator.validate(good)
    for case in ("digests not base64", "no sources", "unknown grid field", "missing grid field",
                 "rows zero", "source not a pair"):
        bad = _mutated(CASES[case][0])
        assert not validator.is_valid(dict(bad, manifest_checksum="crc32c:00000000")), case
    both = copy.deepcopy(good)
    both["arrays"]["w"]["chunks"] = []
    assert not validator.is_valid(both)
    assert not validator.is_valid(dict(good, format_version=4))
