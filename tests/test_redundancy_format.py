"""Extension ``redundancy`` (docs/format.md 13.3) against its golden files:
golden_1.0/redundancy_xor and redundancy_partner (four ranks on three nodes, every node's
share and piece in one directory) read as usual by a reader that ignores the extension;
their records parsed; the streaming encoder writes the same pieces; each node's copy
wiped in turn is rebuilt from the others bit for bit; malformed records are refused."""
import copy
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import uckpt
from redundancy_common import opener, readers
from uckpt.errors import ManifestError
from uckpt.levels.protect import protect
from uckpt.levels.records import parse_records
from uckpt.levels.repair import repair

DATA = Path(__file__).resolve().parent / "data"
sys.path.insert(0, str(DATA))
import make_golden as golden  # noqa: E402

KINDS = {"redundancy_xor": "xor:3", "redundancy_partner": "partner"}


def doc_of(name):
    return json.loads((DATA / "golden_1.0" / name / "manifest.json").read_bytes())


def node_copies(tmp_path, name):
    """Each node's copy of the checkpoint: the manifest, its share, its piece."""
    src = DATA / "golden_1.0" / name
    records = parse_records(doc_of(name))
    dirs = []
    for node in records.nodes:
        d = tmp_path / node.name
        d.mkdir()
        for f in [*node.files, node.piece]:
            shutil.copyfile(src / f.name, d / f.name)
        shutil.copyfile(src / "manifest.json", d / "manifest.json")
        dirs.append(d)
    return records, dirs


@pytest.mark.parametrize("name", sorted(KINDS))
def test_golden_reads_as_usual(name):
    got = uckpt.load(DATA / "golden_1.0" / name)
    want = golden.redundancy_expected()
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k])


@pytest.mark.parametrize("name", sorted(KINDS))
def test_golden_records(name):
    records = parse_records(doc_of(name))
    assert str(records.scheme) == KINDS[name] and records.step == 5
    assert [(n.name, n.ranks) for n in records.nodes] == \
        [("node-a", (0, 1)), ("node-b", (2,)), ("node-c", (3,))]
    assert [f.name for f in records.nodes[0].files] == \
        ["data-00000.bin", "data-00001.bin", "manifest.part-00000.json",
         "manifest.part-00001.json"]
    assert parse_records(doc_of("part_roots")) is None  # no extension: no records


@pytest.mark.parametrize("name", sorted(KINDS))
def test_streaming_encoder_writes_the_golden_pieces(tmp_path, name):
    records, dirs = node_copies(tmp_path, name)
    for d, node in zip(dirs, records.nodes):
        (d / node.piece.name).unlink()
    nodes = [(n.name, n.ranks, [f.name for f in n.files]) for n in records.nodes]
    again = protect(records.scheme, nodes, readers(dirs), opener(dirs), step=5, block=10)
    assert again == records
    for d, node in zip(dirs, records.nodes):
        assert (d / node.piece.name).read_bytes() == \
            (DATA / "golden_1.0" / name / node.piece.name).read_bytes()


@pytest.mark.parametrize("name", sorted(KINDS))
def test_each_wiped_node_rebuilt_bit_for_bit(tmp_path, name):
    records, dirs = node_copies(tmp_path, name)
    for i, node in enumerate(records.nodes):
        for f in [*node.files, node.piece]:
            (dirs[i] / f.name).unlink()
        done = repair(records, readers(dirs), opener(dirs), block=16)
        assert (set(done.shares), set(done.pieces)) == ({i}, {i})
        for f in [*node.files, node.piece]:
            assert (dirs[i] / f.name).read_bytes() == \
                (DATA / "golden_1.0" / name / f.name).read_bytes()


def _bad(edit):
    doc = copy.deepcopy(doc_of("redundancy_xor"))
    edit(doc)
    return doc


def _set(path, value):
    def edit(doc):
        obj = doc
        for k in path[:-1]:
            obj = obj[k]
        obj[path[-1]] = value
    return edit


N = "redundancy:nodes"


@pytest.mark.parametrize("edit, member, words", [
    (_set(["extensions", "redundancy"], {"required": True}), "extensions['redundancy']",
     'must be {"required": false}'),
    (_set(["redundancy:scheme"], "xor:03"), "redundancy:scheme", 'must be "partner" or'),
    (_set(["redundancy:scheme"], "xor:1"), "redundancy:scheme", "at least 2 nodes"),
    (_set(["redundancy:scheme"], "rs:2+1"), "redundancy:scheme", 'must be "partner" or'),
    (lambda d: d[N].pop(), N, "the nodes hold 3 ranks, not world_size 4"),
    (lambda d: d.__setitem__(N, d[N][:1]), N, "at least 2 node entries"),
    (_set([N, 1, "name"], "node-a"), f"{N}[1].name", "given twice"),
    (_set([N, 1, "ranks"], [1]), f"{N}[1].ranks", "rank 1 is also on node 0"),
    (_set([N, 2, "ranks"], [9]), f"{N}[2].ranks", "not below world_size 4"),
    (_set([N, 1, "ranks"], [2, 2]), f"{N}[1].ranks", "ascending array of distinct"),
    (_set([N, 0, "piece", "size"], 270), f"{N}[0].piece.size", "the scheme gives 271"),
    (_set([N, 0, "piece", "name"], "redundancy-0.bin"), f"{N}[0].piece.name",
     "must be 'redundancy-00000.bin'"),
    (_set([N, 0, "piece", "checksum"], "crc32c:XYZ"), f"{N}[0].piece.checksum", "8 lowercase"),
    (_set([N, 0, "files", 0, "name"], "elsewhere.bin"), f"{N}[0].files[0]",
     "neither a data file nor a part"),
    (_set([N, 0, "files", 0, "size"], 95), f"{N}[0].files[0].size", "has size 96"),
    (lambda d: d[N][0]["files"].pop(0), f"{N}[0].files",
     "data file 'data-00000.bin' of rank 0 is not in the share"),
    (lambda d: d[N][1]["files"].append(d[N][0]["files"][2]), f"{N}[1].files[2]",
     "is in two shares"),
    (lambda d: d[N][0].pop("piece"), f"{N}[0]", "exactly name, ranks, files, piece"),
])
def test_malformed_records_refused(edit, member, words):
    with pytest.raises(ManifestError, match=r"13\.3") as e:
        parse_records(_bad(edit), "node-a/manifest.json")
    assert e.value.field == member and words in str(e.value)
    assert str(e.value).startswith(f"node-a/manifest.json: {member}: ")
