"""Pre-release version 6's table of arrays stored whole (docs/format-legacy.md), read by
the legacy parser (uckpt writes format 1.0: tests/test_format10.py).

* uckpt reads the table of golden_v6 as the rows the spec's own decoder
  (make_golden.table_entries) finds (test_format.py checks that golden_v6 holds the
  checkpoints of golden_v5);
* a malformed table is refused with a ManifestError naming the field, the row and its path;
  the schema rejects what it can express.
"""
import base64
import copy
import importlib.resources
import json
import zlib
from pathlib import Path

import jsonschema
import numpy as np
import pytest

import uckpt
from uckpt import errors
from uckpt.format import Chunk, Manifest
from uckpt.format import parse_manifest
from uckpt.format.legacy import PIPELINE_OF
from grid_listing import doc_of, golden, listed, sealed

DATA = Path(__file__).resolve().parent / "data"
V6 = DATA / "golden_v6"


def state_of(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return {f"t{i:02d}": rng.standard_normal((i % 3 + 1, 4)).astype(np.float32)
            for i in range(n)}


# --- golden files ---------------------------------------------------------------------------
def test_uckpt_reads_the_golden_table_as_the_spec_decoder_does():
    doc = doc_of(V6 / "all_types")
    rows = golden.table_entries(doc)
    m = uckpt.manifest(V6 / "all_types")
    assert len(rows) == len(doc["table"]["paths"]) > 20
    for path, entry in rows.items():
        c = entry["chunks"][0]
        want = Chunk(c["file"], c["offset"], c["length"], tuple(c["start"]), tuple(c["shape"]),
                     PIPELINE_OF[c["codec"]], c["checksum"], c["hash"], c.get("base"))
        got = m.arrays[path]
        assert (got.dtype, got.shape, got.chunks) == (entry["dtype"], tuple(entry["shape"]),
                                                      (want,)), path
        assert got.root == ""  # not recorded: computed when needed
    roots, top = golden.merkle_roots(listed(doc)["arrays"])
    assert top == m.merkle_root == doc["merkle_root"]
    assert all(m.arrays[p].recorded_root() == roots[p] for p in rows)


# --- malformed tables -----------------------------------------------------------------------
N = 5  # rows: float32 arrays of shape (k % 2 + 1, 4), 16 or 32 bytes each


def planes(values, width):
    raw = np.array(values, dtype=f"<u{width}").view(np.uint8).reshape(len(values), width)
    return raw.T.tobytes()


def layout(offsets, lengths, sources, codecs) -> str:
    data = planes(offsets, 8) + planes(lengths, 8) + planes(sources, 4) + bytes(codecs)
    return base64.b64encode(zlib.compress(data)).decode()


SHAPES = [[k % 2 + 1, 4] for k in range(N)]
LENGTHS = [16 * s[0] for s in SHAPES]
OFFSETS = [sum(LENGTHS[:k]) for k in range(N)]


def valid_doc():
    """A version-6 manifest of N float32 arrays, all rows of the table."""
    paths = [f"p{k}" for k in range(N)]
    t = {"paths": paths, "dtypes": ["float32"] * N, "shapes": copy.deepcopy(SHAPES),
         "sources": [[None, "data-00000.bin"]],
         "layout": layout(OFFSETS, LENGTHS, [0] * N, [0] * N),
         "digests": base64.b64encode(bytes(20 * N)).decode()}
    doc = {"format": "uckpt", "format_version": 6, "generator": "test",
           "created": "2026-01-01T00:00:00Z", "world_size": 1, "step": None, "metadata": {},
           "files": {"data-00000.bin": {"rank": 0, "size": sum(LENGTHS)}},
           "tree": {"type": "dict", "items": {p: {"type": "array", "path": p} for p in paths}},
           "arrays": {}, "table": t}
    _, top = golden.merkle_roots(golden.table_entries(doc))
    doc.update(bases={}, merkle_root=top)
    return doc


def refused(doc, *fragments):
    with pytest.raises(errors.ManifestError) as info:
        parse_manifest(sealed(doc), where="m.json")
    text = str(info.value)
    assert type(info.value) is errors.ManifestError, text
    for fragment in fragments:
        assert fragment in text, text
    return text


def test_the_valid_table_parses():
    m = parse_manifest(sealed(valid_doc()))
    assert list(m.arrays) == [f"p{k}" for k in range(N)]
    assert [a.chunks[0].offset for a in m.arrays.values()] == OFFSETS
    assert all(a.chunks[0].start == (0, 0) and a.chunks[0].shape == a.shape
               for a in m.arrays.values())


def _t(mutate):
    def apply(doc):
        mutate(doc["table"])
    return apply


CASES = {
    "table in version 5": (lambda d: d.update(format_version=5), "<top>",
                           "unknown field(s) 'table'"),
    "missing field": (_t(lambda t: t.pop("shapes")), "table", "missing field(s) shapes"),
    "unknown field": (_t(lambda t: t.update(roots=[])), "table", "unknown field(s) 'roots'"),
    "no rows": (lambda d: d.update(table=dict(d["table"], paths=[], dtypes=[], shapes=[])),
                "table.paths", "at least one row"),
    "paths not a list": (_t(lambda t: t.update(paths="p0")), "table.paths", "a list"),
    "dtypes too short": (_t(lambda t: t["dtypes"].pop()), "table.dtypes", "4 items for 5 paths"),
    "shapes too long": (_t(lambda t: t["shapes"].append([1])), "table.shapes",
                        "6 items for 5 paths"),
    "path not a string": (_t(lambda t: t["paths"].__setitem__(2, 7)), "table.paths[2]",
                          "expected an array path"),
    "path twice": (_t(lambda t: t["paths"].__setitem__(3, "p1")), "table.paths[3]",
                   "'p1' is listed twice"),
    "path also in arrays": (lambda d: d["arrays"].update(p4={"dtype": "int8", "shape": [0],
                                                            "chunks": [], "root": "xxh3-128:"
                                                            + "0" * 32}),
                            "table.paths[4]", "also listed in 'arrays'"),
    "unknown dtype": (_t(lambda t: t["dtypes"].__setitem__(1, "float128")), "table.dtypes[1]",
                      "row 1, 'p1'"),
    "shape with a zero": (_t(lambda t: t["shapes"].__setitem__(0, [0, 4])), "table.shapes[0]",
                          "an empty array is listed in 'arrays'"),
    "shape negative": (_t(lambda t: t["shapes"].__setitem__(0, [-1, 4])), "table.shapes[0]",
                       "-1 is not a dimension"),
    "shape not a list": (_t(lambda t: t["shapes"].__setitem__(2, 4)), "table.shapes[2]",
                         "expected a list"),
    "shape of 65 dimensions": (_t(lambda t: t["shapes"].__setitem__(2, [1] * 65)),
                               "table.shapes[2]", "at most 64"),
    "shape beyond int64": (_t(lambda t: t["shapes"].__setitem__(2, [2 ** 62, 4])),
                           "table.shapes[2]", "more than 2**63-1"),
    "raw length wrong": (_t(lambda t: t.update(layout=layout(OFFSETS, [16] * N, [0] * N,
                                                             [0] * N))),
                         "table.layout", "row 1 ('p1'): a raw chunk of 16 bytes, but its box "
                                         "holds 32"),
    "row past the file end": (_t(lambda t: t.update(layout=layout(
        OFFSETS[:-1] + [OFFSETS[-1] + 1], LENGTHS, [0] * N, [0] * N))), "table",
        "row 4 ('p4'): bytes"),
    "codec number": (_t(lambda t: t.update(layout=layout(OFFSETS, LENGTHS, [0] * N,
                                                         [0, 0, 5, 0, 0]))),
                     "table.layout", "row 2 ('p2'): codec number 5"),
    "layout too short": (_t(lambda t: t.update(layout=layout(OFFSETS[:4], LENGTHS[:4],
                                                             [0] * 4, [0] * 4))),
                         "table.layout", "5 rows need exactly 105"),
    "digests truncated": (_t(lambda t: t.update(digests=t["digests"][:-4])), "table.digests",
                          "5 rows need"),
    "source unknown": (_t(lambda t: t.update(sources=[[None, "data-00009.bin"]])),
                       "table.sources[0][1]", "not listed in 'files'"),
    "source base unknown": (_t(lambda t: t.update(sources=[["s0", "data-00000.bin"]])),
                            "table.sources[0][0]", "not listed in 'bases'"),
    "no sources": (_t(lambda t: t.update(sources=[])), "table.sources", "0 sources"),
    "source unused": (lambda d: (d["files"].update({"data-00001.bin": {"rank": 1, "size": 0}}),
                                 d.update(world_size=2),
                                 d["table"]["sources"].append([None, "data-00001.bin"])),
                      "table.sources[1]", "no row is stored there"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_table_is_refused(case):
    mutate, where, fragment = CASES[case]
    doc = valid_doc()
    mutate(doc)
    refused(doc, where, fragment)


def test_a_tree_node_names_table_rows_and_bytes_rows_are_checked():
    doc = valid_doc()
    doc["tree"]["items"]["p0"]["path"] = "nowhere"
    refused(doc, "array 'nowhere' is not listed")
    doc = valid_doc()
    doc["tree"]["items"]["p0"]["type"] = "bytes"  # a float32 row: not 1-d uint8
    refused(doc, "a bytes node must refer to a 1-d uint8 array")


@pytest.fixture(scope="module")
def validator():
    schema = json.loads(importlib.resources.files("uckpt.format.legacy").joinpath("schema.json")
                        .read_text("utf-8"))
    return jsonschema.Draft202012Validator(schema)


def test_schema_accepts_tables_and_rejects_malformed_ones(validator):
    good = dict(valid_doc(), manifest_checksum="crc32c:00000000")
    validator.validate(good)
    for case in ("table in version 5", "missing field", "unknown field", "no rows",
                 "paths not a list", "path not a string", "path twice", "unknown dtype",
                 "shape with a zero", "shape negative", "shape not a list",
                 "shape of 65 dimensions", "no sources"):
        bad = copy.deepcopy(good)
        CASES[case][0](bad)
        assert not validator.is_valid(bad), case
    for name in ("all_types", "example", "chain/step_00000002"):
        validator.validate(doc_of(V6 / name))
