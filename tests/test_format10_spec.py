"""Format 1.0 as docs/format.md specifies it, checked by executing the document.

* tests/format10_writer.py builds 1.0 checkpoints by hand from the spec (root only, parts,
  every pipeline and dtype, an incremental pair, extensions); the reference reader of
  docs/format.md (section 17) reads each back bit for bit, and refuses damaged variants;
* the worked example (section 16): its manifest is the hand-built one byte for byte, its rows
  are what the chunk table decodes to, its hex dump is the data file, and its Merkle root is
  the one uckpt computed for the same state in format version 6;
* the document's tables list the dtypes, members, columns and pipelines the code knows, and
  its normative part stays within its length budget;
* the reference reader reads what uckpt writes and the golden files of
  tests/data/golden_1.0.
"""
import base64
import json
import re
import zlib
from pathlib import Path

import crc32c as crc32c_lib
import numpy as np
import pytest

import format10_writer as fw
import uckpt
from spec_doc import SPEC, as_read, doc_block, legacy_reader, reference_reader
from test_format import assert_same
from uckpt import dtypes

DATA = Path(__file__).resolve().parent / "data"
READABLE = [k for k in fw.KINDS if k != "ext_required"]


@pytest.fixture(scope="module")
def reader():
    return reference_reader()


def read(reader, directory):
    return reader["read_checkpoint"](str(directory))


def manifest(directory):
    return json.loads((Path(directory) / "manifest.json").read_bytes())


def reseal(directory, doc):
    """Write ``doc`` as the root manifest of ``directory``, with a valid checksum member."""
    doc = {k: v for k, v in doc.items() if k != "manifest_checksum"}
    (Path(directory) / "manifest.json").write_bytes(fw.seal(doc))


def layout(table):
    return bytearray(zlib.decompress(base64.b64decode(table["layout"])))


def example_with_layout(directory, edit):
    """The worked example at ``directory``, its root table's inflated layout changed by
    ``edit(bytearray) -> bytes`` and the manifest sealed anew."""
    fw.build("example", directory)
    doc = manifest(directory)
    raw = bytes(edit(layout(doc["chunks"])))
    doc["chunks"]["layout"] = base64.b64encode(zlib.compress(raw)).decode()
    reseal(directory, doc)


# --- the reference reader on hand-built checkpoints ---------------------------------------------
@pytest.mark.parametrize("doc_reader", [reference_reader, legacy_reader])
def test_doc_readers_crc32c(doc_reader):
    crc32c = doc_reader()["crc32c"]
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    assert crc32c(b"") == 0
    data = np.random.default_rng(1).integers(0, 256, 1000, dtype=np.uint8).tobytes()
    assert crc32c(data) == crc32c_lib.crc32c(data)


@pytest.mark.parametrize("kind", READABLE)
def test_reference_reader_reads_hand_built(reader, tmp_path, kind):
    expected = fw.build(kind, tmp_path / "c")
    m, arrays = read(reader, tmp_path / "c")
    assert m["format_version"] == "1.0" and list(arrays) == m["arrays"]["paths"]
    assert list(arrays) == list(expected)
    for path, want in expected.items():
        assert_same(arrays[path], want, path)


def test_hand_built_kinds_cover_the_format(tmp_path):
    """The kinds hold what the spec has: parts beside root rows, every pipeline, bases, every
    dtype, a 0-d and an empty array, and both kinds of extension."""
    docs = {}
    for kind in fw.KINDS:
        fw.build(kind, tmp_path / kind)
        docs[kind] = manifest(tmp_path / kind)
    sharded = docs["sharded"]
    assert [p["file"] for p in sharded["parts"]] == ["manifest.part-00000.json",
                                                      "manifest.part-00001.json"]
    assert sharded["chunks"]["count"] == 1 and sharded["world_size"] == 2
    assert sorted(map(tuple, docs["codecs"]["codecs"])) == sorted(fw.PIPELINES)
    assert docs["chain"]["bases"] == {"base-chain": {"data-00000.bin": 64}}
    assert set(docs["all_types"]["arrays"]["dtypes"]) == set(dtypes.NAMES)
    assert [] in docs["all_types"]["arrays"]["shapes"]
    assert docs["ext_optional"]["extensions"] == {"x-test": {"required": False}}
    assert docs["ext_required"]["extensions"] == {"x-test": {"required": True}}
    for kind in ("example", "all_types", "codecs", "chain"):
        assert docs[kind]["parts"] == []


def test_reference_reader_rebuilds_the_tree(reader, tmp_path):
    fw.build("all_types", tmp_path / "c")
    m, arrays = read(reader, tmp_path / "c")
    state = reader["decode"](m["tree"], arrays)
    assert state["grid"] is state["again"]  # aliases stay one object
    assert state["int_keys"] == {-1: 2**70} and state["scalar"] == 2.5
    assert type(state["seq"][0]) is tuple and np.isnan(state["seq"][0][1])
    assert state["obj"] == {"n": 1.5}


def test_reference_reader_refuses_a_required_unknown_extension(reader, tmp_path):
    fw.build("ext_required", tmp_path / "c")
    with pytest.raises(ValueError, match="requires extension 'x-test'"):
        read(reader, tmp_path / "c")


def test_reference_reader_refuses_members_of_undeclared_extensions(reader, tmp_path):
    fw.build("ext_optional", tmp_path / "c")
    doc = manifest(tmp_path / "c")
    doc["extensions"] = {}
    reseal(tmp_path / "c", doc)
    with pytest.raises(ValueError, match="unknown member 'x-test:note'"):
        read(reader, tmp_path / "c")


@pytest.mark.parametrize("version", ["1.1", "2.0", 6, 1])
def test_reference_reader_refuses_other_versions(reader, tmp_path, version):
    fw.build("example", tmp_path / "c")
    reseal(tmp_path / "c", dict(manifest(tmp_path / "c"), format_version=version))
    with pytest.raises(ValueError, match="not a uckpt checkpoint of format 1.0"):
        read(reader, tmp_path / "c")


def test_reference_reader_refuses_a_damaged_manifest(reader, tmp_path):
    fw.build("example", tmp_path / "c")
    path = tmp_path / "c" / "manifest.json"
    raw = bytearray(path.read_bytes())
    raw[raw.index(b'"step": 7') + 8] = ord("8")
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="manifest.json is damaged"):
        read(reader, tmp_path / "c")


def test_reference_reader_refuses_a_part_with_a_wrong_checksum(reader, tmp_path):
    fw.build("sharded", tmp_path / "c")
    part = tmp_path / "c" / "manifest.part-00000.json"
    raw = part.read_bytes()
    part.write_bytes(raw.replace(b'"format":"uckpt-part"', b'"format":"uckpt-pArt"'))  # same size
    with pytest.raises(ValueError, match=r"parts\[0\] \(manifest.part-00000.json\): checksum "
                                         "does not match"):
        read(reader, tmp_path / "c")


def test_reference_reader_refuses_a_part_of_another_size(reader, tmp_path):
    fw.build("sharded", tmp_path / "c")
    with open(tmp_path / "c" / "manifest.part-00001.json", "ab") as f:
        f.write(b" ")
    with pytest.raises(ValueError, match="manifest.part-00001.json: .* bytes, not"):
        read(reader, tmp_path / "c")


def test_reference_reader_refuses_rows_outside_their_parts_runs(reader, tmp_path):
    fw.build("sharded", tmp_path / "c")
    doc = manifest(tmp_path / "c")
    assert doc["parts"][1]["arrays"] == [[0, 2]]
    doc["parts"][1]["arrays"] = [[1, 1]]  # its rows of array 0 fall outside
    reseal(tmp_path / "c", doc)
    with pytest.raises(ValueError, match=r"parts\[1\] .*rows do not match its arrays"):
        read(reader, tmp_path / "c")


def _set(raw, index, value, was):
    assert raw[index] == was
    raw[index] = value
    return raw


def test_reference_reader_refuses_a_row_outside_its_file(reader, tmp_path):
    # row 3's offset (column at 4 x 4, plane 0): 128 -> 129, so it ends at 131 > 130
    example_with_layout(tmp_path / "c", lambda raw: _set(raw, 4 * 4 + 3, 129, was=128))
    with pytest.raises(ValueError, match=r"chunks: row 3 \(array 'tag'\): bounds"):
        read(reader, tmp_path / "c")


def test_reference_reader_refuses_overlapping_rows(reader, tmp_path):
    # row 1's start[0], the fifth value of the box column (at 25 x 4, plane 0): 1 -> 0
    example_with_layout(tmp_path / "c", lambda raw: _set(raw, 25 * 4 + 4, 0, was=1))
    with pytest.raises(ValueError, match=r"row 1 \(array 'model/w'\): box outside its array "
                                         "or overlapping"):
        read(reader, tmp_path / "c")


@pytest.mark.parametrize("change", [8, -8, 1])
def test_reference_reader_refuses_a_box_column_of_the_wrong_length(reader, tmp_path, change):
    example_with_layout(tmp_path / "c",
                        lambda raw: raw + bytes(change) if change > 0 else raw[:change])
    with pytest.raises(ValueError, match=r"chunks.layout: not 196 bytes"):
        read(reader, tmp_path / "c")


def test_reference_reader_refuses_a_damaged_chunk(reader, tmp_path):
    fw.build("example", tmp_path / "c")
    with open(tmp_path / "c" / "data-00000.bin", "r+b") as f:
        f.seek(65)  # the second byte of model/b's row (offset 64)
        f.write(b"\x40")
    with pytest.raises(ValueError, match="data-00000.bin: chunk of 'model/b' at offset 64"):
        read(reader, tmp_path / "c")


def test_reference_reader_refuses_an_uncommitted_base(reader, tmp_path):
    fw.build("chain", tmp_path / "chain")
    (tmp_path / "base-chain" / "manifest.json").unlink()
    with pytest.raises(ValueError, match="base 'base-chain' is not a committed checkpoint"):
        read(reader, tmp_path / "chain")


def test_reference_reader_refuses_an_unsafe_name(reader, tmp_path):
    fw.build("chain", tmp_path / "chain")
    doc = manifest(tmp_path / "chain")
    doc["bases"] = {"..": doc["bases"]["base-chain"]}
    doc["chunks"]["sources"][0][0] = ".."
    reseal(tmp_path / "chain", doc)
    with pytest.raises(ValueError, match="unsafe file name '..'"):
        read(reader, tmp_path / "chain")


# --- the worked example of section 16 -----------------------------------------------------------
def _hexdump_bytes():
    data = bytearray()
    for line in doc_block("example-hexdump").splitlines():
        dump = line.split("|")[0].split()
        offset, hexbytes = int(dump[0], 16), dump[1:]
        assert offset == len(data), f"hex dump line at {dump[0]} is out of sequence"
        assert 1 <= len(hexbytes) <= 16 and all(re.fullmatch(r"[0-9a-f]{2}", b) for b in hexbytes)
        data += bytes(int(b, 16) for b in hexbytes)
    return bytes(data)


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    directory = tmp_path_factory.mktemp("doc") / "example"
    fw.build("example", directory)
    return directory


def test_doc_example_manifest_is_the_hand_built_one(example):
    assert doc_block("example-manifest").encode("utf-8") == \
        (example / "manifest.json").read_bytes()


def test_doc_example_hexdump_is_the_data_file(example):
    dump = _hexdump_bytes()
    assert (example / "data-00000.bin").read_bytes() == dump
    assert (DATA / "golden_v6" / "example" / "data-00000.bin").read_bytes() == dump


def test_doc_example_rows_are_the_decoded_table(reader, example):
    doc = manifest(example)
    rows = reader["columns"](doc["chunks"], [len(s) for s in doc["arrays"]["shapes"]], "chunks")
    lines = doc_block("example-rows").splitlines()
    assert lines[0].split() == ["row", "array", "offset", "length", "source", "codec", "start",
                                "shape", "crc32c"]
    for k, (line, row) in enumerate(zip(lines[1:], rows, strict=True)):
        array, offset, length, source, codec, start, shape, crc, _ = row
        assert line == f"{k:<4} {array:<6} {offset:<7} {length:<7} {source:<7} {codec:<6} " \
                       f"{str(start):<7} {str(shape):<7} {crc:08x}"


def test_doc_example_claims(example, reader):
    text = SPEC.read_text(encoding="utf-8")
    raw = (example / "manifest.json").read_bytes()
    crc = f"{crc32c_lib.crc32c(raw[:-19]):08x}"
    assert f"`{crc}` is the\nCRC-32C of the file's first {len(raw) - 19} bytes" in text
    inflated = layout(manifest(example)["chunks"])
    assert len(inflated) == 196 and "25 × 4 + 8 × 12 = 196 bytes" in text
    assert inflated[:16].hex(" ") == "00 00 01 02" + " 00" * 12
    assert inflated[100:112].hex(" ") == "00 00 01 02 01 00 01 02 00 02 00 02"
    # the same state and chunking as format version 6's golden example: the same Merkle root
    v6 = json.loads((DATA / "golden_v6" / "example" / "manifest.json").read_bytes())
    assert manifest(example)["merkle_root"] == v6["merkle_root"]
    m, arrays = read(reader, example)
    assert_same(reader["decode"](m["tree"], arrays),
                {"model": {"w": np.array([[1.0, -2.0], [0.5, 0.25]], np.float32),
                           "b": np.array([1.0, -1.5], np.float32)},
                 "epoch": 3, "lr": float("inf"), "tag": b"hi"})


# --- the document's tables and length ---------------------------------------------------------
def _table_rows(heading):
    """First-column names and cells of the markdown table following ``heading``."""
    text = SPEC.read_text(encoding="utf-8")
    rows, body = [], False
    for line in text[text.index(heading):].splitlines()[1:]:
        if body and not line.startswith("|"):
            break
        if line.startswith("|---"):
            body = True  # rows after the header's separator line
            continue
        m = re.match(r"\| `?([^`|]+?)`? \|(.*)", line)
        if body and m:
            rows.append((m.group(1), [c.strip() for c in m.group(2).split(" | ")]))
    return rows


def test_doc_tables_match_the_code(reader, example):
    rows = _table_rows("## 10 Dtypes and byte encoding")
    assert [name for name, _ in rows] == list(dtypes.NAMES) == list(reader["NUMPY"])
    for name, cells in rows:
        assert int(cells[0]) == dtypes.itemsize(name) == np.dtype(reader["NUMPY"][name]).itemsize
    members = [n for n, _ in _table_rows("### 3.2 Members")]
    assert members == reader["ROOT"] == list(manifest(example))
    assert [n for n, _ in _table_rows("### 3.3 File entries")] == ["rank", "size"]
    assert [n for n, _ in _table_rows("## 4 The array table")] == ["paths", "dtypes", "shapes"]
    assert [json.loads(n) for n, _ in _table_rows("## 5 Codec pipelines")] == \
        reader["PIPELINES"] == [list(p) for p in fw.PIPELINES]
    assert [n for n, _ in _table_rows("## 6 The chunk table")] == \
        ["count", "sources", "layout", "digests"]
    columns = _table_rows("inflates to exactly 25 × N + 8 × M")
    assert [(n, c[1], c[2]) for n, c in columns] == [
        ("array", "u32", "0"), ("offset", "u64", "4 × N"), ("length", "u64", "12 × N"),
        ("source", "u32", "20 × N"), ("codec", "u8", "24 × N"), ("box", "u64", "25 × N")]
    assert [n for n, _ in _table_rows("## 7 Parts")] == ["file", "size", "checksum", "arrays"]
    assert {n for n, _ in _table_rows("## 8 The tree")} == \
        {"value", "float", "array", "bytes", "dict", "list", "tuple", "object"}


def test_doc_normative_part_is_short():
    """Sections 1 to 14 (the normative part) stay within half of version 6's 1698 lines."""
    lines = SPEC.read_text(encoding="utf-8").splitlines()
    informative = next(i for i, line in enumerate(lines) if line.startswith("## 15 "))
    assert informative <= 849


# --- what uckpt writes -------------------------------------------------------------------------
def _writes_1_0(directory):
    assert manifest(directory)["format_version"] == "1.0"


def _rows(reader, doc, table):
    """The rows of ``table`` with their sources resolved, in a canonical order (the order of
    rows, the order of ``sources`` and the zlib level of ``layout`` carry no meaning)."""
    rows = reader["columns"](table, [len(s) for s in doc["arrays"]["shapes"]], "chunks")
    return sorted((r[0], r[5], r[6], tuple(table["sources"][r[3]]), r[1], r[2], r[4], r[7])
                  for r in rows)


def test_doc_example_is_what_uckpt_writes(reader, tmp_path, monkeypatch, example):
    monkeypatch.chdir(tmp_path)
    exec(compile(doc_block("example-save"), "format.md:example-save", "exec"), {})
    assert (tmp_path / "example" / "data-00000.bin").read_bytes() == _hexdump_bytes()
    _writes_1_0(tmp_path / "example")
    volatile = ("generator", "created", "manifest_checksum", "chunks")
    got, want = manifest(tmp_path / "example"), manifest(example)
    assert {k: v for k, v in got.items() if k not in volatile} == \
        {k: v for k, v in want.items() if k not in volatile}
    assert _rows(reader, got, got["chunks"]) == _rows(reader, want, want["chunks"])


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_reference_reader_reads_what_uckpt_writes(reader, tmp_path, compression):
    rng = np.random.default_rng(3)
    state = {"w": rng.standard_normal((40, 3)).astype(np.float32), "n": np.int64(4),
             "ids": np.arange(300, dtype=np.int64), "empty": np.zeros((0, 2), np.int8)}
    path = uckpt.save(tmp_path / "c", state, compression=compression)
    _writes_1_0(path)
    m, arrays = read(reader, path)
    assert_same(reader["decode"](m["tree"], arrays), as_read(uckpt.load(path)))


GOLDEN_1_0 = ("all_types", "codecs", "example", "sharded", "part_roots", "redundancy_xor",
              "redundancy_partner")  # (chain: below)


@pytest.mark.parametrize("name", GOLDEN_1_0)
def test_reference_reader_reads_golden_1_0(reader, validator, name):
    directory = DATA / "golden_1.0" / name
    for path in sorted(directory.glob("manifest*.json")):
        validator.validate(json.loads(path.read_bytes()))
    m, arrays = read(reader, directory)
    assert_same(reader["decode"](m["tree"], arrays), as_read(uckpt.load(directory)))


def test_reference_reader_reads_the_golden_1_0_chain(reader):
    chain = DATA / "golden_1.0" / "chain" / "step_00000002"
    m, arrays = read(reader, chain)
    assert m["bases"] and sorted(arrays) == sorted(m["arrays"]["paths"])
    assert_same(reader["decode"](m["tree"], arrays), as_read(uckpt.load(chain)))



# --- the JSON Schema of docs/format-1.0.schema.json ----------------------------------------------
@pytest.fixture(scope="module")
def validator():
    import jsonschema

    schema = json.loads((SPEC.parent / "format-1.0.schema.json").read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("kind", fw.KINDS)
def test_schema_accepts_hand_built_manifests_and_parts(validator, tmp_path, kind):
    fw.build(kind, tmp_path / "c")
    for path in sorted((tmp_path / "c").glob("manifest*.json")):
        validator.validate(json.loads(path.read_bytes()))


def _without(doc, key):
    return {k: v for k, v in doc.items() if k != key}


SCHEMA_VIOLATIONS = {
    "missing member": lambda d: _without(d, "codecs"),
    "unknown member": lambda d: dict(d, table={}),
    "integer version": lambda d: dict(d, format_version=6),
    "other version": lambda d: dict(d, format_version="1.1"),
    "compound codec name": lambda d: dict(d, codecs=[["zstd+bytegroup"]]),
    "pipeline without zstd last": lambda d: dict(d, codecs=[["zstd", "bytegroup"]]),
    "no pipeline": lambda d: dict(d, codecs=[]),
    "bad extension name": lambda d: dict(d, extensions={"X": {"required": False}}),
    "extension without required": lambda d: dict(d, extensions={"x": {}}),
    "array table member": lambda d: dict(d, arrays=dict(d["arrays"], roots=[])),
    "unknown dtype": lambda d: dict(d, arrays=dict(d["arrays"], dtypes=["float", "bfloat16",
                                                                         "uint8"])),
    "negative count": lambda d: dict(d, chunks=dict(d["chunks"], count=-1)),
    "layout not Base64": lambda d: dict(d, chunks=dict(d["chunks"], layout="eAF?")),
    "part named manifest.json": lambda d: dict(d, parts=[{"file": "manifest.json", "size": 1,
                                                          "checksum": "crc32c:00000000",
                                                          "arrays": [[0, 1]]}]),
    "part run of 0 arrays": lambda d: dict(d, parts=[{"file": "p", "size": 1,
                                                      "checksum": "crc32c:00000000",
                                                      "arrays": [[0, 0]]}]),
    "hidden data file": lambda d: dict(d, files={".data": {"rank": 0, "size": 130}}),
}


@pytest.mark.parametrize("case", SCHEMA_VIOLATIONS)
def test_schema_rejects(validator, example, case):
    doc = manifest(example)
    validator.validate(doc)
    assert not validator.is_valid(SCHEMA_VIOLATIONS[case](doc))


def test_schema_rejects_a_part_with_another_member(validator, tmp_path):
    fw.build("sharded", tmp_path / "c")
    part = json.loads((tmp_path / "c" / "manifest.part-00000.json").read_bytes())
    validator.validate(part)
    assert not validator.is_valid(dict(part, parts=[]))
    assert not validator.is_valid(dict(part, format_version=1))
