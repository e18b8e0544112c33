"""Fuzzing checkpoint directories: every outcome is correct data or a clean UckptError.

Sources: a checkpoint written here by ``uckpt.save`` (every dtype family, a
multi-chunk array, nested dict/list/tuple, int keys, metadata, step) and copies
of every golden checkpoint (``tests/data/golden_v*/*``, ``golden_1.0/*``, whose
``sharded`` has manifest parts, and ``golden_1.0/chain/step_00000002``, which has
a base). Each case copies a source twice into a CheckpointManager root
(``step_00000001`` intact, or the base of a source that has one;
``step_00000002`` mutated) and runs, in a worker process (tests/fuzz_common.py),
``uckpt.manifest``, ``uckpt inspect`` (text and ``--json``), ``uckpt.load`` (no
target), ``uckpt.load`` into a state of the right structure, ``uckpt.verify``,
``uckpt verify``, ``uckpt verify --all ROOT``, ``uckpt ls --json ROOT`` and
``CheckpointManager(root).restore``.

The oracle (``fuzz_common.judge``): an operation either returns exactly the
saved values (bitwise) or raises a UckptError; never another exception, a hang
(each operation has OP_SECONDS; a worker that does not answer is killed), a
traceback from the CLI, or a peak memory above its bound (DESIGN invariant 9:
RSS_SLACK for verify, inspect, ls and the manifest, whatever the sizes declared;
the arrays a manifest declares plus RSS_SLACK for load and restore). Where a
mutation damaged what an operation reads, it must raise, and the manager must
fall back to step 1. A manifest changed and then re-sealed
(its integrity check recomputed) is a different valid-looking checkpoint: it may
load, but then as the reader of docs/format.md reads it, and restores agree with
loads. Mutations: data files (flips, insertions, deletions, truncation,
extension, emptied), manifest and manifest part bytes, manifest JSON (fields
retyped, huge and negative integers, deletions, extra and duplicate keys, lone
surrogates, deep nesting, other dtypes; equivalent re-chunkings, which must load
exactly as saved; a format-1.0 manifest edited as written, its chunk tables,
codecs, parts and extensions included: tests/fuzz_format10.py), hand-made hostile
manifests (2**40 to 2**64 elements, 65+ dimensions, int64 overflows, 5,000-digit
int keys, ...; written as version 6), decompression bombs (an array replaced by
one Zstandard chunk of RLE blocks decoding to up to 64 MiB, 32,768 times its
size: valid, holding half what it declares, or declaring another size than its
frame), and directory entries (a manifest, part or data file
replaced by FIFOs, directories, sockets, symlinks to /dev/zero, /dev/null,
outside, inside, to themselves, dangling; no permissions; extra files; the
checkpoint itself a symlink, a file, a FIFO; odd entries in the root).

Each test collects every problem over all its examples and fails once, listing
them; hypothesis runs derandomized (the same examples every run) and never
shrinks. Bounded by default (20 s on two idle cores, 55 s on two saturated ones); more:

    UCKPT_FUZZ_LONG=1     20 times the examples (about 5 minutes)
    UCKPT_FUZZ_SEED=N     other examples: hypothesis seeded with N instead of derandomized
    UCKPT_FUZZ_REPORT=F   also append every problem to file F, one JSON line each

See docs/testing.md ("Fuzzing").
"""
import copy
import json
import os
import re
import shutil
import socket
import tempfile
from pathlib import Path

import crc32c
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

import uckpt
from uckpt import dtypes
from uckpt.codecs import hashing
from conftest import REPO
from fuzz_common import (OPS, Case, Dup, Raw, Source, Worker, dumps, establish, fingerprint,
                         is_sealed, judge, manifest_doc, run_case, seal_manifest, stale_seal)
from fuzz_format10 import as_1_0, edit_10

LONG = os.environ.get("UCKPT_FUZZ_LONG", "") not in ("", "0")
SEED = os.environ.get("UCKPT_FUZZ_SEED")
SCALE = 20 if LONG else 1
MANIFEST = "manifest.json"
DATA0 = "data-00000.bin"
PART0 = "manifest.part-00000.json"

pytestmark = pytest.mark.timeout(3600 if LONG else 900)


def fuzz_settings(examples: int):
    """Derandomized (or seeded by UCKPT_FUZZ_SEED), no shrinking, no deadline."""
    def wrap(fn):
        fn = settings(max_examples=examples * SCALE, deadline=None, database=None,
                      derandomize=SEED is None, phases=[Phase.explicit, Phase.generate],
                      suppress_health_check=list(HealthCheck))(fn)
        return seed(int(SEED))(fn) if SEED is not None else fn
    return wrap


def check(problems):
    """Fail once with every problem, grouped by operation and what went wrong (numbers
    and paths aside), three examples of each."""
    report = os.environ.get("UCKPT_FUZZ_REPORT")
    if report and problems:
        with open(report, "a", encoding="utf-8") as f:
            for p in problems:
                f.write(json.dumps(p) + "\n")
    groups = {}
    for p in problems:  # "source: case: op: problem"
        m = re.search(r": ((?:%s): .*)" % "|".join(OPS), p)
        key = re.sub(r"/\S*|\b[0-9a-f]{16}\b|\d+", "_", m.group(1) if m else p)[:100]
        groups.setdefault(key, []).append(p)
    text = "\n".join(f"{len(g)} x {key}\n" + "\n".join(f"    {p[:600]}" for p in g[:3])
                     for key, g in sorted(groups.items(), key=lambda kv: -len(kv[1])))
    assert not problems, f"{len(problems)} problem(s) of {len(groups)} kind(s):\n{text}"


# --- reading a manifest's tree -----------------------------------------------------------------
def _nodes(node, path="$.tree"):
    """(node, path) of every node of a tree."""
    yield node, path
    kind = node.get("type")
    if kind == "dict":
        for k, child in node["items"].items():
            yield from _nodes(child, f"{path}.items[{k!r}]")
    elif kind in ("list", "tuple"):
        for i, child in enumerate(node["items"]):
            yield from _nodes(child, f"{path}.items[{i}]")
    elif kind == "object":
        yield from _nodes(node["state"], f"{path}.state")


def _arrays_under(node):
    return {n["path"] for n, _ in _nodes(node) if n.get("type") in ("array", "bytes")}


def _target_array(doc):
    """The array with the most chunks among those an "array" node (not a NumPy scalar)
    refers to."""
    paths = [n["path"] for n, _ in _nodes(doc["tree"])
             if n.get("type") == "array" and not n.get("numpy_scalar")]
    return max(paths, key=lambda p: (len(doc["arrays"][p]["chunks"]), p))


def _crc(directory: Path, chunk, offset, length) -> str:
    with open(directory / chunk["file"], "rb") as f:
        f.seek(offset)
        return f"crc32c:{crc32c.crc32c(f.read(length)):08x}"


def _content_hash(directory: Path, chunk, offset, length) -> str:
    """The content hash (format version 4) of a raw chunk's bytes."""
    with open(directory / chunk["file"], "rb") as f:
        f.seek(offset)
        return hashing.of(f.read(length))


def _merkle_roots(doc) -> None:
    """Set a version-4 document's Merkle roots anew from its chunks' hashes."""
    if "merkle_root" not in doc:
        return
    roots = {}
    for path, a in doc["arrays"].items():
        roots[path] = hashing.array_root(a["dtype"], a["shape"], [
            (c["start"], c["shape"], hashing.parse_hash(c["hash"])) for c in a["chunks"]])
        a["root"] = hashing.format_hash(roots[path])
    doc["merkle_root"] = hashing.format_hash(hashing.checkpoint_root(roots))


# --- sources ----------------------------------------------------------------------------------
def fresh_state():
    rng = np.random.default_rng(7)
    return {
        "model": {
            "w": rng.standard_normal((24, 9)).astype(np.float32),
            "b": rng.standard_normal(9),
            "emb": rng.standard_normal((6, 4)).astype(ml_dtypes.bfloat16),
            "q": rng.integers(0, 255, 10, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn),
            "mask": rng.random((5, 3)) > 0.5,
            "counts": rng.integers(-2**40, 2**40, 12, dtype=np.int64),
            "u16": np.arange(7, dtype=np.uint16),
            "c": (rng.standard_normal(3) + 1j).astype(np.complex64),
            "half": np.linspace(-2, 2, 5, dtype=np.float16),
        },
        "big": rng.standard_normal((40, 7)).astype(np.float32),  # many chunks (chunk_bytes)
        "opt": {
            "steps": {0: np.arange(3, dtype=np.int32), 10: np.arange(4, dtype=np.int32),
                      -3: np.zeros(2, dtype=np.int8)},
            "lr": 0.2, "betas": (0.9, 0.999), "history": [1, 2.5, None, True, "x", np.arange(2)],
        },
        "blob": b"bytes\x00\xff",
        "scalar": np.float64(1.5),
        "zero_d": np.array(7, dtype=np.int16),
        "empty": np.zeros((0, 4), dtype=np.float32),
        "epoch": 3, "name": "run-\u00e9\u4e2d", "inf": float("inf"), "nan": float("nan"),
    }


def _object_keys(doc):
    """Top-level keys whose subtree holds a framework object (not restorable into a dict)."""
    return sorted(k for k, node in doc["tree"]["items"].items()
                  if any(n.get("type") == "object" for n, _ in _nodes(node)))


def make_source(name: str, path: Path, base: Path = None) -> Source:
    """``sealed``: the manifest has a checksum (format version 2 and later), or was written by
    this uckpt (which must protect what it writes). ``base``: the checkpoint its ``bases``
    name (``step_00000001``)."""
    data = (path / MANIFEST).read_bytes()
    doc = manifest_doc(data, path)
    sealed = name == "fresh" or doc["format_version"] >= 2
    declared = sum(f["size"] for f in doc["files"].values())
    return Source(name, path, data, doc, sealed, _object_keys(doc), declared, base=base)


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture(scope="module")
def fresh(fuzz_dir):
    path = uckpt.save(fuzz_dir / "sources" / "fresh", fresh_state(), step=7,
                      metadata={"purpose": "fuzz", "nested": {"k": [1, 2, "\u00e9"]}},
                      options=uckpt.SaveOptions(chunk_bytes=160))
    assert len(manifest_doc((path / MANIFEST).read_bytes())["arrays"]["big"]["chunks"]) > 5
    return path


@pytest.fixture(scope="module")
def worker(fuzz_dir, fresh):
    warm = fuzz_dir / "warm"
    for step in ("step_00000001", "step_00000002"):
        shutil.copytree(fresh, warm / step)
    w = Worker(warm, fuzz_dir / "worker.log")
    yield w
    w.close()


def golden_dirs():
    """Every golden checkpoint: the pre-release ones (``golden_v*``), those of format 1.0
    (``sharded`` has parts) and the second step of 1.0's ``chain`` (it has a base)."""
    data = REPO / "tests" / "data"
    return sorted(p.parent for pattern in ("golden_v*/*/", "golden_1.0/*/", "golden_1.0/chain/*2/")
                  for p in data.glob(pattern + MANIFEST))


@pytest.fixture(scope="module")
def sources(fuzz_dir, fresh, worker):
    """name -> Source, each with its intact results established."""
    out = {"fresh": make_source("fresh", fresh)}
    for g in golden_dirs():
        name = str(g.relative_to(REPO / "tests" / "data"))
        copy_ = shutil.copytree(g, fuzz_dir / "sources" / name)
        base = next(iter(manifest_doc((g / MANIFEST).read_bytes(), g).get("bases", {})), None)
        if base is not None:
            base = shutil.copytree(g.parent / base, copy_.parent / base)  # its sibling
        out[name] = make_source(name, copy_, base)
    for s in out.values():
        establish(worker, s, fuzz_dir / "establish")
    return out


def test_sources_read_back_exactly(sources, fresh):
    """The fresh source loads as saved; every golden one is there (1.0's with parts and with
    a base among them); re-sealing an intact
    manifest's JSON gives its bytes back (the oracle relies on all three)."""
    assert fingerprint(uckpt.load(fresh)) == fingerprint(fresh_state())
    assert sources["fresh"].expected["load"]["fp"] == fingerprint(fresh_state())
    assert any(name.startswith("golden_v1/") for name in sources), sorted(sources)
    assert sources["golden_1.0/sharded"].raw["parts"], "no source with manifest parts"
    assert sources["golden_1.0/chain/step_00000002"].fallback is not None, "no source with a base"
    for source in sources.values():
        assert is_sealed(source.manifest) == (source.doc["format_version"] >= 2), source.name
    data = sources["fresh"].manifest
    assert is_sealed(data), "this uckpt writes no manifest checksum"
    text = data[:data.rindex(b',"manifest_checksum":')] + b"}"
    assert seal_manifest(text, data) == data
    assert stale_seal(text, data) == data


def test_the_harness_catches_hangs_errors_memory_and_crashes(sources, worker, fuzz_dir):
    """The oracle flags what the suite is for, whatever the state of the code under test."""
    case = Case(sources["fresh"], "selftest", "either", "either")
    target = fuzz_dir / "selftest"
    target.mkdir()
    expect = {"hang": "hangs", "allocate": "peak memory", "raise": "IndexError: an error "
              "outside the UckptError hierarchy", "crash": "the worker process died"}
    for what, text in expect.items():
        req = {"op": "selftest", "what": what, "dir": str(target), "root": str(target),
               "pristine": str(sources["fresh"].path), "skip": [], "declared": 1 << 20,
               "seconds": 1.0}
        problems = judge(case, "load", {"load": worker.call(req)})
        assert any(text in p for p in problems), (what, problems)
    # a silent change of a value, and a success where a failure was due
    intact = {"status": "ok", "peak": 0, "result": dict(sources["fresh"].expected["load"])}
    changed = dict(intact, result={"fp": dict(intact["result"]["fp"], **{"/'epoch'": "int 4"})})
    assert "silent corruption" in judge(case, "load", {"load": changed})[0]
    assert "damaged" in judge(Case(case.source, "x", "fail", "ok"), "load", {"load": intact})[0]


# --- mutations of bytes -------------------------------------------------------------------------
@st.composite
def byte_edit(draw, data: bytes, kinds):
    """(description, new bytes) of one random edit of ``data``."""
    n = len(data)
    kind = draw(st.sampled_from([k for k in kinds if n or k in ("insert", "extend")]))
    if kind == "flip":
        i, mask = draw(st.integers(0, n - 1)), draw(st.integers(1, 255))
        return f"byte {i} xor 0x{mask:02x}", data[:i] + bytes([data[i] ^ mask]) + data[i + 1:]
    if kind == "insert":
        i, b = draw(st.integers(0, n)), draw(st.binary(min_size=1, max_size=8))
        return f"{b.hex()} inserted at {i}", data[:i] + b + data[i:]
    if kind == "delete":
        i = draw(st.integers(0, n - 1))
        k = draw(st.integers(1, min(8, n - i)))
        return f"{k} byte(s) deleted at {i}", data[:i] + data[i + k:]
    if kind == "truncate":
        k = draw(st.integers(0, n - 1))
        return f"truncated to {k} of {n} bytes", data[:k]
    if kind == "overwrite":
        i, b = draw(st.integers(0, n - 1)), draw(st.binary(min_size=1, max_size=16))
        return f"{b.hex()} written at {i}", data[:i] + b + data[i + len(b):]
    if kind == "extend":
        b = draw(st.binary(min_size=1, max_size=64))
        return f"{len(b)} byte(s) appended", data + b
    return "emptied", b""


DATA_EDITS = ("flip", "flip", "insert", "delete", "truncate", "overwrite", "extend", "empty")
MANIFEST_EDITS = ("flip", "flip", "flip", "insert", "delete", "truncate", "overwrite")


def data_verdicts(source: Source, name: str, old: bytes, new: bytes):
    """(verdict of the operations reading every array, of in-place restores, which skip
    ``source.skip``): "ok" when every chunk they read is intact and the file's size is as
    recorded; "fail" when a chunk they read changed or the size differs (a file longer
    than recorded is damage too, docs/format.md section 9), except that a restore that
    may not open the file at all gets "either" for bytes added past its end."""
    size = source.doc["files"][name]["size"]
    if len(new) < size:
        return "fail", "fail"
    damaged = {p for p, a in source.doc["arrays"].items() for c in a["chunks"]
               if c["file"] == name and not c.get("base")  # (a base's file is another)
               and new[c["offset"]:c["offset"] + c["length"]]
               != old[c["offset"]:c["offset"] + c["length"]]}
    whole = "ok" if len(new) == size else "either"
    if not damaged:
        return ("ok" if whole == "ok" else "fail"), whole
    items = source.doc["tree"]["items"]
    read = set().union(*(_arrays_under(n) for k, n in items.items() if k not in source.skip))
    return "fail", ("fail" if damaged & read else whole)


def _writer(name: str, data: bytes):
    def mutate(d: Path) -> None:
        (d / name).write_bytes(data)
    return mutate


def test_data_file_mutations(sources, worker, fuzz_dir):
    """A damaged chunk or a short file is refused by whatever reads it (and the manager
    falls back); damage outside every chunk read changes nothing."""
    problems = []

    @fuzz_settings(120)
    @given(st.data())
    def run(data):
        source = data.draw(st.sampled_from(sorted(sources.values(), key=lambda s: s.name)))
        name = data.draw(st.sampled_from(sorted(source.doc["files"])))
        old = (source.path / name).read_bytes()
        desc, new = data.draw(byte_edit(old, DATA_EDITS))
        verdict, partial = data_verdicts(source, name, old, new)
        case = Case(source, f"{name}: {desc}", verdict, "ok", partial=partial)
        problems.extend(run_case(worker, case, _writer(name, new), fuzz_dir / "case"))

    run()
    check(problems)


def manifest_cases(source: Source, desc: str, text: bytes):
    """(case, manifest bytes) to run for an edited manifest's JSON ``text`` (no checksum
    member): with the old checksum (a sealed source must refuse any change), and
    re-sealed (the parser behind the integrity check is reached)."""
    stale = stale_seal(text, source.manifest)
    if stale == source.manifest:
        return [(Case(source, desc + " (no change)", "ok", "ok"), stale)]
    verdict = "fail" if source.sealed else "weak"
    out = [(Case(source, desc, verdict, verdict), stale)]
    sealed = seal_manifest(text, source.manifest)
    if sealed != stale and sealed != source.manifest:
        out.append((Case(source, desc + ", re-sealed", "weak", "weak"), sealed))
    return out


def run_manifest_cases(worker, source, desc, text, workdir):
    problems = []
    for case, data in manifest_cases(source, desc, text):
        problems += run_case(worker, case, _writer(MANIFEST, data), workdir)
    return problems


def _is_1_0(source: Source) -> bool:
    return source.raw["format_version"] == "1.0"


def _part_files(source: Source):
    """The manifest parts a format-1.0 source lists (none for the others)."""
    return [e["file"] for e in source.raw["parts"]] if _is_1_0(source) else []


def test_manifest_byte_mutations(sources, worker, fuzz_dir):
    """Any changed byte of a checksummed manifest or of a manifest part is refused by every
    operation (a part naming itself; the manager falls back); an unchecked (version 1)
    manifest is read as the spec's reader reads it."""
    problems = []

    @fuzz_settings(200)
    @given(st.data())
    def run(data):
        source = data.draw(st.sampled_from(sorted(sources.values(), key=lambda s: s.name)))
        name = data.draw(st.sampled_from([MANIFEST] + _part_files(source)))
        old = (source.path / name).read_bytes()
        desc, new = data.draw(byte_edit(old, MANIFEST_EDITS))
        verdict = "ok" if new == old else "fail" if source.sealed else "weak"
        case = Case(source, f"{name}: {desc}", verdict, verdict,
                    names=name if name != MANIFEST and verdict == "fail" else None)
        problems.extend(run_case(worker, case, _writer(name, new), fuzz_dir / "case"))

    run()
    check(problems)


# --- mutations of the manifest's JSON -----------------------------------------------------------
def _nested(children):
    return st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children,
                                                             max_size=3)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
    | st.sampled_from([2**63, 2**64, -2**63 - 1, 1e308, -0.0]), _nested, max_leaves=6)


HUGE = [2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64, -2**63 - 1, 10**30, Raw("1" + "0" * 5000),
        Raw("-" + "9" * 5000)]


def locations(doc, path="$"):
    """(container, key, path) of every value below the top-level object."""
    items = doc.items() if isinstance(doc, dict) else enumerate(doc)
    for k, v in items:
        here = f"{path}[{k!r}]"
        yield doc, k, here
        if isinstance(v, (dict, list)):
            yield from locations(v, here)


@st.composite
def json_edit(draw, doc):
    """(description, JSON text) of one structured edit of a manifest document."""
    doc = copy.deepcopy(doc)
    region = draw(st.sampled_from(["anywhere", "anywhere", "value nodes", "metadata"]
                                  + ["table"] * 2 * ("table" in doc)))
    if region == "table":  # a version-6 table as written (docs/format-legacy.md)
        spots = [(doc, "table", "$.table")] + list(locations(doc["table"], "$.table"))
    elif region == "value nodes":  # edits that can keep the manifest valid
        spots = [(n, "value", f"{p}.value") for n, p in _nodes(doc["tree"])
                 if n.get("type") == "value"]
    elif region == "metadata":
        spots = [(doc, "metadata", "$.metadata")] + list(locations(doc["metadata"], "$.metadata"))
    else:
        spots = list(locations(doc))
    parent, key, where = draw(st.sampled_from(spots or list(locations(doc))))
    old = parent[key]
    kinds = ["retype", "huge", "negative", "surrogate", "deep", "delete"]
    if key == "dtype":
        kinds += ["dtype", "dtype"]
    if isinstance(old, dict) and old:
        kinds += ["extra_key", "duplicate_key", "rename_key", "delete_key"]
    elif isinstance(old, dict):
        kinds.append("extra_key")
    if isinstance(old, list) and old:
        kinds += ["drop_item", "repeat_item"]
    kind = draw(st.sampled_from(kinds))
    if kind == "retype":
        parent[key] = draw(JSON_VALUES.filter(lambda v: type(v) is not type(old)))
    elif kind == "dtype":  # another valid name; of the same item size, the layout still fits
        same = [n for n in dtypes.NAMES if old in dtypes.NAMES
                and dtypes.itemsize(n) == dtypes.itemsize(old)]
        parent[key] = draw(st.sampled_from(same or list(dtypes.NAMES))
                           | st.sampled_from(dtypes.NAMES))
    elif kind == "huge":
        parent[key] = draw(st.sampled_from(HUGE))
    elif kind == "negative":
        parent[key] = -old - 1 if type(old) is int else -1
    elif kind == "surrogate":
        text = old if isinstance(old, str) else ""
        i = draw(st.integers(0, len(text)))
        parent[key] = text[:i] + draw(st.sampled_from(["\ud800", "\udfff", "\udc80x"])) + text[i:]
    elif kind == "deep":
        depth = draw(st.sampled_from([50, 1000, 100_000]))
        parent[key] = Raw("[" * depth + "0" + "]" * depth)
    elif kind == "delete":
        del parent[key]
    elif kind == "extra_key":
        old[draw(st.text(max_size=6))] = draw(JSON_VALUES)
    elif kind in ("duplicate_key", "rename_key", "delete_key"):
        k = draw(st.sampled_from(list(old)))
        if kind == "delete_key":
            del old[k]
        elif kind == "rename_key":
            new = draw(st.text(max_size=6) | st.sampled_from(["\ud800", "a\udc00", "", "-0", "01"]))
            parent[key] = {(new if name == k else name): v for name, v in old.items()}
        else:
            dup = Dup({k: old[k], **{n: v for n, v in old.items() if n != k}})
            dup.dup_value = draw(st.just(old[k]) | JSON_VALUES)
            parent[key] = dup
    elif kind == "drop_item":
        del old[draw(st.integers(0, len(old) - 1))]
    else:
        old.append(old[draw(st.integers(0, len(old) - 1))])
    return f"{kind} at {where}"[:160], dumps(doc).encode()


def _files_writer(files):
    def mutate(d: Path) -> None:
        for name, data in files.items():
            (d / name).write_bytes(data)
    return mutate


def run_10_cases(worker, source, desc, text, parts, same, workdir):
    """The cases of an edit of a format-1.0 root's JSON ``text`` and of its ``parts`` (file
    -> new bytes; the root's entries updated to them): the root re-sealed (the parser: a
    UckptError or a load the spec's reader agrees with; ``same``: an equivalent
    checkpoint, which loads exactly as saved), with its stale checksum (refused), and
    the edited parts under the intact root (refused, naming the part)."""
    problems = []
    stale, sealed = stale_seal(text, source.manifest), seal_manifest(text, source.manifest)
    if sealed == source.manifest and not parts:
        return run_case(worker, Case(source, desc + " (no change)", "ok", "ok"),
                        _writer(MANIFEST, sealed), workdir)
    if same:
        case = Case(source, desc + ", re-sealed", "ok", "weak", overrides={"verify": "weak"})
    else:
        case = Case(source, desc + ", re-sealed", "weak", "weak")
    problems += run_case(worker, case, _files_writer({**parts, MANIFEST: sealed}), workdir)
    if stale != source.manifest:
        problems += run_case(worker, Case(source, desc, "fail", "fail"),
                             _files_writer({**parts, MANIFEST: stale}), workdir)
    for name, data in parts.items():
        problems += run_case(worker, Case(source, f"{desc}, under the intact root", "fail",
                                          "fail", names=name), _writer(name, data), workdir)
    return problems


def test_manifest_json_mutations(sources, worker, fuzz_dir):
    """Structured edits, with the stale checksum (refused) and re-sealed (the parser: a
    UckptError, or a load the spec's reader agrees with). A format-1.0 checkpoint is
    edited as written, half the time by edits that know the format (fuzz_format10.py):
    its chunk tables (root and parts), codecs, array table, parts and extensions."""
    problems = []

    @fuzz_settings(250)
    @given(st.data())
    def run(data):
        family = data.draw(st.sampled_from(["1.0", "legacy"]))
        source = data.draw(st.sampled_from(sorted(
            (s for s in sources.values() if _is_1_0(s) == (family == "1.0")),
            key=lambda s: s.name)))
        if family == "1.0":  # the document as written; half the edits know the format
            if data.draw(st.booleans()):
                desc, text, parts, same = data.draw(edit_10(source.raw, source.path))
            else:
                (desc, text), parts, same = data.draw(json_edit(source.raw)), {}, False
            problems.extend(run_10_cases(worker, source, desc, text, parts, same,
                                         fuzz_dir / "case"))
            return
        doc = source.doc  # (grids and table listed as chunks)
        if "table" in source.raw:  # half the edits of a tabled manifest hit it as written
            doc = data.draw(st.sampled_from([doc, source.raw]))
        desc, text = data.draw(json_edit(doc))
        problems.extend(run_manifest_cases(worker, source, desc, text, fuzz_dir / "case"))

    run()
    check(problems)


# --- the same checkpoint, described differently ------------------------------------------------
@st.composite
def reslab(draw, source: Source):
    """(description, JSON text): some raw chunks cut into slabs along their first axis (each
    still one run of bytes, with its own checksum), every array's chunks and the arrays
    listed in random order (a format-1.0 source's as 1.0 rows of its root's table, its
    parts dropped). The same values, another valid manifest."""
    doc, cuts = copy.deepcopy(source.doc), 0
    for a in doc["arrays"].values():
        chunks = []
        for c in a["chunks"]:
            rows = c["shape"][0] if c["shape"] else 0
            if (rows < 2 or c["codec"] != "raw" or c.get("base")  # a frame is whole
                    or not draw(st.booleans())):
                chunks.append(c)
                continue
            bounds = sorted(draw(st.sets(st.integers(1, rows - 1), min_size=1, max_size=4)))
            row = c["length"] // rows
            for lo, hi in zip([0] + bounds, bounds + [rows]):
                off, n = c["offset"] + lo * row, (hi - lo) * row
                chunks.append(dict(c, start=[c["start"][0] + lo] + c["start"][1:],
                                   shape=[hi - lo] + c["shape"][1:], offset=off, length=n,
                                   checksum=_crc(source.path, c, off, n)))
                if "hash" in c:
                    chunks[-1]["hash"] = _content_hash(source.path, c, off, n)
            cuts += len(bounds)
        a["chunks"] = draw(st.permutations(chunks))
    doc["arrays"] = dict(draw(st.permutations(list(doc["arrays"].items()))))
    _merkle_roots(doc)
    if _is_1_0(source):  # written as 1.0: every chunk in the root
        doc = as_1_0(doc, source.raw)
    return f"{cuts} cut(s) into slabs, chunks and arrays reordered", dumps(doc).encode()


def test_equivalent_manifests_load_the_same(sources, worker, fuzz_dir):
    """Re-chunked and reordered (and re-sealed), a checkpoint reads back exactly as saved:
    data operations must succeed with the saved values; what reads only the manifest
    (and ``uckpt.verify``, which returns it) sees another manifest."""
    problems = []

    @fuzz_settings(50)
    @given(st.data())
    def run(data):
        source = data.draw(st.sampled_from(sorted(sources.values(), key=lambda s: s.name)))
        desc, text = data.draw(reslab(source))
        case = Case(source, desc, "ok", "weak", overrides={"verify": "weak"})
        new = seal_manifest(text, source.manifest)
        problems.extend(run_case(worker, case, _writer(MANIFEST, new), fuzz_dir / "case"))

    run()
    check(problems)


# --- hand-made hostile manifests ----------------------------------------------------------------
def huge_shape(n):
    def edit(doc, directory):
        a = doc["arrays"][_target_array(doc)]
        c, item = a["chunks"][0], dtypes.itemsize(a["dtype"])
        a["shape"] = [n]
        a["chunks"] = [dict(c, start=[0], shape=[n], length=item * n)]
        entry = doc["files"][c["file"]]
        entry["size"] = max(entry["size"], c["offset"] + item * n)
        return doc
    return edit


def many_dims(d):
    def edit(doc, directory):
        a = doc["arrays"][_target_array(doc)]
        c, item = a["chunks"][0], dtypes.itemsize(a["dtype"])
        a["shape"] = [1] * d
        a["chunks"] = [dict(c, start=[0] * d, shape=[1] * d, length=item,
                            checksum=_crc(directory, c, c["offset"], item))]
        return doc
    return edit


def overflowing_boxes(doc, directory):
    """Two chunks tiling 2**64 elements exactly: coordinates past int64."""
    a = doc["arrays"][_target_array(doc)]
    c, item = a["chunks"][0], dtypes.itemsize(a["dtype"])
    a["shape"] = [2**64]
    a["chunks"] = [dict(c, start=[s], shape=[2**63], length=item * 2**63) for s in (0, 2**63)]
    doc["files"][c["file"]]["size"] = 2**70
    return doc


def empty_but_huge(shape):
    """No element, but more than NumPy can address if the zero is left out."""
    def edit(doc, directory):
        a = doc["arrays"][_target_array(doc)]
        a["shape"] = list(shape)
        a["chunks"] = [dict(a["chunks"][0], start=[0] * len(shape), shape=list(shape), length=0)]
        return doc
    return edit


def one_chunk_per_element(overlap: bool):
    """The target array cut into single elements (correct checksums); ``overlap``: the
    second element's box moved onto the first (same volume, one gap)."""
    def edit(doc, directory):
        a = doc["arrays"][_target_array(doc)]
        item, chunks = dtypes.itemsize(a["dtype"]), []
        for c in a["chunks"]:
            for k, idx in enumerate(np.ndindex(*c["shape"])):
                start = [s + i for s, i in zip(c["start"], idx)]
                off = c["offset"] + k * item
                chunks.append(dict(c, start=start, shape=[1] * len(idx), offset=off, length=item,
                                   checksum=_crc(directory, c, off, item)))
        if overlap:
            chunks[1]["start"] = list(chunks[0]["start"])
        a["chunks"] = chunks
        return doc
    return edit


def _int_keyed(node):
    if node.get("type") == "dict":
        if node.get("key_type") == "int" and node["items"]:
            return node
        for child in node["items"].values():
            found = _int_keyed(child)
            if found:
                return found
    return None


def int_key(digits):
    def edit(doc, directory):
        node = _int_keyed(doc["tree"])
        if node is None:
            node = doc["tree"]["items"]["fuzz"] = {"type": "dict", "key_type": "int",
                                                   "items": {"1": {"type": "value", "value": 1}}}
        first = next(iter(node["items"]))
        node["items"] = {("1" + "0" * (digits - 1) if k == first else k): v
                         for k, v in node["items"].items()}
        return doc
    return edit


def int_keys_as_str(doc, directory):
    """An int-keyed dict of the saved state described as str-keyed ("0", "10", ...)."""
    node = _int_keyed(doc["tree"])
    if node is not None:
        del node["key_type"]
    return doc


def surrogate_in(where):
    def edit(doc, directory):
        if where == "generator":
            doc["generator"] = "uckpt \ud800"
        elif where == "metadata":
            doc["metadata"]["s\udc80"] = "\ud800"
        elif where == "key":
            items = doc["tree"]["items"]
            first = next(iter(items))
            doc["tree"]["items"] = {(k + "\ud800" if k == first else k): v
                                    for k, v in items.items()}
        elif where == "array_path":
            path = _target_array(doc)
            new = path + "\udfff"
            doc["arrays"] = {(new if p == path else p): v for p, v in doc["arrays"].items()}
            text = json.dumps(doc["tree"]).replace(json.dumps(path), json.dumps(new))
            doc["tree"] = json.loads(text)
        else:  # a value node
            doc["tree"]["items"]["fuzz"] = {"type": "value", "value": "a\ud800b"}
        return doc
    return edit


def deep_tree(depth):
    def edit(doc, directory):
        node = {"type": "value", "value": 1}
        head, tail = '{"type":"dict","items":{"d":', "}}"
        doc["tree"]["items"]["deep"] = Raw(head * depth + dumps(node) + tail * depth)
        return doc
    return edit


def duplicate_step(doc, directory):
    d = Dup({"step": 1, **{k: v for k, v in doc.items() if k != "step"}})
    d.dup_value = 2
    return d


def duplicate_tree_key(doc, directory):
    items = doc["tree"]["items"]
    first = next(iter(items))
    d = Dup(items)
    d.dup_value = {"type": "value", "value": "other"}
    doc["tree"]["items"] = d
    assert next(iter(d)) == first
    return doc


def extra_field(where):
    def edit(doc, directory):
        if where == "top":
            doc["fuzz"] = 1
        elif where == "chunk":
            doc["arrays"][_target_array(doc)]["chunks"][0]["fuzz"] = 1
        else:
            doc["tree"]["items"][next(iter(doc["tree"]["items"]))]["fuzz"] = 1
        return doc
    return edit


def set_field(*path_and_value):
    *path, value = path_and_value

    def edit(doc, directory):
        node = doc
        for p in path[:-1]:
            node = node[p] if p != "<first>" else node[next(iter(node))]
        node[path[-1]] = value
        return doc
    return edit


HOSTILE = {
    **{f"shape of {n} elements": huge_shape(n)
       for n in (2**26, 2**31, 2**40, 2**61 - 1, 2**62, 2**63, 2**64, 10**30)},
    **{f"{d} dimensions": many_dims(d) for d in (32, 64, 65, 1000)},
    "2 chunks past int64": overflowing_boxes,
    **{f"shape {list(shape)}": empty_but_huge(shape)
       for shape in ((0, 2**64), (0, 2**63 - 1), (2**62, 0, 2**62), (0, 2**40, 2**40))},
    "one chunk per element": one_chunk_per_element(False),
    "one chunk per element, two overlapping": one_chunk_per_element(True),
    **{f"int key of {n} digits": int_key(n) for n in (4300, 4301, 5000, 100_000)},
    "int keys described as str keys": int_keys_as_str,
    **{f"lone surrogate in {w}": surrogate_in(w)
       for w in ("generator", "metadata", "key", "array_path", "value")},
    **{f"tree {n} levels deep": deep_tree(n) for n in (198, 201, 5000, 100_000)},
    "duplicate top-level key": duplicate_step,
    "duplicate tree key": duplicate_tree_key,
    **{f"extra field in {w}": extra_field(w) for w in ("top", "chunk", "node")},
    "file size 2**64": set_field("files", "<first>", "size", 2**64),
    "step 2**64": set_field("step", 2**64),
    "step -1": set_field("step", -1),
    "world_size 2**64": set_field("world_size", 2**64),
    "format_version 2**64": set_field("format_version", 2**64),
    "format_version 10**5000": set_field("format_version", Raw("1" + "0" * 5000)),
}


#: members of a format-1.0 root that :func:`as_1_0` rebuilds from the edited chunk lists
_REBUILT = ("arrays", "merkle_root")


def hostile_1_0(edited, source: Source):
    """The hostile edit ``edited`` of a format-1.0 source's chunk-list rendering, written as
    a 1.0 root (in its members' order, every chunk in the root's table): its arrays as
    1.0's array and chunk tables, every other member as edited (one removed, added or
    duplicated, a changed ``format_version``)."""
    root = as_1_0(edited, source.raw)
    carried = {k: v for k, v in edited.items()
               if k not in _REBUILT and (k in source.raw or k not in source.doc)}
    if carried.get("format_version") == source.doc["format_version"]:
        carried["format_version"] = source.raw["format_version"]  # the rendering's number
    out = {k: v if k in _REBUILT else carried.pop(k, v) for k, v in root.items()
           if k in _REBUILT or k in carried or k not in source.doc}
    out.update(carried)  # members the edit added
    if not isinstance(edited, Dup):
        return out
    first = next(iter(edited))
    dup = Dup({first: out.pop(first), **out})
    dup.dup_value = edited.dup_value
    return dup


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_manifests(sources, worker, fuzz_dir, name):
    """Manifests made to overflow, exhaust or confuse the reader, stale and re-sealed: in
    format 1.0 (as this uckpt writes it) and in versions 1 and 2."""
    problems = []
    for name_ in ("fresh", "golden_v1/sharded", "golden_v2/sharded"):
        source = sources[name_]
        edited = HOSTILE[name](copy.deepcopy(source.doc), source.path)
        if _is_1_0(source):
            edited = hostile_1_0(edited, source)
        text = dumps(edited).encode()
        problems += run_manifest_cases(worker, source, name, text, fuzz_dir / "case")
    check(problems)


# --- decompression bombs and oversized declarations ---------------------------------------------
BOMB_KINDS = ("valid", "half", "header lies")


def bomb(raw: int, dtype: str, codec: str, kind: str):
    """The target array of the fresh source replaced by one compressed chunk of ``raw``
    zero bytes of ``dtype`` (a frame of 128 KiB RLE blocks appended to its data file):
    ``valid``; ``half``: the frame holds half what it declares, padded to its length;
    ``header lies``: the manifest declares half the frame's content."""
    from bombs import rle_frame, zeros_hash

    def mutate(source: Source, d: Path) -> bytes:
        frame = rle_frame(raw)
        if kind == "half":
            half = rle_frame(raw, raw // (1 << 17) // 2)
            frame = half + bytes(len(frame) - len(half))
        doc = copy.deepcopy(source.doc)
        path = _target_array(doc)
        a, item = doc["arrays"][path], dtypes.itemsize(dtype)
        data = d / a["chunks"][0]["file"]
        at = -(-data.stat().st_size // 64) * 64
        with open(data, "r+b") as f:
            f.seek(at)
            f.write(frame)
        size = raw // 2 if kind == "header lies" else raw
        a["dtype"], a["shape"] = dtype, [size // item]
        a["chunks"] = [dict(a["chunks"][0], offset=at, length=len(frame), start=[0],
                            shape=[size // item], codec=codec,
                            checksum=f"crc32c:{crc32c.crc32c(frame):08x}",
                            hash=zeros_hash(size))]
        doc["files"][a["chunks"][0]["file"]]["size"] = at + len(frame)
        _merkle_roots(doc)
        return seal_manifest(dumps(doc).encode(), source.manifest)
    return mutate


def test_decompression_bombs(sources, worker, fuzz_dir):
    """A chunk of a few KB declaring up to 64 MiB: every streaming operation stays within
    its constant bound, a load within what it declares (or is refused with a
    MemoryLimitError), and nothing raises outside uckpt.errors."""
    problems = []
    source = sources["fresh"]

    @fuzz_settings(6)
    @given(st.sampled_from(BOMB_KINDS), st.sampled_from([1, 16, 64]),
           st.sampled_from([("uint8", "zstd"), ("float32", "zstd+bytegroup"),
                            ("float64", "zstd+bytegroup")]))
    def run(kind, mib, how):
        make = bomb(mib << 20, *how, kind)

        def mutate(d: Path) -> None:
            (d / MANIFEST).write_bytes(make(source, d))

        case = Case(source, f"{kind} bomb of {mib} MiB, {how[0]} {how[1]}",
                    "weak" if kind == "valid" else "fail", "weak")
        problems.extend(run_case(worker, case, mutate, fuzz_dir / "case"))

    run()
    check(problems)


# --- directory entries --------------------------------------------------------------------------
def _modes_bite() -> bool:
    """Whether a file without permissions is unreadable here: not for root (euid 0 with
    CAP_DAC_OVERRIDE, as in CI), which reads files whatever their mode."""
    with tempfile.TemporaryDirectory() as d:
        probe = Path(d) / "probe"
        probe.write_bytes(b"x")
        probe.chmod(0)
        try:
            probe.read_bytes()
        except PermissionError:
            return True
        return False


MODES_BITE = _modes_bite()


def replace_with(kind: str, name: str):
    """A mutation replacing entry ``name`` of the checkpoint directory by ``kind``."""
    def mutate(d: Path) -> None:
        p = d / name
        original = p.read_bytes()
        p.unlink()
        if kind == "fifo":
            os.mkfifo(p)
        elif kind == "directory":
            p.mkdir()
            (p / "x").write_bytes(original)
        elif kind == "socket":
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            cwd = os.getcwd()
            os.chdir(d)  # a socket's path is limited to 108 bytes
            try:
                s.bind(name)
            finally:
                os.chdir(cwd)
                s.close()
        elif kind == "dev_zero":
            p.symlink_to("/dev/zero")
        elif kind == "dev_null":
            p.symlink_to("/dev/null")
        elif kind == "outside":  # an exact copy, outside the checkpoint
            (d.parent.parent / f"outside-{name}").write_bytes(original)
            p.symlink_to(d.parent.parent / f"outside-{name}")
        elif kind == "inside":  # an exact copy, under another name in the checkpoint
            (d / f"copy-{name}").write_bytes(original)
            p.symlink_to(f"copy-{name}")
        elif kind == "loop":
            p.symlink_to(name)
        elif kind == "dangling":
            p.symlink_to("no-such-file")
        elif kind == "unreadable":
            p.write_bytes(original)
            p.chmod(0)
        else:
            raise ValueError(kind)
    return mutate


ENTRY_KINDS = ("fifo", "directory", "socket", "dev_zero", "dev_null", "outside", "inside",
               "loop", "dangling", "unreadable")


@pytest.mark.parametrize("name", [MANIFEST, DATA0, PART0])
@pytest.mark.parametrize("kind", ENTRY_KINDS)
def test_directory_entries(sources, worker, fuzz_dir, kind, name):
    """A checkpoint's manifest, manifest part (of golden_1.0/sharded) or data file replaced
    by something that is not a regular file of the checkpoint: refused (naming it), and
    the manager falls back. A file without permissions is refused too, unless this
    process can read it anyway (root)."""
    bad = "ok" if kind == "unreadable" and not MODES_BITE else "fail"
    source = sources["golden_1.0/sharded" if name == PART0 else "fresh"]
    case = Case(source, f"{name} replaced by {kind}", bad,
                bad if name != DATA0 else "ok", names=name)
    check(run_case(worker, case, replace_with(kind, name), fuzz_dir / "case"))


def _extra_entries(d: Path) -> None:
    (d / "notes.txt").write_text("not part of the checkpoint")
    (d / "sub").mkdir()
    (d / ".hidden").write_bytes(b"\0" * 10)
    os.mkfifo(d / "unlisted-fifo")
    (d / "data-00009.bin").symlink_to("/dev/zero")


def _as_symlink(d: Path) -> None:
    outside = d.parent.parent / "real-checkpoint"
    d.rename(outside)
    d.symlink_to(outside)


def _as(kind: str):
    def mutate(d: Path) -> None:
        shutil.rmtree(d)
        if kind == "file":
            d.write_bytes(b"{}")
        elif kind == "fifo":
            os.mkfifo(d)
        elif kind == "loop":
            d.symlink_to(d.name)
        else:
            d.symlink_to("/dev/zero")
    return mutate


def _locked(d: Path) -> None:
    d.chmod(0)


CHECKPOINT_KINDS = {
    # kind: (mutation, verdict for data and manifest operations)
    "unknown extra entries": (_extra_entries, "ok"),
    "a symlink to an intact copy": (_as_symlink, "either"),
    "a regular file": (_as("file"), "fail"),
    "a FIFO": (_as("fifo"), "fail"),
    "a symlink to itself": (_as("loop"), "fail"),
    "a symlink to /dev/zero": (_as("dev_zero"), "fail"),
    "without permissions": (_locked, "fail" if MODES_BITE else "ok"),
}


@pytest.mark.parametrize("kind", sorted(CHECKPOINT_KINDS))
def test_checkpoint_directory_entries(sources, worker, fuzz_dir, kind):
    """``step_00000002`` itself replaced. What is not a directory is no checkpoint (the
    commit rule), so ``uckpt verify --all`` may pass over it."""
    mutate, verdict = CHECKPOINT_KINDS[kind]
    case = Case(sources["fresh"], f"the checkpoint directory: {kind}", verdict, verdict,
                names="step_00000002" if verdict == "fail" else None,
                overrides={"verify_all": "either"} if kind in ("a regular file", "a FIFO") else {})
    check(run_case(worker, case, mutate, fuzz_dir / "case"))


def _newer(kind: str):
    """An entry named like a newer step beside the intact step 2 in the root."""
    def mutate(d: Path) -> None:
        p = d.parent / "step_00000003"
        if kind == "fifo":
            os.mkfifo(p)
        elif kind == "file":
            p.write_bytes(b"")
        elif kind == "loop":
            p.symlink_to(p.name)
        elif kind == "dangling":
            p.symlink_to("nowhere")
        elif kind == "empty directory":
            p.mkdir()
        elif kind == "manifest FIFO":
            p.mkdir()
            os.mkfifo(p / MANIFEST)
        elif kind == "manifest directory":
            (p / MANIFEST).mkdir(parents=True)
        else:
            p.mkdir()
            (p / MANIFEST).symlink_to("/dev/zero")
    return mutate


@pytest.mark.parametrize("kind", ["fifo", "file", "loop", "dangling", "empty directory",
                                  "manifest FIFO", "manifest directory", "manifest /dev/zero"])
def test_odd_entries_in_the_root(sources, worker, fuzz_dir, kind):
    """The manager restores the intact step 2 past whatever step_00000003 is."""
    case = Case(sources["fresh"], f"step_00000003 in the root: {kind}", "ok", "ok",
                overrides={"verify_all": "either"})  # step 3 may count as damaged
    check(run_case(worker, case, _newer(kind), fuzz_dir / "case",
                   ops=("manager", "ls", "verify_all")))
