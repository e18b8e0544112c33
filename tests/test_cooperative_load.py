"""Reads shared across ranks (cooperative loads, uckpt.loading.cooperative) on thread ranks:
the assignment, bytes read once per node or job, bit-for-bit results, and damage found
wherever it happens (a chunk in storage, a transfer). The real processes are in
tests/test_cooperative_mpi.py."""
import numpy as np
import pytest

import uckpt
from uckpt import knobs
from uckpt.errors import ChecksumMismatchError, DistributedError, OptionsError
from uckpt.loading.cooperative import Transfer, assign, rounds
from uckpt.testing import run_ranks
from uckpt.testing.threads import ThreadCommunicator

MB = 1 << 20


def replicated():
    rng = np.random.default_rng(7)
    return {"w": rng.standard_normal((256, 4096)).astype(np.float32),  # 4 MiB: pieces
            "b": rng.standard_normal(1000), "step": 5}


def zeros(state):
    return {k: np.zeros_like(v) if isinstance(v, np.ndarray) else 0 for k, v in state.items()}


def data_bytes(path):
    return sum(c.length for e in uckpt.manifest(path).arrays.values() for c in e.chunks)


@pytest.fixture
def saved(tmp_path):
    state = replicated()
    out = run_ranks(4, lambda comm: uckpt.save(tmp_path / "c", state, comm=comm))
    assert not any(isinstance(o, BaseException) for o in out), out
    assert len(uckpt.manifest(tmp_path / "c").files) == 4  # written by all four
    return tmp_path / "c", state


def test_assign_spreads_each_shared_chunk_over_its_group():
    k = [("", f"data-{i}.bin", 0, n) for i, n in enumerate((40, 30, 20, 10))]
    everyone = [k] * 4
    job = assign(everyone, ["n0"] * 4)
    assert [t.key for t in job] == sorted(k)  # file order
    readers = {t.key[3]: t.reader for t in job}
    assert readers == {40: 0, 30: 1, 20: 2, 10: 3}  # largest first, least loaded
    assert all(set(t.to) == {0, 1, 2, 3} - {t.reader} for t in job)
    # per node: each chunk once per node, read and sent within it
    nodes = assign(everyone, ["a", "a", "b", "b"])
    assert len(nodes) == 8
    for t in nodes:
        assert {t.reader, *t.to} in ({0, 1}, {2, 3})
    # a chunk only one rank of a group reads is not shared there
    assert assign([[k[0]], [k[0]], [k[1]], []], ["a", "a", "a", "a"]) == \
        [Transfer(k[0], 0, (1,))]


def test_rounds_bound_what_a_rank_reads_and_receives():
    ts = [Transfer(("", "f", i * 10, 10), i % 3, tuple(r for r in range(3) if r != i % 3))
          for i in range(9)]
    out = rounds(ts, 25)
    assert [t for r in out for t in r] == ts
    for batch in out:
        for rank in range(3):
            assert sum(t.key[3] for t in batch if t.reader == rank) <= 25
            assert sum(t.key[3] for t in batch if rank in t.to) <= 25
    big = [Transfer(("", "f", 0, 100), 0, (1,))]  # larger than the bound: a round alone
    assert rounds(big, 25) == [big]


@pytest.mark.parametrize("mode, reads", [("node", 1), ("job", 1), (False, 4), ("auto", 4)])
def test_each_chunk_read_once_per_node_bit_for_bit(saved, monkeypatch, mode, reads):
    """4 thread ranks (one node) load a replicated state: with cooperation its bytes are
    read from storage once in all (in several rounds) and every rank's arrays equal the
    saved ones; without, four times."""
    path, state = saved
    monkeypatch.setattr(knobs, "cooperative_round_bytes", MB)  # several rounds

    def body(comm):
        report, dst = uckpt.LoadReport(), zeros(state)
        uckpt.load(path, dst, comm=comm, cooperative=mode, report=report)
        tree = uckpt.load(path, comm=comm, cooperative=mode)  # new arrays too
        return dst, tree, report.bytes_read, report.bytes_received

    out = run_ranks(4, body)
    total = data_bytes(path)
    assert sum(o[2] for o in out) == reads * total
    assert all(o[2] + o[3] == total for o in out)
    for dst, tree, _, _ in out:
        for got in (dst, tree):
            assert got["step"] == 5
            for name in ("w", "b"):
                assert got[name].tobytes() == state[name].tobytes()


def test_two_nodes_read_once_each_and_the_job_once(saved):
    """Ranks named on two nodes (CheckpointManager(node=...)) share reads within each
    node ("node": twice in all) or across the job (once)."""
    path, state = saved
    out = {}
    for mode in ("node", "job"):
        def body(comm, mode=mode):
            report, dst = uckpt.LoadReport(), zeros(state)
            with uckpt.CheckpointManager(path.parent / "run", comm=comm,
                                         node=f"n{comm.rank // 2}") as manager:
                from uckpt.loading.collective import load_from
                from uckpt.storage import open_source
                load_from(lambda: open_source(path), dst, True, manager.comm, "load",
                          cooperative=mode, report=report, node=manager.nodes.name)
            assert dst["w"].tobytes() == state["w"].tobytes()
            return report.bytes_read
        got = run_ranks(4, body)
        assert not any(isinstance(o, BaseException) for o in got), got
        out[mode] = sum(got)
    assert out == {"node": 2 * data_bytes(path), "job": data_bytes(path)}


def test_manager_restore_shares_reads(tmp_path):
    """restore(cooperative="node") reads the state once; the default ("auto") from local
    files, whose page cache shares the reads already, on every rank."""
    state = replicated()

    def body(comm):
        report, dst = uckpt.LoadReport(), zeros(state)
        with uckpt.CheckpointManager(tmp_path, comm=comm) as manager:
            manager.save(1, state)
            assert manager.restore(dst, report=report, cooperative="node") == 1
            off = uckpt.LoadReport()
            manager.restore(zeros(state), report=off)
        assert dst["w"].tobytes() == state["w"].tobytes() and dst["step"] == 5
        return report.bytes_read, off.bytes_read

    out = run_ranks(4, body)
    assert not any(isinstance(o, BaseException) for o in out), out
    total = data_bytes(tmp_path / "step_00000001")
    assert sum(o[0] for o in out) == total and sum(o[1] for o in out) == 4 * total


def test_a_damaged_chunk_fails_on_every_rank(saved):
    """A chunk damaged in storage is found by the one rank that reads it for the others:
    every rank raises a DistributedError from its ChecksumMismatchError, naming the file
    and leaf."""
    path, state = saved
    name = "data-00002.bin"
    raw = bytearray((path / name).read_bytes())
    raw[len(raw) // 2] ^= 0x10
    (path / name).write_bytes(bytes(raw))
    out = run_ranks(4, lambda comm: uckpt.load(path, zeros(state), comm=comm,
                                               cooperative="node"))
    for e in out:
        assert isinstance(e, DistributedError) and e.failed_with(ChecksumMismatchError), e
        assert "checksum mismatch in leaf 'w'" in str(e) and name in str(e)
        assert "failed on 1 of 4 rank(s)" in str(e)


class Damaging(ThreadCommunicator):
    """A thread rank whose received messages have one byte flipped (a damaged transfer)."""

    def exchange(self, sends, sources):
        got = super().exchange(sends, sources)
        for src in sorted(got):
            if src != self.rank and len(got[src]):
                data = bytearray(got[src])
                data[len(data) // 3] ^= 0x01
                got[src] = data
                break
        return got


def test_a_damaged_transfer_fails_its_receiver_on_every_rank(saved):
    path, state = saved

    def body(comm):
        if comm.rank == 3:
            comm = Damaging(comm.world, comm.rank, comm.group)
        return uckpt.load(path, zeros(state), comm=comm, cooperative="job")

    out = run_ranks(4, body)
    for e in out:
        assert isinstance(e, DistributedError) and e.failed_with(ChecksumMismatchError), e
        assert "rank 3: uckpt.errors.ChecksumMismatchError" in str(e)
        assert "(sent by another rank): checksum mismatch in leaf" in str(e)
        assert "damaged on the way" in str(e) and "cooperative=False" in str(e)


def test_overlapping_boxes_are_read_once(saved):
    """Shard boxes that two ranks share: each of their chunks is read by one of them."""
    path, state = saved

    def body(comm):
        rows = slice(0, 128) if comm.rank < 2 else slice(128, 256)
        box = np.zeros((128, 4096), np.float32)
        report = uckpt.LoadReport()
        uckpt.load(path, {"w": uckpt.Shard(box, (256, 4096), (rows.start, 0))}, comm=comm,
                   strict=False, report=report, cooperative="node")
        assert box.tobytes() == state["w"][rows].tobytes()
        return report.bytes_read

    out = run_ranks(4, body)
    assert not any(isinstance(o, BaseException) for o in out), out
    w = sum(c.length for c in uckpt.manifest(path).arrays["w"].chunks)
    assert sum(out) == w


def test_an_unknown_mode_is_refused(saved, monkeypatch):
    path, state = saved
    with pytest.raises(OptionsError, match="cooperative= 'nodes'") as e:
        uckpt.load(path, cooperative="nodes")
    assert '"node"' in e.value.hint and '"job"' in e.value.hint
    monkeypatch.setattr(knobs, "cooperative_load", "yes")
    with pytest.raises(OptionsError, match="UCKPT_COOPERATIVE_LOAD 'yes'"):
        uckpt.load(path)
