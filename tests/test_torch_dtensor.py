"""DTensor / FSDP2 state as sharded leaves, on real gloo processes (tests/dtensor_worker.py).

Four ranks train an FSDP2 (``fully_shard``) model with Adam and save it with
DTensors of other layouts; the checkpoint is loaded on 2 and 3 ranks into
objects sharded another way, and by one process into plain tensors. Every value
is compared bit for bit with what torch's ``full_tensor()`` gathered at save
time. Every launch has a hard timeout (tests/multiproc.py).
"""
from pathlib import Path

import numpy as np
import pytest

import uckpt
from multiproc import HAVE_TORCH, run_torch

# one pytest-xdist worker runs the whole module: its module-scoped launch ran once per
# worker otherwise (see docs/testing.md)
pytestmark = [pytest.mark.xdist_group("torch_dtensor"),
              pytest.mark.skipif(not HAVE_TORCH, reason="torch missing")]

WORKER = Path(__file__).with_name("dtensor_worker.py")


def chunks_of(entry):
    """(start, shape, writing rank) of each chunk of a manifest array entry."""
    return sorted((c.start, c.shape, int(c.file[len("data-"):-len(".bin")])) for c in entry.chunks)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The 4-rank checkpoint, the values gathered at save time, and each rank's report."""
    root = tmp_path_factory.mktemp("dtensor")
    r = run_torch(4, WORKER, "save", root / "ckpt", root / "ref.npz", root / "bad",
                  timeout=90).check()
    assert sorted(r.results) == [0, 1, 2, 3]
    return {"dir": root / "ckpt", "ref": root / "ref.npz", "bad": root / "bad",
            "results": r.results, "root": root}


@pytest.fixture(scope="module")
def plain(saved):
    """One process loads the 4-rank checkpoint into plain torch objects (full arrays) and
    saves them again: a replicated checkpoint of the same values."""
    import torch

    from dtensor_worker import EXTRA, everything, model_and_optimizer

    model, opt = model_and_optimizer(seed=9)
    extra = {k: torch.zeros(shape, dtype=dtype) for k, (shape, dtype) in EXTRA.items()}
    state = {"model": model, "optimizer": opt, "extra": extra, "step": None}
    uckpt.load(saved["dir"], state)
    directory = saved["root"] / "plain"
    uckpt.save(directory, state)
    return {"dir": directory, "state": state, "values": everything(model, opt, extra)}


def reference(saved):
    return dict(np.load(saved["ref"]))


def test_each_rank_writes_its_own_rows(saved):
    """FSDP2 shards by rows, 10 rows as 3/3/3/1 and 3 rows as 1/1/1/0 (rank 3 holds an
    empty box): every parameter and Adam moment is written by the rank holding it."""
    m = uckpt.manifest(saved["dir"])
    assert m.world_size == 4
    rows10 = [((0,), 3, 0), ((3,), 3, 1), ((6,), 3, 2), ((9,), 1, 3)]
    rows3 = [((0,), 1, 0), ((1,), 1, 1), ((2,), 1, 2)]
    for index, (name, rows, tail) in enumerate([("0.weight", rows10, (6,)), ("0.bias", rows10, ()),
                                                ("2.weight", rows3, (10,)), ("2.bias", rows3, ())]):
        want = [(start + (0,) * len(tail), (n,) + tail, rank) for start, n, rank in rows]
        for path in (f"model/{name}", f"optimizer/state/{index}/exp_avg",
                     f"optimizer/state/{index}/exp_avg_sq"):
            assert chunks_of(m.arrays[path]) == want, path
    res = saved["results"]
    assert res[0]["boxes"]["0.weight"] == [[3, 6]] and res[3]["boxes"]["0.weight"] == [[1, 6]]
    assert res[3]["boxes"]["2.weight"] == [[0, 10]] and res[3]["boxes"]["2.bias"] == [[0]]
    # a 2-D mesh: the four quarters by their four ranks; Replicate() on one mesh dimension:
    # each box once, by one of the two ranks holding it; Replicate() everywhere: once in all
    assert chunks_of(m.arrays["extra/grid"]) == [((0, 0), (3, 4), 0), ((0, 4), (3, 4), 1),
                                                 ((3, 0), (3, 4), 2), ((3, 4), (3, 4), 3)]
    mixed = chunks_of(m.arrays["extra/mixed"])
    assert [(s, sh) for s, sh, _ in mixed] == [((0, 0), (3, 4)), ((3, 0), (2, 4))]
    assert mixed[0][2] in (0, 2) and mixed[1][2] in (1, 3)
    assert [(s, sh) for s, sh, _ in chunks_of(m.arrays["extra/rep"])] == [((0,), (4,))]
    # bfloat16, 2 columns over 4 ranks (ranks 2 and 3 empty); a mesh without rank 3
    assert chunks_of(m.arrays["extra/bf16"]) == [((0, 0), (7, 1), 0), ((0, 1), (7, 1), 1)]
    assert m.arrays["extra/bf16"].dtype == "bfloat16"
    assert chunks_of(m.arrays["extra/sub"]) == [((0,), (2,), 0), ((2,), (2,), 1), ((4,), (1,), 2)]
    assert uckpt.verify(saved["dir"]) is not None


def test_single_process_sees_full_arrays(saved, plain):
    """Without a communicator: uckpt.load(dir) gives the consolidated global arrays, and a
    load into plain tensors fills them whole; both bit for bit what full_tensor() gave."""
    want = reference(saved)
    tree = uckpt.load(saved["dir"])
    got = {f"model/{k}": v for k, v in tree["model"].items()}
    got.update({f"optimizer/state/{i}/{n}": v for i, s in tree["optimizer"]["state"].items()
                for n, v in s.items()})
    got.update({f"extra/{k}": v for k, v in tree["extra"].items()})
    got["extra/bf16"] = got["extra/bf16"].view(np.int16)
    assert sorted(got) == sorted(want) and tree["step"] == 2
    for key, value in want.items():
        assert got[key].dtype == value.dtype and got[key].tobytes() == value.tobytes(), key
    assert sorted(plain["values"]) == sorted(want) and plain["state"]["step"] == 2
    for key, value in want.items():
        assert plain["values"][key].tobytes() == value.tobytes(), key
    assert uckpt.manifest(plain["dir"]).world_size == 1


@pytest.mark.parametrize("ranks,mode", [(2, "fresh"), (3, "running")])
def test_reshard_onto_fewer_ranks(saved, plain, ranks, mode):
    """Saved by 4 ranks, loaded by 2 (an optimizer without state yet: its moments become
    DTensors laid out as their parameters) and by 3 (a running optimizer: its DTensor
    moments are read into in place); then the replicated checkpoint loads into the same
    DTensors. Parameters keep their memory; every value matches bit for bit."""
    want = sorted(reference(saved))
    r = run_torch(ranks, WORKER, "load", saved["dir"], plain["dir"], saved["ref"], mode,
                  timeout=90).check()
    assert sorted(r.results) == list(range(ranks))
    for rank, res in r.results.items():
        # the last rank is outside the mesh of "sub", where full_tensor() gives nothing
        expected = [k for k in want if not (k == "extra/sub" and rank == ranks - 1)]
        assert res["keys"] and res["step"] == 2, res
        assert res["equal"] == expected, (rank, sorted(set(want) - set(res["equal"])))
        assert res["plain_equal"] == expected, (rank, sorted(set(want) - set(res["plain_equal"])))
        assert res["moments_are_dtensors"], res
        kept = {"0.weight", "0.bias", "2.weight", "2.bias", "grid", "bf16"}
        if mode == "running":
            kept |= {f"{i}/{n}" for i in range(4) for n in ("exp_avg", "exp_avg_sq")}
        assert kept <= set(res["kept_memory"]), res
        # the core read into the DTensors' local memory; copied were only the moments
        # that did not exist yet (8 new DTensors) and the non-contiguous "grid"
        assert res["copies"] == (1 if mode == "running" else 9), res
        assert "UnsupportedObjectError" in res["partial_load"], res
        assert "Partial(sum) is a pending reduction" in res["partial_load"], res
        assert "ShapeMismatchError" in res["shape_load"], res
        assert "shape [4] in the checkpoint, [5] in the object" in res["shape_load"], res


def test_partial_is_refused_naming_the_leaf(saved):
    """A Partial DTensor has no value before its reduction: every rank refuses the save,
    naming the parameter, and nothing is committed. Strided sharding is refused too."""
    for res in saved["results"].values():
        refused = res["refused"]
        assert refused is not None and refused["unsupported"], res
        assert "failed on 4 of 4 rank(s)" in refused["msg"], refused
        assert "DTensor 'weight' (placements [Partial(sum)]) cannot be saved" in refused["msg"]
        assert "redistribute" in refused["msg"]
        assert "UnsupportedObjectError: 'strided': a DTensor with placements " \
               "[_StridedShard(dim=0, sf=2)] cannot be saved" in res["refused_strided"], res
        assert not res["bad_exists"]
    assert not saved["bad"].exists()
