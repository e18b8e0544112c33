"""Checkpoints written by the real frameworks, and checks that the frameworks load a converted
copy back (issue 6, item 3). Each ``make_*`` writes a source into a directory and returns
``(path, check)``; ``check(path)`` loads a file of the source's format with the framework and
compares every value with the original. Frameworks are imported only when used."""
import os
import warnings
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


# -- PyTorch -------------------------------------------------------------------------------------
def torch_pair(seed=0):
    """A model (Linear, BatchNorm, Linear) and an Adam optimizer after one step."""
    import torch

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4),
                                torch.nn.Linear(4, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.8, 0.99))
    model(torch.randn(5, 3)).square().sum().backward()
    opt.step()
    return model, opt


def assert_torch_loads(obj, model, opt):
    """``obj`` (what torch.load gave) restores into a fresh model and optimizer with strict
    checks, and every tensor and hyperparameter equals the original's."""
    import torch

    model2, _ = torch_pair(seed=1)
    opt2 = torch.optim.Adam(model2.parameters(), lr=0.5)
    model2.load_state_dict(obj["model"], strict=True)
    opt2.load_state_dict(obj["optimizer"])
    for (k, a), b in zip(model.state_dict().items(), model2.state_dict().values()):
        assert a.dtype == b.dtype and torch.equal(a, b), k
    sa, sb = opt.state_dict(), opt2.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    for i, entry in sa["state"].items():
        for k, v in entry.items():
            assert v.dtype == sb["state"][i][k].dtype and torch.equal(v, sb["state"][i][k])


def make_pickle(directory: Path):
    import torch

    model, opt = torch_pair()
    extra = torch.randn(2, 3).to(torch.bfloat16)
    path = directory / "torch.pt"
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3,
                "bf16": extra}, path)

    def check(back: Path) -> None:
        obj = torch.load(back, weights_only=True)
        assert_torch_loads(obj, model, opt)
        assert obj["epoch"] == 3 and obj["bf16"].dtype == torch.bfloat16
        assert torch.equal(obj["bf16"].view(torch.int16), extra.view(torch.int16))
    return path, check


def make_dcp(directory: Path):
    import torch
    import torch.distributed.checkpoint as dcp

    model, opt = torch_pair()
    path = directory / "dcp"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "saving in a single process"
        dcp.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 7},
                 checkpoint_id=path)

    def check(back: Path) -> None:
        obj = torch.load(back, weights_only=True)
        model2, _ = torch_pair(seed=1)
        model2.load_state_dict(obj["model"], strict=True)
        for a, b in zip(model.state_dict().values(), model2.state_dict().values()):
            assert torch.equal(a, b)
        # DCP writes dict keys as strings; the reader maps the optimizer's state back to the
        # parameter ids its param_groups name (issue 14), so load_state_dict restores it
        for i, entry in opt.state_dict()["state"].items():
            for k, v in entry.items():
                assert torch.equal(v, obj["optimizer"]["state"][i][k])
        assert obj["optimizer"]["param_groups"] == opt.state_dict()["param_groups"]
        assert obj["step"] == 7
    return path, check


def make_safetensors(directory: Path):
    import torch
    from safetensors.torch import load_file, save_file

    model, _ = torch_pair()
    model = model.to(torch.bfloat16)
    path = directory / "model.safetensors"
    save_file(model.state_dict(), path)

    def check(back: Path) -> None:
        model2, _ = torch_pair(seed=1)
        model2 = model2.to(torch.bfloat16)
        model2.load_state_dict(load_file(back), strict=True)
        for a, b in zip(model.state_dict().values(), model2.state_dict().values()):
            assert a.dtype == b.dtype and torch.equal(a, b)
    return path, check


def make_uckpt(directory: Path):
    """Saved by uckpt's own torch adapters: framework objects in the tree."""
    import uckpt

    model, opt = torch_pair()
    path = directory / "uckpt_ckpt"
    uckpt.save(path, {"model": model, "optimizer": opt, "epoch": 3}, step=11)

    def check(back: Path) -> None:
        import torch

        model2, _ = torch_pair(seed=1)
        opt2 = torch.optim.Adam(model2.parameters(), lr=0.5)
        loaded = uckpt.load(back, {"model": model2, "optimizer": opt2, "epoch": None})
        assert loaded["epoch"] == 3 and uckpt.manifest(back).step == 11
        assert_torch_loads({"model": model2.state_dict(), "optimizer": opt2.state_dict()},
                           model, opt)
    return path, check


# -- Keras -------------------------------------------------------------------------------------
def keras_model():
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, name="d1"),
                              keras.layers.BatchNormalization(), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse")
    return model


def trained_keras_model():
    model = keras_model()
    rng = np.random.default_rng(0)
    model.fit(rng.random((8, 3)), rng.random((8, 2)), verbose=0, epochs=1, batch_size=4)
    return model


def assert_keras_equal(a, b, optimizer=True) -> None:
    for x, y in zip(a.weights, b.weights):
        assert np.array_equal(np.asarray(x), np.asarray(y)), x.path
    if optimizer:
        assert len(a.optimizer.variables) == len(b.optimizer.variables)
        for x, y in zip(a.optimizer.variables, b.optimizer.variables):
            assert np.array_equal(np.asarray(x), np.asarray(y)), x.path


def make_hdf5(directory: Path):
    model = trained_keras_model()
    path = directory / "keras.weights.h5"
    model.save_weights(path)

    def check(back: Path) -> None:  # Keras wants the name to end with .weights.h5
        model2 = keras_model()
        model2.optimizer.build(model2.trainable_variables)
        model2.load_weights(back)
        assert_keras_equal(model, model2)
    return path, check


# -- Chainer -----------------------------------------------------------------------------------
def chainer_trainer(out: Path, epochs: int = 1):
    """A Chainer trainer (model, Adam, iterator, LogReport) run for ``epochs`` epochs."""
    import uckpt_chainer  # noqa: F401  (NumPy 2 shim, before chainer)
    import chainer
    import chainer.functions as F
    import chainer.links as L
    from chainer import training
    from chainer.training import extensions

    chainer.global_config.cudnn_deterministic = True
    rng = np.random.RandomState(0)
    model = L.Classifier(chainer.Sequential(L.Linear(3, 4, initialW=rng.randn(4, 3) * 0.1),
                                            F.relu, L.Linear(4, 2, initialW=rng.randn(2, 4) * 0.1)))
    opt = chainer.optimizers.Adam()
    opt.setup(model)
    data = chainer.datasets.TupleDataset(rng.rand(8, 3).astype("f"),
                                         rng.randint(0, 2, 8).astype("i"))
    it = chainer.iterators.SerialIterator(data, 4, shuffle=False)
    updater = training.updaters.StandardUpdater(it, opt)
    trainer = training.Trainer(updater, (epochs, "epoch"), out=str(out))
    trainer.extend(extensions.LogReport())
    if epochs:
        trainer.run()
    return trainer, model, opt


def assert_chainer_equal(model_a, model_b, opt_a=None, opt_b=None) -> None:
    for (name, p), q in zip(model_a.namedparams(), model_b.params()):
        assert p.array.dtype == q.array.dtype and np.array_equal(p.array, q.array), name
    if opt_a is not None:
        assert opt_a.t == opt_b.t and opt_a.epoch == opt_b.epoch
        for name, p in model_a.namedparams():
            q = dict(model_b.namedparams())[name]
            for k, v in p.update_rule.state.items():
                assert np.array_equal(v, q.update_rule.state[k]), (name, k)


def make_npz(directory: Path):
    """A Chainer trainer snapshot: model, optimizer, iterator, LogReport's log (a string)."""
    import uckpt_chainer  # noqa: F401  (NumPy 2 shim, before chainer)
    import chainer

    trainer, model, opt = chainer_trainer(directory / "run")
    path = directory / "snapshot.npz"
    chainer.serializers.save_npz(path, trainer)

    def check(back: Path) -> None:
        trainer2, model2, opt2 = chainer_trainer(directory / "run2", epochs=0)
        chainer.serializers.load_npz(back, trainer2)
        assert_chainer_equal(model, model2, opt, opt2)
        assert trainer2.updater.iteration == trainer.updater.iteration
        assert trainer2.get_extension("LogReport").log == trainer.get_extension("LogReport").log
    return path, check


SOURCES = {"pickle": make_pickle, "hdf5": make_hdf5, "npz": make_npz,
           "safetensors": make_safetensors, "uckpt": make_uckpt, "dcp": make_dcp}
