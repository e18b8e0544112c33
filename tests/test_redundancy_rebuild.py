"""Encode and rebuild (docs/format.md 13.3), pure: pieces as the spec says, every single
node lost rebuilt bit for bit, every damaged file found and rebuilt, and what cannot be
rebuilt refused with :class:`~uckpt.errors.ShareLostError` naming node, ranks and step."""
import itertools
import shutil

import pytest

from redundancy_common import make_nodes, opener, readers, spec_pieces
from uckpt.errors import CorruptCheckpointError, ShareLostError
from uckpt.levels.protect import protect
from uckpt.levels.repair import find_damage, repair
from uckpt.levels.scheme import parse_redundancy

# uneven sizes: node 0 holds two ranks' files, one node an empty file, one a tiny share
SIZES = [[130, 77], [301], [0, 5], [64], [199], [1], [250]]
LAYOUTS = [("partner", 2), ("partner", 3), ("partner", 7), ("xor:2", 3), ("xor:3", 5),
           ("xor:3", 7), ("xor:4", 4), ("xor:4", 6), ("xor:4", 2)]


def setup(tmp_path, spec, n, block=16):
    dirs, nodes = make_nodes(tmp_path, SIZES[:n])
    records = protect(parse_redundancy(spec), nodes, readers(dirs), opener(dirs), step=42,
                      block=block)
    snapshot = {d: {f.name: f.read_bytes() for f in d.iterdir()} for d in dirs}
    return dirs, records, snapshot


def same(dirs, snapshot):
    return all({f.name: f.read_bytes() for f in d.iterdir()} == snapshot[d] for d in dirs)


@pytest.mark.parametrize("spec, n", LAYOUTS)
def test_pieces_are_the_specs(tmp_path, spec, n):
    """The streaming encoder (blocks of 16 bytes) writes the pieces the spec defines."""
    dirs, records, _ = setup(tmp_path, spec, n)
    scheme = parse_redundancy(spec)
    shares = [b"".join((d / f.name).read_bytes() for f in r.files)
              for d, r in zip(dirs, records.nodes)]
    want = spec_pieces(scheme.kind, scheme.group, shares)
    assert [(d / r.piece.name).read_bytes() for d, r in zip(dirs, records.nodes)] == want
    assert find_damage(records, readers(dirs)) == ({}, {})


@pytest.mark.parametrize("spec, n", LAYOUTS)
def test_every_single_node_lost_is_rebuilt(tmp_path, spec, n):
    dirs, records, snapshot = setup(tmp_path, spec, n)
    for lost in range(n):
        shutil.rmtree(dirs[lost])
        dirs[lost].mkdir()
        done = repair(records, readers(dirs), opener(dirs), block=7)
        assert set(done.shares) == ({lost} if records.nodes[lost].files else set())
        assert set(done.pieces) == {lost}
        assert same(dirs, snapshot), f"node {lost}"


def test_one_node_per_xor_group_at_once(tmp_path):
    dirs, records, snapshot = setup(tmp_path, "xor:3", 7)   # groups [0, 1, 2], [3, 4, 5, 6]
    for lost in (1, 5):
        shutil.rmtree(dirs[lost])
        dirs[lost].mkdir()
    done = repair(records, readers(dirs), opener(dirs))
    assert (set(done.shares), set(done.pieces)) == ({1, 5}, {1, 5}) and same(dirs, snapshot)


@pytest.mark.parametrize("spec, n", [("partner", 3), ("xor:3", 5), ("xor:4", 6)])
def test_every_damaged_file_is_found_and_rebuilt(tmp_path, spec, n):
    """One flipped byte, or a file cut short, in any share file or piece: found by its
    checksum, rebuilt from the redundancy (a share) or from the shares (a piece)."""
    dirs, records, snapshot = setup(tmp_path, spec, n)
    for node, rec in enumerate(records.nodes):
        for f in list(rec.files) + [rec.piece]:
            if f.size == 0:
                continue
            for how in ("flip", "cut"):
                path = dirs[node] / f.name
                data = bytearray(path.read_bytes())
                if how == "flip":
                    data[len(data) // 2] ^= 0x10
                path.write_bytes(bytes(data if how == "flip" else data[:-1]))
                done = repair(records, readers(dirs), opener(dirs), block=5)
                kind = done.pieces if f is rec.piece else done.shares
                assert list(kind) == [node] and f.name in kind[node], (f.name, how)
                assert same(dirs, snapshot), (f.name, how)


@pytest.mark.parametrize("spec, n, lost, words", [
    ("xor:3", 5, (0, 2), "2 nodes of its XOR group \\(nodes 0 to 2\\)"),
    ("xor:4", 4, (1, 3), "2 nodes of its XOR group \\(nodes 0 to 3\\)"),
    ("partner", 3, (1, 2), "its copy on node 'n2' \\(node 2, ranks 3, 4\\) is lost too"),
])
def test_two_losses_that_cannot_be_rebuilt(tmp_path, spec, n, lost, words):
    dirs, records, snapshot = setup(tmp_path, spec, n)
    for node in lost:
        shutil.rmtree(dirs[node])
        dirs[node].mkdir()
    with pytest.raises(ShareLostError, match=words) as e:
        repair(records, readers(dirs), opener(dirs))
    first = records.nodes[lost[0]]
    assert (e.value.node, e.value.ranks, e.value.step) == (first.name, list(first.ranks), 42)
    assert f"step 42: the share of node {first.name!r}" in str(e.value)
    assert "another tier" in e.value.hint and isinstance(e.value, CorruptCheckpointError)
    assert all(not any(d.iterdir()) for d in (dirs[k] for k in lost))  # nothing half-made


def test_damaged_piece_and_share_in_one_group_is_lost(tmp_path):
    """A damaged share needs every other piece of its group: one of them damaged too is a
    second loss."""
    dirs, records, _ = setup(tmp_path, "xor:3", 3)
    (dirs[0] / "data-00000.bin").write_bytes(b"x" * 130)
    (dirs[2] / records.nodes[2].piece.name).write_bytes(b"\0" * records.nodes[2].piece.size)
    with pytest.raises(ShareLostError, match="node 'n2' \\(node 2, ranks 3, 4\\) has "
                                             "redundancy-00002.bin: checksum"):
        repair(records, readers(dirs), opener(dirs))


def test_reads_stay_within_the_block(tmp_path):
    """Encoding and rebuilding read at most ``block`` bytes at once, whatever the shares'
    sizes: memory stays a few blocks, never a share."""
    dirs, nodes = make_nodes(tmp_path, SIZES[:5])
    largest = []

    def counting(r):
        def read(name, offset, n):
            largest.append(n)
            return r(name, offset, n)
        return read

    rs = [counting(r) for r in readers(dirs)]
    records = protect(parse_redundancy("xor:3"), nodes, rs, opener(dirs), block=32)
    shutil.rmtree(dirs[3])
    dirs[3].mkdir()
    repair(records, rs, opener(dirs), block=32)
    assert max(largest) == 32 and sum(largest) > 32 * 20


def test_all_layouts_round_trip_with_every_block_size(tmp_path):
    for i, block in enumerate((1, 3, 64, 1 << 20)):
        base = tmp_path / str(i)
        base.mkdir()
        dirs, records, snapshot = setup(base, "xor:3", 5, block=block)
        for lost in itertools.islice(range(5), 0, 5, 2):
            (dirs[lost] / records.nodes[lost].piece.name).unlink()
            for f in records.nodes[lost].files:
                (dirs[lost] / f.name).unlink()
            repair(records, readers(dirs), opener(dirs), block=block)
            assert same(dirs, snapshot)


def test_memory_stays_a_few_blocks(tmp_path):
    """Encoding and rebuilding shares of 16 MiB in blocks of 256 KiB: the Python heap's
    peak (tracemalloc: bytes, NumPy buffers) stays a few blocks, far below one share."""
    import tracemalloc

    share = 16 << 20
    dirs, nodes = make_nodes(tmp_path, [[share // 2, share // 2], [share - 1], [share]])
    scheme, block = parse_redundancy("xor:3"), 256 << 10
    tracemalloc.start()
    try:
        records = protect(scheme, nodes, readers(dirs), opener(dirs), block=block)
        encode_peak = tracemalloc.get_traced_memory()[1]
        shutil.rmtree(dirs[1])
        dirs[1].mkdir()
        tracemalloc.reset_peak()
        repair(records, readers(dirs), opener(dirs), block=block)
        rebuild_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (dirs[1] / "data-00002.bin").stat().st_size == share - 1
    assert encode_peak < 8 * block and rebuild_peak < 8 * block, (encode_peak, rebuild_peak)
