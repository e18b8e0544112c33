"""Content hashes and Merkle trees (uckpt.codecs.hashing; docs/format.md sections 11.2 and 11.3)."""
from __future__ import annotations

import struct

import numpy as np
import pytest
import crc32c
import xxhash

from uckpt.codecs import hashing


def H(data: bytes) -> bytes:
    return xxhash.xxh3_128_digest(data)


def test_hash_of_no_bytes_is_the_documented_one():
    assert hashing.of(b"") == "xxh3-128:99aa06d3014798d86001c324468d497f"
    assert hashing.parse_hash(hashing.of(b"abc")) == H(b"abc")


@pytest.mark.parametrize("bad", ["xxh3-128:" + "A" * 32, "xxh3-128:" + "0" * 31, "crc32c:00000000",
                                 "xxh3-128:" + "0" * 32 + "\n", 7])
def test_parse_hash_refuses_other_forms(bad):
    with pytest.raises(ValueError):
        hashing.parse_hash(bad)


def test_threaded_digests_equal_serial_ones():
    rng = np.random.default_rng(1)
    buffers = [rng.integers(0, 255, size=n, dtype=np.uint8) for n in (0, 1, 3 << 20, 5 << 20, 17)]
    assert hashing.digests(buffers, threads=4) == [H(b.tobytes()) for b in buffers]


@pytest.mark.parametrize("extra", [0, 1, -1])
@pytest.mark.parametrize("blocks", [0, 1, 3])
def test_crc_and_digest_in_one_pass_equal_each_alone(blocks, extra):
    """The fused pass of a save (block by block) gives the same CRC-32C and XXH3-128 as
    each over the whole buffer, at and around block boundaries."""
    n = max(0, blocks * hashing.FUSED_BLOCK_BYTES + extra)
    data = np.random.default_rng(n).integers(0, 255, size=n, dtype=np.uint8)
    assert hashing.crc_and_digest(data) == (crc32c.crc32c(data.tobytes()), H(data.tobytes()))
    assert hashing.crc_and_digest(data.tobytes()) == hashing.crc_and_digest(data)


def test_chunk_leaf_bytes():
    digest = H(b"chunk")
    expected = H(b"\x00" + struct.pack("<I", 2) + struct.pack("<4Q", 3, 0, 2, 5) + digest)
    assert hashing.chunk_leaf((3, 0), (2, 5), digest) == expected


def test_tree_pairs_left_to_right_and_promotes_an_odd_last_node():
    d = [H(bytes([i])) for i in range(3)]
    leaves = [hashing.chunk_leaf((i,), (1,), d[i]) for i in range(3)]
    inner = H(b"\x01" + H(b"\x01" + leaves[0] + leaves[1]) + leaves[2])
    head = b"\x02" + b"int8\x00" + struct.pack("<I", 1) + struct.pack("<Q", 3) + struct.pack("<Q", 3)
    root = hashing.array_root("int8", (3,), [((i,), (1,), d[i]) for i in range(3)])
    assert root == H(head + inner)


def test_array_root_ignores_chunk_order_but_not_content_or_place():
    chunks = [((0, 0), (2, 4), H(b"a")), ((2, 0), (2, 4), H(b"b")), ((4, 0), (1, 4), H(b"c"))]
    root = hashing.array_root("float32", (5, 4), chunks)
    assert hashing.array_root("float32", (5, 4), chunks[::-1]) == root
    changed = [chunks[0], (chunks[1][0], chunks[1][1], H(b"B")), chunks[2]]
    assert hashing.array_root("float32", (5, 4), changed) != root
    swapped = [(chunks[1][0], chunks[1][1], chunks[0][2]), (chunks[0][0], chunks[0][1], chunks[1][2]),
               chunks[2]]
    assert hashing.array_root("float32", (5, 4), swapped) != root  # same hashes, other places
    assert hashing.array_root("int32", (5, 4), chunks) != root  # dtype is bound


def test_empty_arrays_have_distinct_roots():
    roots = {hashing.array_root(dt, shape, []) for dt, shape in
             [("float32", (0,)), ("float32", (0, 3)), ("int8", (0,)), ("float32", (3, 0))]}
    assert len(roots) == 4
    expected = H(b"\x02float32\x00" + struct.pack("<I", 1) + struct.pack("<Q", 0) +
                 struct.pack("<Q", 0))
    assert hashing.array_root("float32", (0,), []) == expected


def test_checkpoint_root_orders_paths_by_their_bytes_and_binds_them():
    a, b = H(b"A"), H(b"B")
    root = hashing.checkpoint_root({"z": a, "a": b})
    assert root == hashing.checkpoint_root({"a": b, "z": a})
    assert root != hashing.checkpoint_root({"z": b, "a": a})
    leaves = [H(b"\x03" + struct.pack("<Q", 1) + b"a" + b), H(b"\x03" + struct.pack("<Q", 1) + b"z" + a)]
    assert root == H(b"\x04" + struct.pack("<Q", 2) + H(b"\x01" + leaves[0] + leaves[1]))
    assert hashing.checkpoint_root({}) == H(b"\x04" + struct.pack("<Q", 0))



@pytest.mark.parametrize("shape, rows", [((1000, 3), 7), ((40,), 1), ((2, 50, 3), 1)])
def test_many_chunk_leaves_are_the_documented_bytes(shape, rows):
    """Many chunks' leaves are packed with NumPy (hashing._chunk_leaves): the same bytes as
    chunk_leaf's, which test_chunk_leaf_bytes pins."""
    axis = 0 if shape[0] > 2 else 1
    chunks = []
    for k, r in enumerate(range(0, shape[axis], rows)):
        start = [0] * len(shape)
        start[axis] = r
        box = list(shape)
        box[axis] = min(rows, shape[axis] - r)
        chunks.append((tuple(start), tuple(box), H(bytes([k % 256, k // 256]))))
    assert len(chunks) >= 16
    leaves = [hashing.chunk_leaf(s, sh, d) for s, sh, d in chunks]
    while len(leaves) > 1:
        leaves = [H(b"\x01" + leaves[i] + leaves[i + 1]) for i in range(0, len(leaves) - 1, 2)] + \
            ([leaves[-1]] if len(leaves) % 2 else [])
    head = (b"\x02float32\x00" + struct.pack("<I", len(shape)) +
            struct.pack(f"<{len(shape)}Q", *shape) + struct.pack("<Q", len(chunks)))
    assert hashing.array_root("float32", shape, chunks[::-1]) == H(head + leaves[0])


def test_parse_hashes_checks_every_one():
    texts = [hashing.of(bytes([i])) for i in range(40)]
    assert hashing.parse_hashes(texts) == [hashing.parse_hash(t) for t in texts]
    for bad in (texts[:5] + [texts[5].upper()] + texts[6:],
                texts[:5] + [texts[5][:-1], texts[6] + "0"] + texts[7:],
                texts[:5] + [None] + texts[6:]):
        with pytest.raises(ValueError, match="is not of the form"):
            hashing.parse_hashes(bad)


def test_rows_root_is_the_documented_bytes_in_any_order():
    """Extension part-roots (section 13.2): row leaves tagged 0x05 with the array index,
    ordered by (array index, start), under a 0x06 head with the number of rows."""
    rows = [(1, (0,), (4,), H(b"a")), (0, (2, 0), (1, 3), H(b"b")), (0, (0, 0), (2, 3), H(b"c")),
            (1, (4,), (4,), H(b"d"))] + [(2, (k,), (1,), H(bytes([k]))) for k in range(20)]
    ordered = sorted(rows, key=lambda r: (r[0], r[1]))
    leaves = [H(b"\x05" + struct.pack("<I", i) + hashing.chunk_leaf(s, sh, d))
              for i, s, sh, d in ordered]
    while len(leaves) > 1:
        leaves = [H(b"\x01" + leaves[i] + leaves[i + 1]) for i in range(0, len(leaves) - 1, 2)] + \
            ([leaves[-1]] if len(leaves) % 2 else [])
    root = hashing.rows_root(rows)
    assert root == H(b"\x06" + struct.pack("<Q", len(rows)) + leaves[0])
    assert hashing.rows_root(rows[::-1]) == root
    moved = [(2,) + rows[0][1:]] + rows[1:]
    assert hashing.rows_root(moved) != root  # the array index is bound
    assert hashing.rows_root([]) == H(b"\x06" + struct.pack("<Q", 0))


def test_split_root_binds_the_table_root_and_each_part_root_in_order():
    t, a, b = H(b"t"), H(b"a"), H(b"b")
    assert hashing.split_root(t, [a, b]) == H(b"\x07" + struct.pack("<Q", 2) + t + a + b)
    assert hashing.split_root(t, [b, a]) != hashing.split_root(t, [a, b])
    assert hashing.split_root(t, []) == H(b"\x07" + struct.pack("<Q", 0) + t)
