"""uckpt.torch.ResumableSampler: a real DataLoader, interrupted, saved to real files,
restored into fresh objects, gives the index sequence of a run never interrupted."""
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import uckpt
import uckpt.torch
from uckpt.errors import KeyMismatchError, StateMismatchError
from uckpt.torch import ResumableSampler

N, B = 50, 8          # 6 full batches and one of 2 per epoch (one replica)


def loader_for(sampler, n=N, batch_size=B, drop_last=False, num_workers=0):
    return DataLoader(TensorDataset(torch.arange(n)), batch_size=batch_size, sampler=sampler,
                      drop_last=drop_last, num_workers=num_workers)


def steps(sampler, loader, count):
    """`count` batches (as lists of indices) of a step-based loop that runs over epochs."""
    out = []
    while len(out) < count:
        for (batch,) in loader:
            out.append(batch.tolist())
            if sampler.advance_mode == "manual":
                sampler.advance(len(batch))     # the loop has used these samples
            if len(out) == count:
                break
    return out


def epochs(sampler, loader, num_epochs, stop_after=None):
    """(epoch, batch) pairs of an epoch loop that calls set_epoch like DistributedSampler's users."""
    out = []
    for epoch in range(sampler.epoch, num_epochs):
        sampler.set_epoch(epoch)
        for (batch,) in loader:
            out.append((epoch, batch.tolist()))
            if len(out) == stop_after:
                return out
    return out


# -- the data order -----------------------------------------------------------------------------
@pytest.mark.parametrize("n,replicas,drop_last,shuffle", [
    (50, 1, False, True), (50, 3, False, True), (50, 3, True, True), (2, 3, False, True),
    (11, 4, True, False), (12, 4, False, False)])
def test_order_is_distributed_samplers(n, replicas, drop_last, shuffle):
    for rank in range(replicas):
        ours = ResumableSampler(n, num_replicas=replicas, rank=rank, seed=5, shuffle=shuffle,
                                drop_last=drop_last)
        theirs = DistributedSampler(range(n), num_replicas=replicas, rank=rank, seed=5,
                                    shuffle=shuffle, drop_last=drop_last)
        assert len(ours) == len(theirs)
        for epoch in range(3):
            theirs.set_epoch(epoch)
            ours.set_epoch(epoch)
            assert list(ours) == list(theirs)


def test_epochs_advance_by_themselves_and_set_epoch_keeps_a_running_epoch():
    s = ResumableSampler(range(10), seed=1)
    first, second = list(s), list(s)
    assert first == s.indices(0) and second == s.indices(1) and first != second
    assert (s.epoch, s.position) == (2, 0)
    it = iter(s)
    taken = [next(it) for _ in range(4)]
    assert (s.epoch, s.position) == (2, 4)
    s.set_epoch(2)                              # the epoch it is in: keeps its place
    assert list(s) == s.indices(2)[4:] and taken == s.indices(2)[:4]
    s.set_epoch(0)                              # another epoch: from its beginning
    assert (s.epoch, s.position) == (0, 0) and list(s) == first


def test_position_counts_the_indices_of_the_batches_received():
    s = ResumableSampler(N, seed=3)
    it = iter(loader_for(s))
    for k in range(1, 7):
        next(it)
        assert (s.epoch, s.position) == (0, k * B)
    next(it)                                    # the last, partial batch ends the epoch
    assert (s.epoch, s.position) == (1, 0)


# -- interrupted and restored ------------------------------------------------------------------
@pytest.mark.parametrize("stop", [1, 3, 6, 7, 8, 13, 14, 15])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("replicas,rank", [(1, 0), (3, 1)])
def test_step_loop_restored_from_files_continues_the_same_sequence(tmp_path, stop, drop_last,
                                                                   replicas, rank):
    kw = dict(seed=11, num_replicas=replicas, rank=rank)
    total = 24                                  # more than three epochs on one replica
    s = ResumableSampler(N, **kw)
    expected = steps(s, loader_for(s, drop_last=drop_last, batch_size=3), total)

    s1 = ResumableSampler(N, **kw)
    before = steps(s1, loader_for(s1, drop_last=drop_last, batch_size=3), stop)
    uckpt.save(tmp_path / "ck", {"sampler": s1, "step": stop})

    s2 = ResumableSampler(N, **kw)
    state = {"sampler": s2, "step": 0}
    uckpt.load(tmp_path / "ck", state)
    assert state["step"] == stop and (s2.epoch, s2.position) == (s1.epoch, s1.position)
    after = steps(s2, loader_for(s2, drop_last=drop_last, batch_size=3), total - stop)
    assert before + after == expected


@pytest.mark.parametrize("n,stop", [(N, 3), (N, 7), (N, 9), (48, 6), (48, 7)])
def test_epoch_loop_with_set_epoch_restored_continues_the_same_sequence(tmp_path, n, stop):
    s = ResumableSampler(n, seed=4)
    expected = epochs(s, loader_for(s, n), 3)

    s1 = ResumableSampler(n, seed=4)
    before = epochs(s1, loader_for(s1, n), 3, stop_after=stop)
    uckpt.save(tmp_path / "ck", {"sampler": s1})
    s2 = ResumableSampler(n, seed=4)
    uckpt.load(tmp_path / "ck", {"sampler": s2})
    assert before + epochs(s2, loader_for(s2, n), 3) == expected


def test_checkpoint_manager_resumes_the_data_order(tmp_path):
    def run(root, total, stop=None):
        torch.manual_seed(0)
        sampler = ResumableSampler(N, seed=2)
        state = {"sampler": sampler, "model": torch.nn.Linear(1, 1), "step": 0}
        seen = []
        with uckpt.CheckpointManager(root, keep_last=2) as manager:
            step = manager.restore(state) or 0
            while step < total:
                for (batch,) in loader_for(sampler):
                    seen.append(batch.tolist())
                    step += 1
                    if step % 4 == 0:
                        state["step"] = step
                        manager.save(step, state)
                    if step in (total, stop):
                        return step, seen
        return step, seen

    _, expected = run(tmp_path / "a", 20)
    _, before = run(tmp_path / "b", 20, stop=10)     # interrupted after step 10
    _, after = run(tmp_path / "b", 20)               # resumes from the checkpoint of step 8
    assert before[:8] + after == expected


@pytest.mark.timeout(120)
@pytest.mark.parametrize("drop_last", [False, True])
def test_manual_advance_is_exact_with_prefetching_workers(tmp_path, drop_last):
    total, stop = 17, 5
    s = ResumableSampler(N, seed=8)
    expected = steps(s, loader_for(s, drop_last=drop_last), total)

    # counted as handed out, the position runs ahead of the loop by the prefetched batches
    auto = ResumableSampler(N, seed=8)
    it = iter(loader_for(auto, drop_last=drop_last, num_workers=2))
    for _ in range(2):
        next(it)
    assert auto.position > 2 * B
    del it

    s1 = ResumableSampler(N, seed=8, advance="manual")
    before = steps(s1, loader_for(s1, drop_last=drop_last, num_workers=2), stop)
    assert s1.position == stop * B
    uckpt.save(tmp_path / "ck", {"sampler": s1})
    s2 = ResumableSampler(N, seed=8, advance="manual")
    uckpt.load(tmp_path / "ck", {"sampler": s2})
    after = steps(s2, loader_for(s2, drop_last=drop_last, num_workers=2), total - stop)
    assert before + after == expected


def test_each_rank_resumes_from_any_ranks_checkpoint(tmp_path):
    s0, s1 = (ResumableSampler(N, num_replicas=2, rank=r, seed=6) for r in (0, 1))
    steps(s0, loader_for(s0), 5)
    expected = steps(s1, loader_for(s1), 12)
    uckpt.save(tmp_path / "ck", {"sampler": s0})      # rank 0's state: the same on every rank

    again = ResumableSampler(N, num_replicas=2, rank=1, seed=6)
    uckpt.load(tmp_path / "ck", {"sampler": again})
    assert steps(again, loader_for(again), 7) == expected[5:]


def test_checkpoint_holds_plain_values_and_its_seed_wins(tmp_path):
    s = ResumableSampler(N, seed=21)
    steps(s, loader_for(s), 9)
    uckpt.save(tmp_path / "ck", {"sampler": s})
    assert uckpt.load(tmp_path / "ck") == {"sampler": s.state_dict()}     # no torch needed
    assert uckpt.manifest(tmp_path / "ck").tree["items"]["sampler"]["adapter"] == \
        "torch.resumable_sampler"

    other = ResumableSampler(N, seed=0)
    uckpt.load(tmp_path / "ck", {"sampler": other})
    assert other.seed == 21 and other.state_dict() == s.state_dict()
    assert list(other) == list(s)


def test_state_dict_round_trip_without_uckpt():
    s = ResumableSampler(N, seed=9)
    steps(s, loader_for(s), 3)
    t = ResumableSampler(N, seed=9)
    t.load_state_dict(s.state_dict())
    assert list(t) == list(s)


def test_each_dataloader_iterator_draws_from_the_global_rng_unless_given_a_generator():
    # Why the docs say generator=torch.Generator(): a resumed run creates an iterator
    # mid-epoch where the uninterrupted one did not, one draw more from the global RNG.
    s = ResumableSampler(N)
    torch.manual_seed(0)
    iter(loader_for(s))
    assert not torch.equal(torch.get_rng_state(), torch.manual_seed(0).get_state())
    torch.manual_seed(0)
    iter(DataLoader(TensorDataset(torch.arange(N)), sampler=s, generator=torch.Generator()))
    assert torch.equal(torch.get_rng_state(), torch.manual_seed(0).get_state())


# -- refusals ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,field", [
    (dict(data=N + 1), "dataset_length"), (dict(num_replicas=2, rank=0), "num_replicas"),
    (dict(shuffle=False), "shuffle"), (dict(drop_last=True), "drop_last")])
def test_a_sampler_that_does_not_fit_is_refused_before_anything_changes(tmp_path, kwargs, field):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    s = ResumableSampler(N, seed=1)
    steps(s, loader_for(s), 2)
    uckpt.save(tmp_path / "ck", {"model": model, "sampler": s})

    model2 = torch.nn.Linear(3, 2)
    before = [p.detach().clone() for p in model2.parameters()]
    wrong = ResumableSampler(kwargs.pop("data", N), seed=1, **kwargs)
    with pytest.raises(StateMismatchError, match=field) as err:
        uckpt.load(tmp_path / "ck", {"model": model2, "sampler": wrong})
    assert isinstance(err.value, ValueError)
    assert "same data set" in str(err.value)                        # the hint
    assert all(torch.equal(a, b) for a, b in zip(before, model2.parameters()))
    assert (wrong.epoch, wrong.position) == (0, 0)

    with uckpt.CheckpointManager(tmp_path / "m") as manager:
        manager.save(1, {"sampler": s})
        with pytest.raises(StateMismatchError, match=field):
            manager.restore({"sampler": ResumableSampler(N + 1 if field == "dataset_length"
                                                         else N, seed=1, **kwargs)})


def test_bad_states_are_refused_by_load_state_dict():
    s = ResumableSampler(N)
    good = s.state_dict()
    with pytest.raises(KeyMismatchError, match="position"):
        s.load_state_dict({k: v for k, v in good.items() if k != "position"})
    with pytest.raises(KeyMismatchError, match="extra"):
        s.load_state_dict({**good, "extra": 1})
    with pytest.raises(StateMismatchError, match="outside an epoch of 50"):
        s.load_state_dict({**good, "position": 51})
    with pytest.raises(StateMismatchError, match="not an integer"):
        s.load_state_dict({**good, "epoch": "3"})
    with pytest.raises(StateMismatchError, match="not a sampler state"):
        s.load_state_dict([1, 2])
    assert s.state_dict() == good
    s.load_state_dict({**good, "epoch": 4, "position": 50})         # a finished epoch
    assert (s.epoch, s.position) == (5, 0)


def test_bad_arguments():
    with pytest.raises(ValueError, match="at least one sample"):
        ResumableSampler([])
    with pytest.raises(TypeError, match="len"):
        ResumableSampler(object())
    with pytest.raises(ValueError, match="rank 3"):
        ResumableSampler(N, num_replicas=3, rank=3)
    with pytest.raises(ValueError, match="pass rank"):
        ResumableSampler(N, num_replicas=3)
    with pytest.raises(ValueError, match="no sample per replica"):
        ResumableSampler(2, num_replicas=3, rank=0, drop_last=True)
    with pytest.raises(ValueError, match="advance"):
        ResumableSampler(N, advance="sometimes")
    with pytest.raises(RuntimeError, match="advance='manual'"):
        ResumableSampler(N).advance(1)
    manual = ResumableSampler(N, advance="manual")
    with pytest.raises(ValueError, match="leaves epoch 0"):
        manual.advance(N + 1)
    manual.advance(N)
    assert (manual.epoch, manual.position) == (1, 0)


def test_public_module_re_exports_the_adapter_packages_sampler():
    import uckpt_torch

    assert uckpt.torch.ResumableSampler is uckpt_torch.ResumableSampler
    assert any(isinstance(a, uckpt_torch.SamplerAdapter) for a in uckpt_torch.ADAPTERS)
