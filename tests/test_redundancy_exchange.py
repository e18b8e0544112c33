"""Point-to-point :meth:`Communicator.exchange` on thread ranks and in one process, and
:func:`uckpt.levels.exchange.protect_across`: the pieces made over the communicator are
those the spec gives (tests/redundancy_common.spec_pieces), and what each node then holds
rebuilds any one lost node bit for bit. (Real processes: tests/test_exchange_multiproc.py.)"""
import shutil

import numpy as np
import pytest

from redundancy_common import make_nodes, opener, readers, spec_pieces
from uckpt.comm import SingleProcess
from uckpt.errors import CollectiveTimeoutError, RedundancyConfigError
from uckpt.levels.exchange import node_map, protect_across
from uckpt.levels.repair import repair
from uckpt.levels.scheme import parse_redundancy
from uckpt.levels.share_io import directory_reader
from uckpt.testing import run_ranks
from uckpt.testing.threads import ThreadWorld


def payload(src, dst, n):
    return (np.arange(n, dtype=np.uint32) * 7 + src * 31 + dst).astype(np.uint8).tobytes()


def test_threads_ring_all_to_all_and_order():
    def body(c):
        r, n = c.rank, c.size
        ring = c.exchange({(r + 1) % n: payload(r, 0, 3 << 20)}, [(r - 1) % n])
        every = c.exchange({d: memoryview(payload(r, d, 10 * d)) for d in range(n)}, range(n))
        # only ranks 1 and 3 take part, twice in a row: messages arrive in order
        pair = []
        if r in (1, 3):
            for k in range(2):
                pair.append(c.exchange({4 - r: payload(r, k, 5 + k)}, [4 - r])[4 - r])
        c.barrier()  # the collectives are not disturbed by who took part
        return ring, every, pair

    got = run_ranks(4, body, timeout=20)
    for r, (ring, every, pair) in enumerate(got):
        assert ring == {(r - 1) % 4: payload((r - 1) % 4, 0, 3 << 20)}
        assert every == {s: payload(s, r, 10 * r) for s in range(4)}
        assert pair == ([payload(4 - r, k, 5 + k) for k in range(2)] if r in (1, 3) else [])


def test_threads_missing_sender_times_out_naming_it():
    world = ThreadWorld(3, timeout=0.5)
    c = world.communicators()
    c[1].exchange({0: b"x"}, [])
    with pytest.raises(CollectiveTimeoutError, match=r"'exchange'.*rank\(s\) 2 did not answer"):
        c[0].exchange({}, [1, 2])


def test_bad_peers_and_single_process():
    sp = SingleProcess()
    assert sp.exchange({0: bytearray(b"abc")}, [0]) == {0: b"abc"}
    assert sp.exchange({}, []) == {}
    with pytest.raises(ValueError, match=r"ranks must be ints in \[0, 1\), got 1"):
        sp.exchange({1: b"x"}, [])
    with pytest.raises(ValueError, match="receives from itself but sends itself nothing"):
        sp.exchange({}, [0])
    c = ThreadWorld(2).communicators()[0]
    with pytest.raises(ValueError, match=r"ranks must be ints in \[0, 2\), got -1"):
        c.exchange({}, [-1])


def test_node_map():
    assert node_map(["b", "b", "a", "c", "a"]) == (["b", "a", "c"], [[0, 1], [2, 4], [3]])


SIZES = [[130, 77], [301], [0, 5], [64], [199]]


@pytest.mark.parametrize("spec, nodes", [
    ("partner", ["a", "a", "b", "c"]), ("xor:3", ["a", "a", "b", "c"]),
    ("xor:4", ["a", "b", "c", "d"]), ("xor:2", ["a", "b", "c", "d", "e"]),
    ("partner", ["a", "b"]), ("xor:4", ["a", "a", "b", "b"]),
])
def test_protect_across_thread_ranks(tmp_path, spec, nodes):
    names, ranks = node_map(nodes)
    dirs, shares = make_nodes(tmp_path, SIZES[:len(names)])
    files = [names_ for _, _, names_ in shares]
    scheme = parse_redundancy(spec)

    def body(c):
        node = names.index(nodes[c.rank])
        return protect_across(c, nodes, scheme, files[node] if ranks[node][0] == c.rank else (),
                              directory_reader(dirs[node]),
                              lambda name: open(dirs[node] / name, "wb"), step=9, block=50)

    got = run_ranks(len(nodes), body, timeout=30)
    assert not [g for g in got if isinstance(g, BaseException)], got
    records = got[0]
    assert all(g == records for g in got)
    assert [(n.name, list(n.ranks)) for n in records.nodes] == list(zip(names, ranks))
    whole = [b"".join((d / f).read_bytes() for f in fs) for d, fs in zip(dirs, files)]
    want = spec_pieces(scheme.kind, scheme.group, whole)
    assert [(d / n.piece.name).read_bytes() for d, n in zip(dirs, records.nodes)] == want
    snapshot = [{p.name: p.read_bytes() for p in d.iterdir()} for d in dirs]
    lost = len(dirs) - 1
    shutil.rmtree(dirs[lost])
    dirs[lost].mkdir()
    repair(records, readers(dirs), opener(dirs))
    assert [{p.name: p.read_bytes() for p in d.iterdir()} for d in dirs] == snapshot


def test_protect_across_one_node_refused_everywhere(tmp_path):
    def body(c):
        return protect_across(c, ["only", "only"], parse_redundancy("partner"), (),
                              directory_reader(tmp_path), lambda n: open(tmp_path / n, "wb"))

    got = run_ranks(2, body, timeout=10)
    assert all(isinstance(g, RedundancyConfigError) and "has 1 node(s)" in str(g) for g in got)


@pytest.mark.parametrize("spec, count, wiped, damaged", [
    ("partner", 3, [1], None),
    ("xor:3", 3, [0], None),
    ("xor:2", 5, [0, 3], None),                # one per group at once
    ("xor:4", 4, [], ("share", 1)),            # a flipped byte
    ("partner", 3, [], ("piece", 0)),
])
def test_repair_across_thread_ranks(tmp_path, spec, count, wiped, damaged):
    """Each node's leader reads and writes only its own directory; what is lost is rebuilt
    over the communicator bit for bit."""
    from uckpt.levels.rebuild_across import repair_across
    from uckpt.levels.protect import protect

    dirs, shares = make_nodes(tmp_path, SIZES[:count])
    nodes = [name for name, ranks, _ in shares for _ in ranks]  # node 0: two ranks
    names = [name for name, _, _ in shares]
    records = protect(parse_redundancy(spec), shares, readers(dirs), opener(dirs), step=4,
                      block=64)
    snapshot = [{p.name: p.read_bytes() for p in d.iterdir()} for d in dirs]
    for i in wiped:
        shutil.rmtree(dirs[i])
        dirs[i].mkdir()
    if damaged:
        node = damaged[1]
        rec = records.nodes[node]
        f = dirs[node] / (rec.piece.name if damaged[0] == "piece" else rec.files[0].name)
        data = bytearray(f.read_bytes())
        data[3] ^= 1
        f.write_bytes(bytes(data))

    def body(c):
        d = dirs[names.index(nodes[c.rank])]
        return repair_across(c, nodes, records, directory_reader(d),
                             lambda name: open(d / name, "wb"), block=50)

    got = run_ranks(len(nodes), body, timeout=30)
    assert not [g for g in got if isinstance(g, BaseException)], got
    want = set(wiped) | ({damaged[1]} if damaged and damaged[0] == "share" else set())
    assert all(set(g.shares) == {i for i in want if records.nodes[i].files} for g in got)
    assert [{p.name: p.read_bytes() for p in d.iterdir()} for d in dirs] == snapshot


def test_repair_across_refuses_on_every_rank(tmp_path):
    from uckpt.errors import ShareLostError
    from uckpt.levels.rebuild_across import repair_across
    from uckpt.levels.protect import protect

    dirs, shares = make_nodes(tmp_path, [[10], [20], [30], [40]])
    nodes = [name for name, _, _ in shares]
    records = protect(parse_redundancy("xor:4"), shares, readers(dirs), opener(dirs), step=4)
    for i in (1, 2):
        shutil.rmtree(dirs[i])
        dirs[i].mkdir()

    def body(c):
        return repair_across(c, nodes, records, directory_reader(dirs[c.rank]),
                             lambda name: open(dirs[c.rank] / name, "wb"))

    got = run_ranks(4, body, timeout=30)
    assert all(isinstance(g, ShareLostError) and "step 4: the share of node 'n1'" in str(g)
               and (g.node, g.ranks, g.step) == ("n1", [1], 4)
               and "2 nodes of its XOR group" in str(g) for g in got), got
    assert not any(dirs[1].iterdir()) and not any(dirs[2].iterdir())
