"""Coordination whose cost per rank does not grow with the ranks (issue 27), on thread ranks:
``Communicator.gather`` / ``all_reduce_minmax`` / ``gather_outcomes_to`` / ``agree_outcomes``
(every rank raises the same error when one fails), and a later save in which no rank but
the committer receives more as the world grows."""
import threading

import numpy as np
import pytest

import uckpt
from uckpt.comm.base import Communicator
from uckpt.errors import CollectiveTimeoutError, DistributedError
from uckpt.testing import ThreadWorld, run_ranks


def values(outcomes):
    for o in outcomes:
        if isinstance(o, BaseException):
            raise o
    return outcomes


def test_gather_reaches_the_root_only_and_minmax_every_rank():
    def body(comm):
        return (comm.gather({"r": comm.rank, "t": (1, 2)}, root=2),
                comm.all_reduce_minmax([comm.rank, -comm.rank, 9]))

    out = values(run_ranks(4, body))
    for rank, (gathered, minmax) in enumerate(out):
        assert gathered == ([{"r": r, "t": [1, 2]} for r in range(4)] if rank == 2 else None)
        assert minmax == ([0, -3, 9], [3, 0, 9])


def test_scatter_gives_each_rank_its_own_object():
    def body(comm):
        return comm.scatter([{"to": r, "s": "é\n" * r} for r in range(3)]
                            if comm.rank == 1 else None, root=1)

    assert values(run_ranks(3, body)) == [{"to": r, "s": "é\n" * r} for r in range(3)]
    # the root refuses its list; the other ranks wait for it until the world's timeout
    # (30 s by default: short here, the root's error is what is checked)
    with pytest.raises(ValueError, match=r"one object per rank \(3\), got 2"):
        values(run_ranks(3, lambda comm: comm.scatter([1, 2] if comm.rank == 0 else None),
                         timeout=1))


def test_outcomes_to_the_root_and_agreement():
    def body(comm):
        return (comm.gather_outcomes_to(lambda: comm.rank ** 2, root=1, what="write"),
                comm.agree_outcomes(lambda: [comm.rank % 2, 4], 2, what="plan"))

    out = values(run_ranks(3, body))
    assert [o[0] for o in out] == [None, [0, 1, 4], None]
    assert all(o[1] == ([0, 4], [1, 4]) for o in out)


def failing_on(rank, value):
    def fn(comm):
        if comm.rank == rank:
            raise OSError(f"disk full on rank {rank}")
        return value(comm)
    return fn


@pytest.mark.parametrize("call", ["gather_outcomes_to", "agree_outcomes"])
def test_a_failure_on_one_rank_raises_the_same_error_on_every_rank(call):
    """As gather_outcomes: every rank raises a DistributedError naming rank 2 and its
    error (rank 2's own error chained), and the communicator still works."""
    def body(comm):
        fn = failing_on(2, (lambda c: c.rank) if call == "gather_outcomes_to"
                        else (lambda c: [c.rank]))
        try:
            if call == "gather_outcomes_to":
                comm.gather_outcomes_to(lambda: fn(comm), root=0, what="save of step 3")
            else:
                comm.agree_outcomes(lambda: fn(comm), 1, what="save of step 3")
        except DistributedError as e:
            return type(e), str(e), e.failures, type(e.__cause__), comm.all_gather(comm.rank)
        return None

    out = values(run_ranks(4, body))
    for rank, (kind, msg, failures, cause, after) in enumerate(out):
        assert kind is DistributedError
        assert msg == ("save of step 3 failed on 1 of 4 rank(s): 2\n"
                       "  rank 2: OSError: disk full on rank 2")
        assert failures == {2: "OSError: disk full on rank 2"}
        assert cause is (OSError if rank == 2 else type(None))
        assert after == [0, 1, 2, 3]


def test_bad_reductions_are_refused_on_every_rank():
    def body(comm):
        try:
            comm.agree_outcomes(lambda: [1] * (1 + (comm.rank == 1)), 1, what="plan")
        except DistributedError as e:
            return str(e)

    msgs = values(run_ranks(3, body))
    assert all(m == "plan failed on 1 of 3 rank(s): 1\n  rank 1: ValueError: agree_outcomes: "
                    "fn gave 2 values, not 1" for m in msgs)
    with pytest.raises(TypeError, match=r"got '1'"):
        values(run_ranks(1, lambda comm: comm.all_reduce_minmax(["1"])))


def test_a_rank_missing_from_the_gather_makes_the_others_time_out_naming_it():
    def body(comm):
        if comm.rank == 3:
            return None
        return comm.gather_outcomes_to(lambda: 1, root=0, what="save")

    out = run_ranks(4, body, timeout=0.5)
    for rank in (0, 1, 2):
        assert isinstance(out[rank], CollectiveTimeoutError), out[rank]
        assert "save: collective 'gather(root=0)' timed out after 0.5 s: rank(s) 3 did " \
               "not answer" in str(out[rank])


def test_the_base_class_defaults_serve_a_communicator_with_only_all_gather():
    """A communicator that implements only all_gather and broadcast (a third party's)."""
    class Plain(Communicator):
        def __init__(self, inner):
            self.inner, self._rank, self._size = inner, inner.rank, inner.size

        def all_gather(self, obj):
            return self.inner.all_gather(obj)

        def broadcast(self, obj=None, root=0):
            return self.inner.broadcast(obj, root)

    def body(comm):
        c = Plain(comm)
        try:
            c.gather_outcomes_to(lambda: failing_on(0, lambda _: 1)(c), root=1, what="w")
        except DistributedError as e:
            failed = str(e)
        return (c.gather(c.rank, root=1), c.all_reduce_minmax([c.rank]),
                c.agree_outcomes(lambda: [7], 1), failed)

    out = values(run_ranks(3, body))
    assert [o[0] for o in out] == [None, [0, 1, 2], None]
    assert all(o[1] == ([0], [2]) and o[2] == ([7], [7]) for o in out)
    assert all(o[3].startswith("w failed on 1 of 3 rank(s): 0") for o in out)


# ---- a later save: what each rank receives -------------------------------------------

class CountingWorld(ThreadWorld):
    """Counts, per rank, the bytes each collective delivers to it (a gather: to its root
    only; a reduction: the result)."""

    def __init__(self, size):
        super().__init__(size, timeout=30)
        self.received = [0] * size
        self.counting = False

    def exchange(self, group, call, rank, operation, payload):
        got = super().exchange(group, call, rank, operation, payload)
        if self.counting:
            if operation.startswith(("broadcast", "gather(")):
                root = int(operation.split("=")[1].rstrip(")"))
                n = len(got[root]) if operation.startswith("broadcast") else \
                    sum(map(len, got)) if rank == root else 0
            elif operation == "barrier":
                n = 0
            else:
                n = len(payload) if operation == "all_reduce_minmax" else sum(map(len, got))
            self.received[rank] += n
        return got


def later_save_received(tmp_path, size, tensors=6):
    """Bytes each rank receives in the second save of a manager (same structure)."""
    world = CountingWorld(size)

    def body(comm):
        with uckpt.CheckpointManager(tmp_path / str(size), comm=comm) as m:
            for step in (1, 2):
                state = {f"t{i}": uckpt.Shard(np.full((2, 3), step + comm.rank, np.float32),
                                              (2 * size, 3), (2 * comm.rank, 0))
                         for i in range(tensors)}
                state["norm"] = np.arange(4.0) * step
                comm.barrier()
                if comm.rank == 0:
                    world.counting = step == 2
                comm.barrier()
                m.save(step, state)
                comm.barrier()
                if comm.rank == 0:
                    world.counting = False
                comm.barrier()
        return uckpt.load(m.path(2))

    threads = []
    outcomes = [None] * size

    def run(comm):
        try:
            outcomes[comm.rank] = body(comm)
        except BaseException as e:  # noqa: BLE001
            outcomes[comm.rank] = e
    for c in world.communicators():
        threads.append(threading.Thread(target=run, args=(c,), daemon=True))
        threads[-1].start()
    for t in threads:
        t.join(60)
    tree = values(outcomes)[0]
    assert np.array_equal(tree["t5"][2 * (size - 1):], np.full((2, 3), 2 + size - 1))
    return world.received


def test_a_later_save_receives_the_same_on_every_rank_but_the_committer_whatever_the_world(
        tmp_path):
    """A later save (the plan kept): ranks other than 0 receive a constant (a reduction,
    the committer's verdicts, and for ``on_commit``, as every rank retains in a directory
    it sees, the committed checkpoint's total bytes and creation time), not every rank's
    records nor the data files' sizes. Rank 0 receives a small record per rank. (Before:
    every rank all-gathered every rank's key, plan id and check, and its write record with
    16 bytes per chunk; later, the data files' sizes, a number per rank.)"""
    small, large = (later_save_received(tmp_path, n) for n in (2, 6))
    assert len(set(small[1:])) == 1 and len(set(large[1:])) == 1, (small, large)
    # the same but for one more digit of the total bytes (the sizes: "344," per rank)
    assert large[1] - small[1] <= 1 and large[1] < 400, (small, large)
    assert large[0] > small[0] > large[1]  # the committer: O(ranks) small records


def test_every_rank_learns_the_committed_roots_own_facts_without_its_manifest(tmp_path):
    """``on_commit`` of a split save (3 ranks, no base): every rank gets the facts of the
    root the committer wrote (its ``created``, the data files' total bytes), as
    retention would read them back, and no manifest (it never builds one). Before, a rank
    other than the committer built a manifest of its own, stamped with its own clock."""
    from uckpt.loading.reader import read_manifest
    from uckpt.saving.collective import save_collective
    from uckpt.saving.committed import Committed
    from uckpt.storage import locate
    from uckpt.tree.flatten import flatten

    store, name = locate(tmp_path / "step_7")

    def body(comm):
        got = []
        state = {"w": uckpt.Shard(np.full((2, 3), comm.rank, np.float32), (6, 3),
                                  (2 * comm.rank, 0)), "b": np.arange(5.0)}
        save_collective(store, name, flatten(state, rank=comm.rank), comm, step=7,
                        metadata={"metrics": {"loss": 0.5}}, on_commit=got.append)
        return got

    out = values(run_ranks(3, body))
    back = Committed.of(read_manifest(store.source(name)))
    assert back.nbytes > 0 and back.created
    for got in out:
        assert len(got) == 1 and got[0].manifest is None
        assert (got[0].step, got[0].nbytes, got[0].created, got[0].metadata, got[0].bases) \
            == (7, back.nbytes, back.created, {"metrics": {"loss": 0.5}}, ())
