"""The on-disk format cannot change silently.

* golden checkpoints of format 1.0 (tests/data/golden_1.0, made by
  tests/data/make_golden.py) and of the pre-release versions 1 to 6 (golden_v1 to
  golden_v6) load to exactly the state they were made from, and saving that state again
  gives the same bytes as golden_1.0 (format 1.0, what uckpt writes; tests/test_format10.py
  has 1.0's own cases); version 1 is version 2 without its checksum, version
  2 is version 3 without compressed chunks (golden_v3/codecs has every codec),
  version 3 is version 4 without content hashes, Merkle roots and references
  (golden_v4/chain is an incremental pair), version 4 is version 5 without grid
  listings (tests/test_grid.py has the grid's own cases), version 5 is version 6
  without the table (tests/test_table.py has the table's own cases);
* src/uckpt/format/legacy/schema.json accepts every real manifest and rejects what the
  parser rejects, wherever JSON Schema can express it;
* the readers that docs/format.md and docs/format-legacy.md hold, and their worked
  example, are checked in tests/test_format10_spec.py and tests/test_format_legacy_doc.py.
"""
import copy
import importlib.resources
import importlib.util
import json
import re
import shutil
import struct
import sys
from pathlib import Path

import crc32c as crc32c_lib
import jsonschema
import numpy as np
import pytest

import uckpt
import uckpt.knobs as knobs
from uckpt import dtypes, errors
from uckpt.format import Manifest, integrity
from uckpt.format import parse_manifest
from uckpt.format.legacy import parser as manifest_module, table as table_module
from grid_listing import listed

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data"
GOLDEN = DATA / "golden_1.0"  # the format uckpt writes (tests/test_format10.py has its own cases)
GOLDEN_V6 = DATA / "golden_v6"  # the last pre-release version
GOLDENS = {1: DATA / "golden_v1", 2: DATA / "golden_v2", 3: DATA / "golden_v3", 4: DATA / "golden_v4",
           5: DATA / "golden_v5", 6: GOLDEN_V6}
VERSIONS = sorted(GOLDENS)
GOLDEN_DIRS = ["all_types", "example", "sharded"]  # in every version
EACH_GOLDEN = [pytest.param(v, name, id=f"v{v}-{name}") for v in VERSIONS for name in GOLDEN_DIRS]
EACH_GOLDEN.append(pytest.param(3, "codecs", id="v3-codecs"))
NODE_TYPES = {"value", "float", "array", "bytes", "dict", "list", "tuple", "object"}
ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


def _import(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


golden = _import("make_golden", DATA / "make_golden.py")


# --- helpers ----------------------------------------------------------------------------------
def assert_same(got, want, where="<root>"):
    """Equal values of equal types; arrays and NumPy scalars bitwise, dtypes included."""
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray), (where, type(got))
        assert got.dtype == want.dtype, (where, got.dtype, want.dtype)
        assert got.shape == want.shape, (where, got.shape, want.shape)
        assert got.tobytes() == want.tobytes(), where
    elif isinstance(want, np.generic):
        assert type(got) is type(want), (where, type(got), type(want))
        assert got.tobytes() == want.tobytes(), where
    elif isinstance(want, float):
        assert type(got) is float, (where, type(got))
        assert struct.pack("<d", got) == struct.pack("<d", want), (where, got, want)
    elif isinstance(want, dict):
        assert type(got) is dict, (where, type(got))
        assert list(got) == list(want), (where, list(got), list(want))
        for k in want:
            assert_same(got[k], want[k], f"{where}/{k}")
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want), (where, got)
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{where}/{i}")
    else:  # None, bool, int, str, bytes
        assert type(got) is type(want) and got == want, (where, got, want)


def strict_json(data: bytes):
    """Standard JSON only: no NaN/Infinity tokens, no duplicate keys (docs/format.md 4.1)."""
    def no_constant(name):
        raise ValueError(f"{name} is not JSON")

    def unique(pairs):
        keys = [k for k, _ in pairs]
        if len(keys) != len(set(keys)):
            raise ValueError(f"duplicate keys in {keys}")
        return dict(pairs)

    return json.loads(data.decode("utf-8"), parse_constant=no_constant, object_pairs_hook=unique)


def manifest_doc(directory):
    return strict_json((Path(directory) / "manifest.json").read_bytes())


def body(doc):
    """A manifest document less its checksum member (what mutations start from)."""
    return {k: v for k, v in doc.items() if k != integrity.FIELD}


def encode(doc) -> bytes:
    """A manifest file for ``doc`` (compact JSON): a version-2 or 3 document is sealed with
    its checksum (docs/format.md 4.4), so that the parser's other rules are what it meets."""
    return encode_text(json.dumps(body(doc), ensure_ascii=False), doc.get("format_version"))


def encode_text(text: str, version) -> bytes:
    """The JSON text of a manifest object (no checksum member) as a file of ``version``."""
    if version not in (2, 3, 4, 5, 6):
        return text.encode("utf-8")
    text = text.rstrip()
    assert text.endswith("}")
    return integrity.seal(text[:-1].rstrip().encode("utf-8"))


def mutable_doc(version, name="all_types"):
    """A golden manifest document of ``version``, less its checksum, grids and table listed."""
    return body(listed(manifest_doc(GOLDENS[version] / name)))


def unsealed_text(version, name="all_types") -> str:
    """A golden manifest's text without its checksum member (a JSON object still); a
    version-5 or 6 one with its grids and table listed (``listed``), indented as the golden
    files are."""
    text = (GOLDENS[version] / name / "manifest.json").read_text("utf-8")
    if version >= 5:
        return json.dumps(mutable_doc(version, name), indent=1, ensure_ascii=False) + "\n"
    if version >= 2:
        text = text[:text.rindex(',\n "manifest_checksum":')] + "\n}\n"
    return text


def schema_doc(doc):
    """``doc`` as the schema sees it: with a (well-formed) checksum member if version 2 or 3."""
    doc = body(doc)
    if doc.get("format_version") in (2, 3, 4, 5, 6):
        doc[integrity.FIELD] = "crc32c:00000000"  # the schema cannot check the CRC itself
    return doc


def without_volatile(doc):
    """What stays when the same state is saved again: not the time, the writer, or the
    manifest checksum (of bytes that hold the time)."""
    doc = body(doc)
    doc.pop("created")
    doc.pop("generator")
    return doc


def node_types(node, out=None):
    out = set() if out is None else out
    out.add(node["type"])
    if node["type"] == "dict":
        for v in node["items"].values():
            node_types(v, out)
    elif node["type"] in ("list", "tuple"):
        for v in node["items"]:
            node_types(v, out)
    elif node["type"] == "object":
        node_types(node["state"], out)
    return out


@pytest.fixture(scope="module")
def schema():
    text = importlib.resources.files("uckpt.format.legacy").joinpath("schema.json").read_text("utf-8")
    schema = json.loads(text)
    jsonschema.Draft202012Validator.check_schema(schema)
    return schema


@pytest.fixture(scope="module")
def validator(schema):
    return jsonschema.Draft202012Validator(schema)


@pytest.fixture(scope="module")
def validator10():
    """The validator of format 1.0's root manifests and parts (docs/format-1.0.schema.json)."""
    text = (REPO / "docs" / "format-1.0.schema.json").read_text("utf-8")
    schema = json.loads(text)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


# --- (a) golden checkpoints load to the expected state ------------------------------------------
@pytest.mark.parametrize("version", VERSIONS)
def test_golden_all_types_loads_bitwise(version):
    out = uckpt.load(GOLDENS[version] / "all_types")
    assert_same(out, golden.expected_loaded(golden.golden_state()))
    # an aliased array comes back as one array referred to twice
    assert np.shares_memory(out["shared"], out["tied"]["again"])


@pytest.mark.parametrize("version", VERSIONS)
def test_golden_all_types_manifest_fields(version):
    m = uckpt.manifest(GOLDENS[version] / "all_types")
    assert m.step == golden.STEP and m.metadata == golden.metadata(version) and m.world_size == 1
    assert m.format_version == version
    assert ISO_UTC.match(m.created) and m.generator.startswith("uckpt ")
    raw = (GOLDENS[version] / "all_types" / "manifest.json").read_bytes()
    if version == 1:
        assert m.checksum is None and b"manifest_checksum" not in raw
    else:
        assert m.checksum == f"crc32c:{crc32c_lib.crc32c(raw[:-19]):08x}"
        assert raw.endswith(f'\n "manifest_checksum":"{m.checksum}"}}\n'.encode())


@pytest.mark.parametrize("name, older", [(n, v) for v in (1, 2) for n in GOLDEN_DIRS] + [
    (n, v) for v in (4, 5)
    for n in GOLDEN_DIRS + ["codecs", "chain/step_00000001", "chain/step_00000002"]])
def test_golden_versions_hold_the_same_checkpoints(name, older):
    """Versions 1, 2 and 3, and versions 4, 5 and 6, hold the same checkpoints: equal data
    files, and manifests equal but for the version, the checksum and what changes with
    every save (version 1 is version 2 without its checksum, version 2 is version 3
    without codecs, version 4 is version 5 with its grids listed as chunks, version 5 is
    version 6 with its table's rows listed as array entries)."""
    old, new = GOLDENS[older] / name, GOLDENS[older + 1] / name
    assert sorted(p.name for p in old.iterdir()) == sorted(p.name for p in new.iterdir())
    for data_file in old.glob("*.bin"):
        assert (new / data_file.name).read_bytes() == data_file.read_bytes()
    docs = [listed(manifest_doc(old)), listed(manifest_doc(new))]
    assert docs[0]["format_version"] == older and docs[1]["format_version"] == older + 1
    assert (integrity.FIELD not in docs[0]) == (older == 1)
    assert list(docs[1])[-1] == integrity.FIELD
    for doc in docs:
        for key in ("format_version", "created", "generator", integrity.FIELD):
            doc.pop(key, None)
        doc["metadata"].pop("purpose", None)
    assert docs[0] == docs[1]  # (as dicts: the order of the arrays may differ)


def test_golden_all_types_covers_the_format():
    """The golden checkpoint keeps covering every node type, dtype and layout feature."""
    doc = manifest_doc(GOLDEN_V6 / "all_types")
    assert node_types(doc["tree"]) == NODE_TYPES
    rows = golden.table_entries(doc)  # version 6: arrays stored whole (docs/format-legacy.md)
    assert set(doc["arrays"]) == {"big", "empty", "empty_blob"} and len(rows) > 20
    assert {a["dtype"] for a in rows.values()} == set(dtypes.NAMES)
    assert {s for t in doc["table"]["sources"] for s in t} == {None, "data-00000.bin"}
    arrays = {**doc["arrays"], **rows}
    big = golden.chunk_list(arrays["big"])
    assert "grid" in arrays["big"]  # version 5: listed compactly (docs/format-legacy.md)
    assert len(big) == 3  # split along axis 0 (chunk_bytes=256)
    assert [c["shape"][0] for c in big] == [14, 14, 12]
    assert arrays["zero_d"]["shape"] == [] and arrays["empty"]["chunks"] == []
    tree = doc["tree"]["items"]
    assert tree["tied"]["items"]["again"]["path"] == "shared"  # aliased, stored once
    assert tree["by_epoch"]["key_type"] == "int"
    assert "weird~1key~0name/a~1b" in arrays
    assert tree["scalars"]["items"]["f32"]["numpy_scalar"] is True
    sizes = [p.stat().st_size for p in GOLDEN_V6.rglob("*") if p.is_file()]
    assert sum(sizes) < 40_000  # golden files stay small


def test_golden_all_types_layout_and_padding():
    """uckpt's writer: arrays start at multiples of 64, in array order, an array's chunks
    back to back, zero padding between arrays."""
    directory = GOLDEN_V6 / "all_types"
    doc = manifest_doc(directory)
    data = (directory / "data-00000.bin").read_bytes()
    assert doc["files"] == {"data-00000.bin": {"rank": 0, "size": len(data)}}
    covered = bytearray(len(data))
    end = 0
    arrays = {**doc["arrays"], **golden.table_entries(doc)}
    for a in sorted(arrays.values(), key=lambda a: golden.chunk_list(a)[0]["offset"]
                    if golden.chunk_list(a) else -1):
        for i, c in enumerate(golden.chunk_list(a)):
            assert (c["offset"] % 64 == 0 and c["offset"] >= end) if i == 0 else c["offset"] == end
            end = c["offset"] + c["length"]
            covered[c["offset"]:end] = b"\x01" * c["length"]
            raw = data[c["offset"]:end]
            assert c["checksum"] == f"crc32c:{crc32c_lib.crc32c(raw):08x}"
    assert end == len(data)
    assert all(b == 0 for b, used in zip(data, covered) if not used)


@pytest.mark.parametrize("version", VERSIONS)
def test_golden_example_loads_bitwise(version):
    assert_same(uckpt.load(GOLDENS[version] / "example"),
                golden.expected_loaded(golden.example_state()))


@pytest.mark.parametrize("version", VERSIONS)
def test_golden_sharded_loads_bitwise(version):
    """Two files, 2-D boxes, unaligned offsets: uckpt reads what it cannot yet write."""
    out = uckpt.load(GOLDENS[version] / "sharded")
    want = golden.sharded_expected()
    assert_same(out, {"layer": {"weight": want["layer/weight"], "bias": want["layer/bias"]}})
    assert uckpt.manifest(GOLDENS[version] / "sharded").world_size == 2


@pytest.mark.parametrize("version, name", EACH_GOLDEN)
def test_golden_verifies(version, name):
    m = uckpt.verify(GOLDENS[version] / name)
    stored = sum(c.length for a in m.arrays.values() for c in a.chunks)
    assert m.nbytes == stored if name != "codecs" else m.nbytes > stored
    assert m.format_version == version


def test_golden_codecs_loads_bitwise():
    """Every codec of version 3, encoded by hand, decodes to the expected arrays."""
    out = uckpt.load(GOLDENS[3] / "codecs")
    assert_same(out, golden.codecs_expected())
    m = uckpt.manifest(GOLDENS[3] / "codecs")
    codecs = {c.codec for a in m.arrays.values() for c in a.chunks}
    assert codecs == set(manifest_module.PIPELINE_OF.values())  # read as 1.0's pipelines
    assert [c.codec for c in m.arrays["weights"].chunks] == [("bytegroup", "zstd"), ("zstd",)]


def test_golden_codecs_partial_load():
    """A box inside one compressed chunk, and one across two chunks of different codecs."""
    want = golden.codecs_expected()["weights"]
    for rows in [(3, 9), (30, 40)]:
        box = np.zeros((rows[1] - rows[0], 8), dtype=np.float32)
        uckpt.load(GOLDENS[3] / "codecs", {"weights": uckpt.Shard(box, (64, 8), (rows[0], 0))},
                   strict=False)
        assert_same(box, want[rows[0]:rows[1]])


def test_golden_restores_into_objects():
    counter = golden.Counter()
    counter.count, counter.history = 0, np.zeros(3, dtype=np.int64)
    dest = np.zeros((40, 4), dtype=np.float32)
    uckpt.load(GOLDEN / "all_types", {"counter": counter, "big": dest}, strict=False)
    assert counter.count == 3 and counter.history.tolist() == [5, 8, 13]
    assert_same(dest, golden.golden_state()["big"])


# --- (b) saving the same state again gives the same bytes ---------------------------------------
SAVES = {
    "all_types": (golden.golden_state, golden.KNOBS,
                  {"step": golden.STEP, "metadata": golden.METADATA}),
    "example": (golden.example_state, golden.EXAMPLE_KNOBS, {"step": 7}),
}


@pytest.mark.parametrize("name", sorted(SAVES))
def test_resave_is_byte_identical(tmp_path, monkeypatch, name):
    make_state, knob_values, kwargs = SAVES[name]
    options, knob_values = golden.options_and_knobs(knob_values)
    for knob, value in knob_values.items():
        monkeypatch.setattr(knobs, knob, value)
    fresh = uckpt.save(tmp_path / name, make_state(), options=options, **kwargs)
    old = GOLDEN / name
    assert sorted(p.name for p in fresh.iterdir()) == sorted(p.name for p in old.iterdir())
    for data_file in old.glob("*.bin"):
        assert (fresh / data_file.name).read_bytes() == data_file.read_bytes(), data_file.name
    new_doc, old_doc = manifest_doc(fresh), manifest_doc(old)
    assert without_volatile(new_doc) == without_volatile(old_doc)
    assert list(new_doc) == list(old_doc)  # same key order, too
    assert ISO_UTC.match(new_doc["created"])
    assert new_doc["generator"] == f"uckpt {uckpt.__version__}"


@pytest.mark.parametrize("version", VERSIONS)
def test_hand_written_sharded_golden_is_reproducible(tmp_path, version):
    golden.write_sharded(tmp_path / "sharded", version=version)
    for p in (GOLDENS[version] / "sharded").iterdir():
        assert (tmp_path / "sharded" / p.name).read_bytes() == p.read_bytes(), p.name


def test_uckpt_writes_what_the_spec_says(tmp_path):
    """The compact manifest uckpt writes ends in its checksum member (docs/format.md 4.4):
    the CRC-32C of every byte before the value, then '"}' and a line feed."""
    path = uckpt.save(tmp_path / "c", golden.example_state(), step=7)
    raw = (path / "manifest.json").read_bytes()
    assert raw.startswith(b'{"format":"uckpt","format_version":"1.0","extensions":{},') and \
        raw.count(b"\n") == 1
    covered = raw[:-19]
    assert re.search(rb'"merkle_root":"xxh3-128:[0-9a-f]{32}","manifest_checksum":$', covered)
    assert raw[-19:] == b'"crc32c:%08x"}\n' % crc32c_lib.crc32c(covered)
    doc = strict_json(raw)
    assert list(doc)[-1] == integrity.FIELD and doc[integrity.FIELD] == raw[-18:-3].decode()


def test_make_golden_refuses_to_regenerate(capsys):
    assert golden.main([]) == 1  # golden files are never replaced by accident
    assert "never regenerated" in capsys.readouterr().err


# --- (c) schema and parser agree ----------------------------------------------------------------
def test_schema_mirrors_the_code(schema):
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert tuple(schema["required"]) == manifest_module._TOP_FIELDS
    assert set(schema["properties"]) == set(manifest_module._TOP_FIELDS_V4) | {"table"}
    assert tuple(schema["properties"]["table"]["required"]) == table_module.FIELDS
    assert schema["properties"]["format_version"]["enum"] == list(manifest_module.READ_VERSIONS)
    assert schema["allOf"][0]["else"]["required"] == [integrity.FIELD]  # required from version 2 on
    assert tuple(schema["$defs"]["chunk"]["required"]) == manifest_module._CHUNK_FIELDS
    assert tuple(schema["$defs"]["dtype"]["enum"]) == dtypes.NAMES
    assert tuple(schema["$defs"]["chunk"]["properties"]["codec"]["enum"]) == \
        manifest_module.CODECS
    assert set(schema["$defs"]["node"]["properties"]["type"]["enum"]) == NODE_TYPES


@pytest.mark.parametrize("version, name", EACH_GOLDEN)
def test_golden_manifest_validates(validator, version, name):
    raw = (GOLDENS[version] / name / "manifest.json").read_bytes()
    validator.validate(strict_json(raw))
    assert parse_manifest(raw).format_version == version


def test_schema_knows_the_checksum_rule(validator):
    """A version-2 document needs its checksum member; a version-1 one must not have one."""
    v2 = manifest_doc(GOLDENS[2] / "example")
    validator.validate(v2)
    assert not validator.is_valid(body(v2))
    assert not validator.is_valid(dict(v2, manifest_checksum="crc32c:0123456X"))
    assert not validator.is_valid(dict(body(v2), format_version=1,
                                       manifest_checksum="crc32c:00000000"))
    validator.validate(dict(body(v2), format_version=1))


def _fresh_states():
    rng = np.random.default_rng(0)
    return {
        "golden_default_knobs": (golden.golden_state(), {}),
        "empty": ({}, {}),
        "step_and_metadata": ({"x": np.ones(3)}, {"step": 0, "metadata": {"a": [1, None]}}),
        "numpy_generator": ({"rng": np.random.Generator(np.random.PCG64(7)),
                             "legacy": np.random.RandomState(1)}, {}),
        "many_chunks": ({"w": rng.standard_normal((300, 7)).astype(np.float32)}, {}),
    }


@pytest.mark.parametrize("case", sorted(_fresh_states()))
def test_fresh_manifest_validates(tmp_path, validator10, small_chunks, case):
    state, kwargs = _fresh_states()[case]
    path = uckpt.save(tmp_path / case, state, options=small_chunks, **kwargs)
    validator10.validate(manifest_doc(path))


def test_fresh_multi_rank_manifest_validates(tmp_path, validator10, small_chunks):
    """A save by 3 ranks (threads standing in for them) of replicated arrays gives a valid
    3-file manifest, its rows in the root (every rank loads them)."""
    from uckpt.testing import run_ranks

    path = tmp_path / "c"
    for outcome in run_ranks(3, lambda comm: uckpt.save(path, golden.golden_state(), comm=comm,
                                                        options=small_chunks)):
        assert not isinstance(outcome, BaseException), outcome
    doc = manifest_doc(path)
    validator10.validate(doc)
    assert doc["world_size"] == 3 and len(doc["files"]) == 3
    assert doc["parts"] == []  # replicated arrays: their rows are the root's
    assert_same(uckpt.load(path), uckpt.load(GOLDEN / "all_types"))


# Mutations of the golden all_types manifest. Each is rejected by uckpt's parser; the
# flag says whether JSON Schema can express the rule (then the schema must reject it too).
def _chunk(doc, path="big", i=0):
    return doc["arrays"][path]["chunks"][i]


def _node(doc, *keys):
    node = doc["tree"]
    for k in keys:
        node = node["items"][k]
    return node


def _rename_file(doc, new):
    doc["files"] = {new: doc["files"].pop("data-00000.bin")}
    for a in doc["arrays"].values():
        for c in a["chunks"]:
            c["file"] = new


def _set(getter, key, value):
    def mutate(doc):
        getter(doc)[key] = value
    return mutate


def _pop(getter, key):
    def mutate(doc):
        del getter(doc)[key]
    return mutate


def _deep_tree(doc):
    node = {"type": "value", "value": 1}
    for _ in range(202):
        node = {"type": "dict", "items": {"k": node}}
    doc["tree"]["items"]["deep"] = node


TOP = lambda d: d  # noqa: E731
FILE = lambda d: d["files"]["data-00000.bin"]  # noqa: E731
ARRAY = lambda d: d["arrays"]["big"]  # noqa: E731
CHUNK = _chunk

REJECTED = {
    # --- expressible in JSON Schema --------------------------------------------------------
    **{f"missing {f}": (_pop(TOP, f), True) for f in manifest_module._TOP_FIELDS},
    "unknown top-level field": (_set(TOP, "extra", 1), True),
    "format other": (_set(TOP, "format", "safetensors"), True),
    "format_version 7": (_set(TOP, "format_version", 7), True),
    "format_version 0": (_set(TOP, "format_version", 0), True),
    "format_version string": (_set(TOP, "format_version", "1"), True),
    "generator not a string": (_set(TOP, "generator", 5), True),
    "created null": (_set(TOP, "created", None), True),
    "world_size 0": (_set(TOP, "world_size", 0), True),
    "world_size string": (_set(TOP, "world_size", "1"), True),
    "world_size boolean": (_set(TOP, "world_size", True), True),
    "step negative": (_set(TOP, "step", -1), True),
    "step fractional": (_set(TOP, "step", 1.5), True),
    "step string": (_set(TOP, "step", "42"), True),
    "metadata a list": (_set(TOP, "metadata", []), True),
    "files a list": (_set(TOP, "files", []), True),
    "file entry unknown field": (_set(FILE, "mtime", 0), True),
    "file entry missing size": (_pop(FILE, "size"), True),
    "file size negative": (_set(FILE, "size", -1), True),
    "file rank string": (_set(FILE, "rank", "0"), True),
    "file name ../escape": (lambda d: _rename_file(d, "../data-00000.bin"), True),
    "file name hidden": (lambda d: _rename_file(d, ".data-00000.bin"), True),
    "file name with slash": (lambda d: _rename_file(d, "sub/data-00000.bin"), True),
    "file name with backslash": (lambda d: _rename_file(d, "sub\\data-00000.bin"), True),
    "file name absolute": (lambda d: _rename_file(d, "/etc/passwd"), True),
    "file name with ..": (lambda d: _rename_file(d, "data..bin"), True),
    "file name empty": (lambda d: _rename_file(d, ""), True),
    "file name too long": (lambda d: _rename_file(d, "d" * 256), True),
    "arrays a list": (_set(TOP, "arrays", []), True),
    "array unknown field": (_set(ARRAY, "order", "C"), True),
    "array missing chunks": (_pop(ARRAY, "chunks"), True),
    "dtype alias": (_set(ARRAY, "dtype", "f4"), True),
    "dtype framework name": (_set(ARRAY, "dtype", "torch.float32"), True),
    "shape negative": (_set(ARRAY, "shape", [-40, 4]), True),
    "shape not a list": (_set(ARRAY, "shape", 160), True),
    "chunks not a list": (_set(ARRAY, "chunks", {}), True),
    "chunk unknown field": (_set(CHUNK, "compressed", False), True),
    "chunk missing checksum": (_pop(CHUNK, "checksum"), True),
    "chunk offset negative": (_set(CHUNK, "offset", -64), True),
    "chunk offset string": (_set(CHUNK, "offset", "1728"), True),
    "chunk start not a list": (_set(CHUNK, "start", 0), True),
    "codec unknown": (_set(CHUNK, "codec", "lz4"), True),
    "checksum other algorithm": (_set(CHUNK, "checksum", "md5:0123456789abcdef"), True),
    "checksum short": (_set(CHUNK, "checksum", "crc32c:1234567"), True),
    "checksum long": (_set(CHUNK, "checksum", "crc32c:123456789"), True),
    "checksum not hex": (_set(CHUNK, "checksum", "crc32c:1234567g"), True),
    "checksum a number": (_set(CHUNK, "checksum", 12345678), True),
    "tree root a list": (_set(TOP, "tree", {"type": "list", "items": []}), True),
    "tree root not a node": (_set(TOP, "tree", []), True),
    "node type unknown": (_set(lambda d: _node(d, "values"), "type", "set"), True),
    "node type missing": (_pop(lambda d: _node(d, "values", "int"), "type"), True),
    "value node extra field": (_set(lambda d: _node(d, "values", "int"), "dtype", "int"), True),
    "value node holds a list": (_set(lambda d: _node(d, "values", "int"), "value", [1]), True),
    "value node holds an object": (_set(lambda d: _node(d, "values", "int"), "value", {}), True),
    "value node missing value": (_pop(lambda d: _node(d, "values", "int"), "value"), True),
    "float node NaN spelling": (_set(lambda d: _node(d, "floats", "nan"), "value", "NaN"), True),
    "float node a number": (_set(lambda d: _node(d, "floats", "inf"), "value", 1e308), True),
    "array node path not a string": (_set(lambda d: _node(d, "big"), "path", 1), True),
    "array node numpy_scalar string": (
        _set(lambda d: _node(d, "scalars", "f32"), "numpy_scalar", "yes"), True),
    "array node extra field": (_set(lambda d: _node(d, "big"), "dtype", "float32"), True),
    "bytes node missing path": (_pop(lambda d: _node(d, "blob"), "path"), True),
    "dict key_type unknown": (_set(lambda d: _node(d, "by_epoch"), "key_type", "float"), True),
    "int-keyed dict with a word key": (
        lambda d: _node(d, "by_epoch")["items"].update(x={"type": "value", "value": 1}), True),
    "int-keyed dict with a float key": (
        lambda d: _node(d, "by_epoch")["items"].update({"1.5": {"type": "value", "value": 1}}),
        True),
    "dict items a list": (_set(lambda d: _node(d, "empty_dict"), "items", []), True),
    "list items an object": (_set(lambda d: _node(d, "history"), "items", {}), True),
    "tuple node extra field": (_set(lambda d: _node(d, "pair"), "length", 2), True),
    "object node missing class": (_pop(lambda d: _node(d, "counter"), "class"), True),
    "object node adapter not a string": (_set(lambda d: _node(d, "counter"), "adapter", None),
                                         True),
    "nested node invalid": (
        _set(lambda d: _node(d, "counter")["state"]["items"]["count"], "type", "int"), True),
    # --- needs a reader's own checks ---------------------------------------------------------
    "chunk file not listed": (_set(CHUNK, "file", "data-00009.bin"), False),
    "rank not below world_size": (_set(FILE, "rank", 1), False),
    "chunk beyond end of file": (_set(FILE, "size", 2000), False),
    "chunk start of other rank": (_set(CHUNK, "start", [0]), False),
    "chunk outside the array": (_set(lambda d: _chunk(d, "big", 2), "start", [29, 0]), False),
    "chunk length wrong": (_set(CHUNK, "length", 220), False),
    "chunks overlap": (_set(lambda d: _chunk(d, "big", 1), "start", [13, 0]), False),
    "chunks leave a gap": (lambda d: d["arrays"]["big"]["chunks"].pop(), False),
    "array node path unknown": (_set(lambda d: _node(d, "big"), "path", "nope"), False),
    "bytes node on a float array": (_set(lambda d: _node(d, "blob"), "path", "shared"), False),
    "tree deeper than 200": (_deep_tree, False),
    "integer written with a fraction": (_set(TOP, "world_size", 1.0), False),
}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("case", sorted(REJECTED))
def test_parser_and_schema_reject(validator, case, version):
    mutate, expressible = REJECTED[case]
    doc = mutable_doc(version)
    mutate(doc)
    with pytest.raises(errors.ManifestError) as info:
        parse_manifest(encode(doc))
    assert not isinstance(info.value, errors.ManifestChecksumError)  # sealed: another rule
    if expressible:
        assert not validator.is_valid(schema_doc(doc)), f"schema accepts: {case}"


@pytest.mark.parametrize("version", VERSIONS)
def test_specific_error_types(version):
    doc = mutable_doc(version)
    for mutate, error in [(_set(TOP, "format_version", 7), errors.FormatVersionError),
                          (lambda d: _rename_file(d, "../x"), errors.UnsafePathError)]:
        d = copy.deepcopy(doc)
        mutate(d)
        with pytest.raises(error):
            parse_manifest(encode(d))


def _codecs_doc():
    return body(manifest_doc(GOLDENS[3] / "codecs"))


def _weights_chunk(doc, i=0):
    return doc["arrays"]["weights"]["chunks"][i]


CODEC_REJECTED = {
    "compressed chunk of length 0": (_set(_weights_chunk, "length", 0), "cannot hold"),
    "more than 32768 raw bytes per stored byte": (
        lambda d: d["arrays"].update(huge={"dtype": "float64", "shape": [2 ** 40], "chunks": [
            dict(_weights_chunk(d), start=[0], shape=[2 ** 40])]}), "cannot hold"),
    "compressed chunk without elements": (
        lambda d: d["arrays"]["weights"]["chunks"].append(
            dict(_weights_chunk(d), start=[0, 0], shape=[0, 8])), "cannot hold"),
    "codec of a later version": (_set(_weights_chunk, "codec", "zstd+delta"),
                                 "unknown codec 'zstd\\+delta' for leaf arrays\\['weights'\\]"),
}


@pytest.mark.parametrize("case", sorted(CODEC_REJECTED))
def test_parser_rejects_bad_compressed_chunks(validator, case):
    mutate, message = CODEC_REJECTED[case]
    doc = _codecs_doc()
    mutate(doc)
    with pytest.raises(errors.ManifestError, match=message):
        parse_manifest(encode(doc))


@pytest.mark.parametrize("version", [1, 2])
def test_compressed_codecs_are_version_3(validator, version):
    """A version-1 or 2 manifest with a compressed chunk is refused, by the schema too."""
    doc = dict(_codecs_doc(), format_version=version)
    with pytest.raises(errors.ManifestError, match="unknown codec 'zstd\\+bytegroup'"):
        parse_manifest(encode(doc))
    assert not validator.is_valid(schema_doc(doc))
    validator.validate(schema_doc(dict(doc, format_version=3)))


def _add_orphan(doc):
    doc["arrays"]["orphan"] = {"dtype": "int8", "shape": [0], "chunks": []}
    if doc["format_version"] >= 4:
        doc["arrays"]["orphan"]["root"] = "xxh3-128:" + "0" * 32


def _extra_file(doc):
    doc["world_size"] = 2
    doc["files"]["notes-1.bin"] = {"rank": 1, "size": 0}


ACCEPTED = {
    "as written": lambda d: None,
    "explicit key_type str": _set(lambda d: _node(d, "values"), "key_type", "str"),
    "numpy_scalar false": _set(lambda d: _node(d, "big"), "numpy_scalar", False),
    "step null": _set(TOP, "step", None),
    "metadata nested": _set(TOP, "metadata", {"a": {"b": [1, 2.5, None, "x", {"c": True}]}}),
    "file without chunks": _extra_file,
    "array no node refers to": _add_orphan,
    "chunks in another order": lambda d: d["arrays"]["big"]["chunks"].reverse(),
    "world_size larger than files": _set(TOP, "world_size", 8),
    "big integer value": _set(lambda d: _node(d, "values", "int"), "value", 2 ** 200),
    "negative int key": lambda d: _node(d, "by_epoch")["items"].update(
        {"-12": {"type": "value", "value": None}}),
    "empty generator": _set(TOP, "generator", ""),
}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_parser_and_schema_accept(validator, case, version):
    """The schema is not stricter than the parser on valid variations."""
    doc = mutable_doc(version)
    ACCEPTED[case](doc)
    parse_manifest(encode(doc))
    validator.validate(schema_doc(doc))


# Violations that need care beyond field types (found by review, fixed in the parser).
# The schema (with a standard-JSON loader) rejects those it can express; the parser
# rejects them all.
def _raw_replace(old, new):
    def mutate(text):
        assert old in text
        return text.replace(old, new, 1)
    return mutate


def _doc_edit(mutate):
    def edit(text):
        doc = json.loads(text)
        mutate(doc)
        return json.dumps(doc)
    return edit


def _many_chunks_overlapping(doc):
    n = 600
    doc["files"]["data-00000.bin"]["size"] = 2456 + n
    chunks = [{"file": "data-00000.bin", "offset": 2456 + i, "length": 1, "start": [i],
               "shape": [1], "codec": "raw", "checksum": "crc32c:00000000"} for i in range(n)]
    chunks[5]["start"] = [4]  # overlaps chunk 4; element 5 is never written
    doc["arrays"]["many"] = {"dtype": "uint8", "shape": [n], "chunks": chunks}


def _int_keys_colliding(doc):
    _node(doc, "by_epoch")["items"]["010"] = {"type": "value", "value": "ten again"}


SCHEMA_CANNOT = False  # the rule needs a reader's own check, the schema cannot say it

SPEC_VIOLATIONS = {
    "chunks overlap, more than 512 of them": (
        _doc_edit(_many_chunks_overlapping),
        "_Parser.coverage checks overlap only when an array has at most 512 chunks",
        SCHEMA_CANNOT),
    "int keys equal as integers": (
        _doc_edit(_int_keys_colliding),
        "'10' and '010' both decode to 10; the later one silently wins", SCHEMA_CANNOT),
    "numpy_scalar on a 2-d array": (
        _doc_edit(_set(lambda d: _node(d, "big"), "numpy_scalar", True)),
        "numpy_scalar is not checked against the array's shape", SCHEMA_CANNOT),
    "uppercase checksum": (_doc_edit(_set(CHUNK, "checksum", "crc32c:ABCDEF01")),
                           "parse_checksum accepts uppercase hex (and the reader then reports "
                           "a checksum mismatch instead of a malformed manifest)", True),
    "checksum with sign": (_doc_edit(_set(CHUNK, "checksum", "crc32c:+bcdef01")),
                           "parse_checksum uses int(x, 16), which accepts '+', '_' and spaces", True),
    "checksum with underscore": (_doc_edit(_set(CHUNK, "checksum", "crc32c:ab_def01")),
                                 "parse_checksum uses int(x, 16), which accepts '_'", True),
    "checksum with trailing newline": (_doc_edit(_set(CHUNK, "checksum", "crc32c:abcdef0\n")),
                                       "int(x, 16) strips whitespace", True),
    "file name with trailing newline": (_doc_edit(lambda d: _rename_file(d, "data-00000.bin\n")),
                                        "_SAFE_NAME uses re.match with '$', which matches "
                                        "before a final newline", True),
    "NaN token in metadata": (_raw_replace('"metadata": {', '"metadata": {"x": NaN, '),
                              "json.loads accepts NaN/Infinity tokens", True),
    "NaN token in a value node": (_raw_replace('"value": 42', '"value": NaN'),
                                  "json.loads accepts NaN/Infinity tokens", True),
    "created free text": (_doc_edit(_set(TOP, "created", "yesterday")),
                          "created must be a UTC time", True),
    "duplicate key": (_raw_replace('"world_size": 1,', '"world_size": 1, "world_size": 1,'),
                      "json.loads keeps the last of duplicate keys", True),
}


def _schema_rejects(validator, text):
    try:
        doc = strict_json(text.encode("utf-8"))
    except ValueError:
        return True
    return not validator.is_valid(schema_doc(doc))


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("case", sorted(c for c, v in SPEC_VIOLATIONS.items() if v[2]))
def test_schema_rejects_spec_violations(validator, case, version):
    assert _schema_rejects(validator, SPEC_VIOLATIONS[case][0](unsealed_text(version)))


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("case", sorted(SPEC_VIOLATIONS))
def test_parser_rejects_spec_violations(case, version):
    text = SPEC_VIOLATIONS[case][0](unsealed_text(version))
    with pytest.raises(errors.ManifestError) as info:
        parse_manifest(encode_text(text, version))
    assert not isinstance(info.value, errors.ManifestChecksumError)


@pytest.mark.parametrize("version", VERSIONS)
def test_parser_deeply_nested_json_is_a_manifest_error(version):
    text = unsealed_text(version, "example")
    deep = '"metadata": ' + "[" * 100_000 + "]" * 100_000 + ","
    with pytest.raises(errors.ManifestError, match="nests too deeply"):
        parse_manifest(encode_text(text.replace('"metadata": {},', deep), version))


def _tree_of_depth(doc, depth):
    node = {"type": "value", "value": 1}
    for _ in range(depth - 1):  # the root's items are at depth 1
        node = {"type": "dict", "items": {"k": node}}
    doc["tree"]["items"]["deep"] = node


def test_tree_depth_limit(validator):
    doc = manifest_doc(GOLDEN_V6 / "example")
    _tree_of_depth(doc, 200)
    parse_manifest(encode(doc))
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(10_000)  # see docs/format.md section 12
    try:
        validator.validate(schema_doc(doc))
    finally:
        sys.setrecursionlimit(old)
    _tree_of_depth(doc, 201)
    with pytest.raises(errors.ManifestError, match="deeper than 200"):
        parse_manifest(encode(doc))


# --- (d) the golden incremental pair -------------------------------------------------------------
def test_golden_chain_loads_verifies_and_refers_to_its_base():
    first, second = golden.chain_states()
    chain = GOLDEN / "chain"
    assert_same(uckpt.load(chain / "step_00000002"), second)
    assert_same(uckpt.load(chain / "step_00000001"), first)
    m = uckpt.verify(chain / "step_00000002")
    based = [c.base for c in m.arrays["w"].chunks]
    assert based == ["step_00000001", "step_00000001", None, "step_00000001"]
    assert m.files["data-00000.bin"].size == 16  # only the changed row was written


def test_resave_of_the_golden_chain_is_byte_identical(tmp_path):
    options, rest = golden.options_and_knobs(golden.CHAIN_KNOBS)
    assert not rest  # every one is a layout option
    first, second = golden.chain_states()
    uckpt.save(tmp_path / "step_00000001", first, step=1, incremental=True, options=options)
    uckpt.save(tmp_path / "step_00000002", second, step=2, base=tmp_path / "step_00000001",
               options=options)
    for name in ("step_00000001", "step_00000002"):
        old, new = GOLDEN / "chain" / name, tmp_path / name
        assert (new / "data-00000.bin").read_bytes() == (old / "data-00000.bin").read_bytes()
        assert without_volatile(manifest_doc(new)) == without_volatile(manifest_doc(old))


# --- the commit rule, as a reader of a CheckpointManager root sees it ---------------------------
def test_hidden_directories_are_not_checkpoints(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    shutil.copytree(GOLDEN / "example", root / "step_00000003")
    for hidden in (".step_00000005.uckpt-tmp-0123abcd", ".step_00000004.uckpt-del-89abcdef",
                   ".step_00000003.uckpt-old-01234567"):
        shutil.copytree(GOLDEN / "example", root / hidden)  # complete, manifest included
    (root / "step_00000006").mkdir()  # no manifest: not committed
    before = sorted(p.name for p in root.iterdir())
    with uckpt.CheckpointManager(root) as manager:  # a reader: sees, removes nothing
        assert manager.steps() == [3]
    assert sorted(p.name for p in root.iterdir()) == before
    with uckpt.CheckpointManager(root, role="writer") as manager:  # removes the debris
        assert manager.steps() == [3]  # the .uckpt-old- copy of 3 is dropped: 3 exists
    assert [p.name for p in sorted(root.iterdir()) if not p.name.startswith(".uckpt")] == \
        ["step_00000003", "step_00000006"]
