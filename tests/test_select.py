"""``select=`` on ``uckpt.load``, ``CheckpointManager.restore`` and ``uckpt convert``
(issue 29 item 3): only the picked leaves are read and restored; the rest of the state
is left as it is; a pattern that picks nothing is refused by name."""
import subprocess
import sys

import numpy as np
import pytest

import uckpt
import uckpt_chainer  # noqa: F401  (before chainer: the NumPy 2 shim)
from uckpt.errors import ChecksumMismatchError, KeyMismatchError, OptionsError, UnknownKeyError
from test_lazy_open import damage, counted

torch = pytest.importorskip("torch")
chainer = pytest.importorskip("chainer")
import chainer.functions as F  # noqa: E402
import chainer.links as L  # noqa: E402


def plain_state():
    return {"model": {"enc.weight": np.arange(4096, dtype=np.float32).reshape(64, 64),
                      "dec.weight": np.ones((64, 64), np.float32)},
            "head": np.full(128, 7, np.int64),
            "meta": {"lr": 0.1, "sched": [np.zeros(2), 3]}}


def test_load_without_state_reads_the_selected_arrays_alone(tmp_path):
    uckpt.save(tmp_path / "ck", plain_state())
    blob, source = counted(tmp_path, "ck")
    got = uckpt.load(source, select=["model/enc.*", "meta/sched/1"])
    assert list(got) == ["model", "meta"] and list(got["model"]) == ["enc.weight"]
    np.testing.assert_array_equal(got["model"]["enc.weight"], plain_state()["model"]["enc.weight"])
    assert got["meta"] == {"sched": [None, 3]}  # list items not picked: None, indices kept
    entry = uckpt.manifest(tmp_path / "ck").arrays["model/enc.weight"]
    stored = sum(c.length for c in entry.chunks)
    assert sum(blob.read.values()) == (tmp_path / "ck" / "manifest.json").stat().st_size + stored


def test_damage_outside_the_selection_is_not_read_inside_it_raises(tmp_path):
    uckpt.save(tmp_path / "ck", plain_state())
    damage(tmp_path / "ck", "model/dec.weight", 0)
    got = uckpt.load(tmp_path / "ck", select=["model/enc.weight", "head"])
    assert (got["head"] == 7).all()
    with pytest.raises(ChecksumMismatchError, match=r"checksum mismatch in leaf "
                                                    r"'model/dec.weight'"):
        uckpt.load(tmp_path / "ck", select="model/dec*")


def test_a_node_path_selects_below_it_and_star_crosses_slashes(tmp_path):
    uckpt.save(tmp_path / "ck", plain_state())
    assert set(uckpt.load(tmp_path / "ck", select="model")["model"]) == {"enc.weight",
                                                                        "dec.weight"}
    assert set(uckpt.load(tmp_path / "ck", select="*weight")) == {"model"}
    assert uckpt.load(tmp_path / "ck", select="meta/lr") == {"meta": {"lr": 0.1}}


def test_a_pattern_that_picks_nothing_is_refused_by_name(tmp_path):
    uckpt.save(tmp_path / "ck", plain_state())
    with pytest.raises(UnknownKeyError, match=r"select pattern 'modle/\*' names no leaf of "
                                              r".*nearest: 'model/") as e:
        uckpt.load(tmp_path / "ck", select=["model/*", "modle/*"])
    assert isinstance(e.value, KeyError)
    for bad in ([], "", [3], {"model": 1}):
        with pytest.raises(OptionsError, match=r"select=.*give a glob pattern"):
            uckpt.load(tmp_path / "ck", select=bad)


def test_restore_into_numpy_state_leaves_the_rest_untouched(tmp_path):
    uckpt.save(tmp_path / "ck", plain_state())
    state = {"model": {"enc.weight": np.zeros((64, 64), np.float32),
                       "dec.weight": np.zeros((64, 64), np.float32)},
             "meta": {"lr": 9.0, "sched": [np.ones(2), 8]}}
    out = uckpt.load(tmp_path / "ck", state, select=["model/dec.weight", "meta/sched/1"])
    assert (state["model"]["dec.weight"] == 1).all() and (state["model"]["enc.weight"] == 0).all()
    assert state["meta"]["lr"] == 9.0
    assert state["meta"]["sched"][1] == 3 and (state["meta"]["sched"][0] == 1).all()
    assert list(out) == ["model", "meta"] and list(out["model"]) == ["dec.weight"]


def test_strict_applies_to_the_keys_holding_selected_leaves(tmp_path):
    uckpt.save(tmp_path / "ck", plain_state())
    head = np.zeros(128, np.int64)
    # "model" and "meta" hold nothing selected: neither unexpected nor needed
    uckpt.load(tmp_path / "ck", {"head": head}, select="head")
    assert (head == 7).all()
    with pytest.raises(KeyMismatchError, match=r"unexpected in the checkpoint \(1\): head"):
        uckpt.load(tmp_path / "ck", {"other": np.zeros(1)}, select="head")
    assert uckpt.load(tmp_path / "ck", {"other": np.zeros(1)}, select="head",
                      strict=False) == {}


def torch_pair():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.ones(3, 8)).sum().backward()
    opt.step()
    return model, opt


def test_torch_module_and_optimizer_restore_only_the_selected_leaves(tmp_path):
    model, opt = torch_pair()
    uckpt.save(tmp_path / "ck", {"model": model, "opt": opt})
    torch.manual_seed(1)
    fresh = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 2))
    fresh_opt = torch.optim.Adam(fresh.parameters(), lr=0.5)
    fresh(torch.ones(3, 8)).sum().backward()
    fresh_opt.step()
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    before_opt = {i: {k: v.clone() for k, v in s.items()} for i, s in
                  enumerate(fresh_opt.state.values())}
    out = uckpt.load(tmp_path / "ck", {"model": fresh, "opt": fresh_opt},
                     select=["model/0.weight", "opt/state/0/*"])
    assert torch.equal(fresh[0].weight, model[0].weight)
    for key in ("0.bias", "1.weight", "1.bias"):
        assert torch.equal(fresh.state_dict()[key], before[key]), key
    saved_state = list(opt.state.values())[0]
    live = list(fresh_opt.state.values())
    assert torch.equal(live[0]["exp_avg"], saved_state["exp_avg"])
    assert torch.equal(live[1]["exp_avg"], before_opt[1]["exp_avg"])
    assert fresh_opt.param_groups[0]["lr"] == 0.5  # a hyperparameter not picked
    assert set(out) == {"model", "opt"} and list(out["model"]) == ["0.weight"]


def test_chainer_link_and_optimizer_restore_only_the_selected_leaves(tmp_path):
    def pair(seed, alpha):
        np.random.seed(seed)
        link = chainer.Sequential(L.Linear(4, 3), L.Linear(3, 2))
        opt = chainer.optimizers.Adam(alpha=alpha)
        opt.setup(link)
        loss = F.sum(link(np.ones((1, 4), np.float32)))
        link.cleargrads()
        loss.backward()
        opt.update()
        return link, opt

    link, opt = pair(0, 0.001)
    uckpt.save(tmp_path / "ck", {"model": link, "opt": opt})
    fresh, fresh_opt = pair(1, 0.5)
    w1 = fresh[1].W.array.copy()
    m1 = fresh[1].W.update_rule.state["m"].copy()
    uckpt.load(tmp_path / "ck", {"model": fresh, "opt": fresh_opt},
               select=["model/0/W", "opt/0/W/*"])
    np.testing.assert_array_equal(fresh[0].W.array, link[0].W.array)
    np.testing.assert_array_equal(fresh[1].W.array, w1)
    np.testing.assert_array_equal(fresh[0].W.update_rule.state["m"],
                                  link[0].W.update_rule.state["m"])
    np.testing.assert_array_equal(fresh[1].W.update_rule.state["m"], m1)
    assert fresh_opt.alpha == 0.5


def test_manager_restore_with_select(tmp_path):
    model, opt = torch_pair()
    with uckpt.CheckpointManager(tmp_path / "run") as mgr:
        mgr.save(3, {"model": model, "opt": opt})
        mgr.wait()
        torch.manual_seed(1)
        fresh = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 2))
        bias = fresh[1].bias.detach().clone()
        assert mgr.restore({"model": fresh}, select="model/1.weight") == 3
    assert torch.equal(fresh[1].weight, model[1].weight)
    assert torch.equal(fresh[1].bias, bias)


def test_convert_select_patterns(tmp_path):
    from safetensors.numpy import load_file

    uckpt.save(tmp_path / "ck", plain_state())
    uckpt.convert(tmp_path / "ck", tmp_path / "a.safetensors", select=["model/enc.*", "head"])
    assert sorted(load_file(tmp_path / "a.safetensors")) == ["head", "model/enc.weight"]
    # one path without wildcards: that node becomes the root, as before
    uckpt.convert(tmp_path / "ck", tmp_path / "c.safetensors", select="model")
    assert sorted(load_file(tmp_path / "c.safetensors")) == ["dec.weight", "enc.weight"]
    with pytest.raises(UnknownKeyError, match=r"--select pattern 'nope\*' names no leaf"):
        uckpt.convert(tmp_path / "ck", tmp_path / "d.safetensors", select=["head", "nope*"])
    assert not (tmp_path / "d.safetensors").exists()


def test_convert_cli_select_is_repeatable(tmp_path):
    from safetensors.numpy import load_file

    uckpt.save(tmp_path / "ck", plain_state())
    done = subprocess.run([sys.executable, "-m", "uckpt", "convert", str(tmp_path / "ck"),
                           str(tmp_path / "b.safetensors"), "--select", "*dec*",
                           "--select", "head", "-q"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    got = load_file(tmp_path / "b.safetensors")
    assert sorted(got) == ["head", "model/dec.weight"] and (got["head"] == 7).all()


def test_keras_model_and_optimizer_restore_only_the_selected_leaves(tmp_path):
    keras = pytest.importorskip("keras")

    def pair(seed):
        keras.utils.set_random_seed(seed)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="d0"),
                                  keras.layers.Dense(2, name="d1")])
        opt = keras.optimizers.Adam(0.01)
        model.compile(opt, "mse")
        model.fit(np.ones((4, 4)), np.ones((4, 2)), verbose=0)
        return model, opt

    model, opt = pair(0)
    uckpt.save(tmp_path / "ck", {"model": model, "opt": opt})
    fresh, fresh_opt = pair(1)
    d1 = fresh.get_layer("d1").kernel.numpy().copy()
    slots = [v.numpy().copy() for v in fresh_opt.variables]
    assert not np.array_equal(slots[4], opt.variables[4].numpy())  # (the check below can fail)
    # the first dense layer's kernel, and the Adam slots of that kernel (slots/0)
    uckpt.load(tmp_path / "ck", {"model": fresh, "opt": fresh_opt},
               select=["model/dense/kernel", "opt/slots/0/*"])
    np.testing.assert_array_equal(fresh.get_layer("d0").kernel.numpy(),
                                  model.get_layer("d0").kernel.numpy())
    np.testing.assert_array_equal(fresh.get_layer("d1").kernel.numpy(), d1)
    np.testing.assert_array_equal(fresh_opt.variables[2].numpy(), opt.variables[2].numpy())
    np.testing.assert_array_equal(fresh_opt.variables[4].numpy(), slots[4])  # d0 bias momentum
