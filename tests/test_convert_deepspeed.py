"""DeepSpeed ZeRO checkpoints in and out of uckpt (issue 30).

Real ZeRO-2 and ZeRO-3 checkpoints made by DeepSpeed on 2 CPU ranks (gloo) are converted to
uckpt and compared with DeepSpeed's own ``get_fp32_state_dict_from_zero_checkpoint``; the
uckpt checkpoint is written back as ZeRO checkpoints for 1 and 3 ranks, which DeepSpeed
resumes: the losses of the next steps (on the same global batches) are those of the
uninterrupted 2-rank run, bit for bit, and what the resumed engine saves at once reads back
as the same state. The quick tests build ZeRO checkpoints with uckpt's writer alone.
"""
import os
import pickle
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import multiproc
from uckpt.conversion import api
from uckpt.conversion.errors import RefusedGlobalError
from uckpt.conversion.options import OptionError
from uckpt.errors import CheckpointNotFoundError

WORKER = os.path.join(os.path.dirname(__file__), "deepspeed_worker.py")
ENV = {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
pytestmark = pytest.mark.xdist_group("deepspeed")


def _leaves(node, prefix=""):
    """path -> array or plain value, of an open tree."""
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            out.update(_leaves(v, f"{prefix}/{k}" if prefix else str(k)))
        return out
    return {prefix: node.read() if hasattr(node, "read") else node}


def _state(path, **kw):
    with api.open_checkpoint(path, **kw) as tree:
        return _leaves(tree.root)


def _assert_same(a, b, keys=None):
    keys = keys or sorted(a)
    assert sorted(a) == sorted(b)
    for k in keys:
        if isinstance(a[k], np.ndarray):
            assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
            assert a[k].tobytes() == b[k].tobytes(), k
        else:
            assert a[k] == b[k], k


# -- quick: uckpt's writer and reader, no DeepSpeed -------------------------------------------
def _synthetic(tmp_path, stage, ranks):
    """A ZeRO checkpoint of ``ranks`` ranks written by uckpt from a made-up state."""
    import uckpt

    rng = np.random.default_rng(stage)
    shapes = {"0.weight": (7, 5), "0.bias": (7,), "2.weight": (3, 7), "2.bias": (3,)}
    model = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    state = {n: {"step": np.float32(4.0),
                 "exp_avg": rng.standard_normal(s).astype(np.float32),
                 "exp_avg_sq": rng.random(s).astype(np.float32)} for n, s in shapes.items()}
    tree = {"model": model, "optimizer": {"state": state, "param_groups": [
        {"lr": 0.01, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0,
         "params": list(shapes)}]},
        "lr_scheduler": {"last_batch_iteration": 3}, "global_steps": 4, "skipped_steps": 0,
        "global_samples": 24, "client_state": {"epoch": 1},
        "deepspeed": {"zero_stage": stage, "world_size": 2, "ds_version": "0.19.8",
                      "ds_config": {"zero_optimization": {"stage": stage}}, "buffer_names": [],
                      "bf16": False}}
    uckpt.save(tmp_path / "src", tree)
    api.convert(tmp_path / "src", tmp_path / "zero", dst_format="deepspeed", ranks=ranks)
    return tmp_path / "zero", tree


@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("ranks", [1, 3, 4])
def test_written_zero_checkpoint_reads_back_bit_for_bit(tmp_path, stage, ranks):
    zero, tree = _synthetic(tmp_path, stage, ranks)
    assert (zero / "latest").read_text() == "global_step4"
    assert api.open_checkpoint(zero).format == "deepspeed"
    back = _state(zero)
    for name, arr in tree["model"].items():
        assert back[f"model/{name}"].tobytes() == arr.tobytes()
        for key in ("exp_avg", "exp_avg_sq"):
            assert back[f"optimizer/state/{name}/{key}"].tobytes() == \
                tree["optimizer"]["state"][name][key].tobytes()
    assert back["deepspeed/world_size"] == ranks and back["deepspeed/zero_stage"] == stage
    assert back["global_steps"] == 4 and back["client_state/epoch"] == 1
    assert back["lr_scheduler/last_batch_iteration"] == 3


def test_a_hostile_pickle_in_a_rank_file_is_refused_naming_the_global(tmp_path):
    zero, _ = _synthetic(tmp_path, 2, 2)
    victim = zero / "global_step4" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    marker = tmp_path / "ran"
    payload = pickle.dumps({"optimizer_state_dict": _Boom(str(marker))}, protocol=2)
    with zipfile.ZipFile(victim, "w") as z:
        z.writestr("archive/data.pkl", payload)
    with pytest.raises(RefusedGlobalError, match=r"posix\.system.*refuses to load") as e:
        api.open_checkpoint(zero)
    assert e.value.name == "posix.system" and str(victim) in str(e.value)
    assert not marker.exists()


class _Boom:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_missing_latest_tag_and_rank_files_are_named(tmp_path):
    zero, _ = _synthetic(tmp_path, 2, 3)
    step = zero / "global_step4"
    for rank in (1, 2):  # one in the middle, the last (found by the count of ranks)
        shutil.move(step / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt", tmp_path / "away")
        with pytest.raises(CheckpointNotFoundError, match=rf"rank\(s\) \[{rank}\] are missing "
                           rf"\(zero_pp_rank_{rank}_mp_rank_00_optim_states\.pt\)"):
            api.open_checkpoint(zero)
        shutil.move(tmp_path / "away", step / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")
    (zero / "latest").write_text("global_step9")
    with pytest.raises(CheckpointNotFoundError, match=r"names 'global_step9'.*global_step9' "
                       r"does not exist"):
        api.open_checkpoint(zero)
    (zero / "latest").unlink()
    with pytest.raises(CheckpointNotFoundError, match=r"has neither latest nor "
                       r"mp_rank_00_model_states\.pt"):
        api.open_checkpoint(zero, "deepspeed")
    (step / "mp_rank_00_model_states.pt").unlink()
    (zero / "latest").write_text("global_step4")
    with pytest.raises(CheckpointNotFoundError, match=r"mp_rank_00_model_states\.pt' is "
                       r"missing from the DeepSpeed checkpoint"):
        api.open_checkpoint(zero)


def test_cli_converts_zero_to_uckpt_and_back_for_other_ranks(tmp_path):
    zero, tree = _synthetic(tmp_path, 3, 2)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [os.path.join(os.path.dirname(__file__), "..", "src"), os.environ.get("PYTHONPATH", "")])}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "uckpt.cli.main", "convert", "-q",
                               *map(str, args)], env=env, capture_output=True, text=True)

    assert cli(zero, tmp_path / "u").returncode == 0
    out = cli(tmp_path / "u", tmp_path / "back", "--to", "deepspeed", "--ranks", "3")
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in (tmp_path / "back" / "global_step4").iterdir()) == [
        f"zero_pp_rank_{r}_mp_rank_00_{kind}_states.pt" for r in range(3)
        for kind in ("model", "optim")]
    back = _state(tmp_path / "back")
    assert back["model/2.weight"].tobytes() == tree["model"]["2.weight"].tobytes()
    bad = cli(tmp_path / "u", tmp_path / "x.npz", "--ranks", "3")
    assert bad.returncode != 0 and "ranks=3" in bad.stderr and "--to deepspeed" in bad.stderr


def test_ranks_is_refused_for_other_targets(tmp_path):
    zero, _ = _synthetic(tmp_path, 2, 2)
    with pytest.raises(OptionError, match=r"ranks=2.*not for npz"):
        api.convert(zero, tmp_path / "x.npz", ranks=2)


# -- slow: real DeepSpeed runs on 2 ranks, resumed on 1 and 3 ---------------------------------
def _run(ranks, *args):
    return multiproc.run_torch(ranks, WORKER, *args, timeout=300, env=ENV).check()


@pytest.fixture(scope="module", params=[2, 3])
def trained(request, tmp_path_factory):
    """(stage, the ZeRO checkpoint after 3 steps on 2 ranks, the losses of 2 more steps)."""
    base = tmp_path_factory.mktemp(f"zero{request.param}")
    run = _run(2, "train", request.param, base / "ckpt")
    losses = {r["losses"] and tuple(r["losses"]) for r in run.results.values()}
    assert len(run.results) == 2 and len(losses) == 1
    yield request.param, base / "ckpt", losses.pop()
    shutil.rmtree(base, ignore_errors=True)


def test_zero_checkpoint_converts_to_what_zero_to_fp32_gives(trained, tmp_path):
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    stage, ckpt, _ = trained
    api.convert(ckpt, tmp_path / "u")
    got = _state(tmp_path / "u")
    ref = get_fp32_state_dict_from_zero_checkpoint(str(ckpt))
    assert sorted(k for k in got if k.startswith("model/")) == sorted(f"model/{k}" for k in ref)
    for name, tensor in ref.items():
        want = tensor.detach().numpy()
        assert got[f"model/{name}"].shape == want.shape
        assert got[f"model/{name}"].tobytes() == want.tobytes(), name
        assert got[f"optimizer/state/{name}/exp_avg"].shape == want.shape
        assert got[f"optimizer/state/{name}/step"] == np.float32(3)
    assert got["deepspeed/zero_stage"] == stage and got["deepspeed/world_size"] == 2
    assert got["global_steps"] == 3 and got["client_state/epoch"] == 7
    assert got["lr_scheduler/last_batch_iteration"] == 2


@pytest.mark.parametrize("ranks", [1, 3])
def test_deepspeed_resumes_the_conversion_on_other_rank_counts(trained, tmp_path, ranks):
    stage, ckpt, losses = trained
    api.convert(ckpt, tmp_path / "u")
    api.convert(tmp_path / "u", tmp_path / "zero", dst_format="deepspeed", ranks=ranks)
    run = _run(ranks, "resume", stage, tmp_path / "zero", tmp_path / "again")
    assert len(run.results) == ranks
    for result in run.results.values():  # the same global batches: the same losses, bitwise
        assert tuple(result["losses"]) == losses and result["steps"] == 5
    # what DeepSpeed loaded (saved at once, before training on) is the state converted
    first, again = _state(ckpt), _state(tmp_path / "again")
    keys = [k for k in first if k.startswith(("model/", "optimizer/state/"))] + \
        ["global_steps", "skipped_steps", "lr_scheduler/last_batch_iteration",
         "client_state/epoch"]
    for k in keys:
        a, b = first[k], again[k]
        assert (a.tobytes() == b.tobytes()) if isinstance(a, np.ndarray) else a == b, k
    assert again["deepspeed/world_size"] == ranks
