"""The real frameworks load what uckpt converts (issue 6, item 3), beyond the CLI matrix:
Keras legacy .h5 files, Chainer model and optimizer files through a chain of formats, every
dtype through torch.load, shared storages, and sharded DCP checkpoints."""
import os
import socket
import warnings
import zipfile

import ml_dtypes
import numpy as np
import pytest

import uckpt
from convert_common import TARGETS, rich_state, target
from convert_sources import (assert_chainer_equal, assert_keras_equal, chainer_trainer,
                             keras_model, trained_keras_model)
from uckpt.conversion import ConvertWarning, UnknownFormatError, convert, diff

pytestmark = pytest.mark.filterwarnings("ignore::uckpt.conversion.ConvertWarning")


@pytest.mark.parametrize("fmt", TARGETS)
def test_keras_legacy_h5_round_trip(tmp_path, fmt):
    """model.save("m.h5") (legacy HDF5: model_config, layer_names and weight_names attributes)
    -> fmt -> .h5: keras.models.load_model and model.load_weights both accept it."""
    import keras

    model = trained_keras_model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "HDF5 ... is considered legacy"
        model.save(tmp_path / "m.h5")
    mid = target(tmp_path, "mid", fmt)
    convert(tmp_path / "m.h5", mid)
    convert(mid, tmp_path / "back.h5")
    # compile=False: this Keras cannot compile a legacy file's "mse" loss, even the original
    loaded = keras.models.load_model(tmp_path / "back.h5", compile=False)
    assert_keras_equal(model, loaded, optimizer=False)
    again = keras_model()
    again.load_weights(tmp_path / "back.h5")
    assert_keras_equal(model, again, optimizer=False)
    assert diff(tmp_path / "m.h5", tmp_path / "back.h5").identical


def test_keras_legacy_save_weights_h5(tmp_path):
    """The weights-only legacy layout (what tf.keras' save_weights wrote to .h5: layer groups
    at the root, layer_names on the file) -> NPZ -> Pickle -> .h5: load_weights accepts it."""
    import h5py
    from keras.src.legacy.saving import legacy_h5_format

    model = trained_keras_model()
    with h5py.File(tmp_path / "w.h5", "w") as f:
        legacy_h5_format.save_weights_to_hdf5_group(f, model)
    convert(tmp_path / "w.h5", tmp_path / "w.npz")
    convert(tmp_path / "w.npz", tmp_path / "w.pt")
    convert(tmp_path / "w.pt", tmp_path / "back.h5")
    again = keras_model()
    again.load_weights(tmp_path / "back.h5")
    assert_keras_equal(model, again, optimizer=False)


def test_keras_archive_is_read(tmp_path):
    """A .keras archive is a source of its own (issue 14; tests/test_convert_keras.py)."""
    model = keras_model()
    model.save(tmp_path / "m.keras")
    assert convert(tmp_path / "m.keras", tmp_path / "out").src_format == "keras"


def test_chainer_chain_npz_hdf5_pickle_uckpt_npz_is_bit_exact(tmp_path):
    """save_npz of a link and of its optimizer -> HDF5 -> Pickle -> uckpt -> NPZ: every array
    bit-exact with its dtype and name, and load_npz restores model and optimizer."""
    import uckpt_chainer  # noqa: F401  (NumPy 2 shim, before chainer)
    import chainer

    _, model, opt = chainer_trainer(tmp_path / "run")
    for name, obj in (("model", model), ("opt", opt)):
        chainer.serializers.save_npz(tmp_path / f"{name}.npz", obj)
        prev = tmp_path / f"{name}.npz"
        for step, ext in enumerate((".h5", ".pt", "", ".npz")):
            nxt = tmp_path / f"{name}_{step}{ext}"
            convert(prev, nxt)
            prev = nxt
        with np.load(tmp_path / f"{name}.npz") as a, np.load(prev) as b:
            assert set(b.files) == set(a.files) | {"__uckpt__"}
            for k in a.files:
                assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
                assert a[k].tobytes() == b[k].tobytes(), k
    _, model2, opt2 = chainer_trainer(tmp_path / "run2", epochs=0)
    chainer.serializers.load_npz(tmp_path / "model_3.npz", model2)
    chainer.serializers.load_npz(tmp_path / "opt_3.npz", opt2)
    assert_chainer_equal(model, model2, opt, opt2)


def test_torch_loads_every_dtype_and_maps_files(tmp_path):
    """A pickle uckpt writes (without torch) holds every dtype torch.load(weights_only=True)
    reads back bit for bit, with 64-byte aligned storages that torch can memory-map."""
    import torch

    state = rich_state()
    uckpt.save(tmp_path / "src", state)
    convert(tmp_path / "src", tmp_path / "all.pt")
    for mmap in (False, True):
        obj = torch.load(tmp_path / "all.pt", weights_only=True, mmap=mmap)
        for name, arr in state["dtypes"].items():
            t = obj["dtypes"][name]
            assert str(t.dtype) == f"torch.{name}" and tuple(t.shape) == arr.shape
            assert t.view(torch.uint8).numpy().tobytes() == arr.tobytes(), name
    assert obj["optimizer"]["state"][0]["step"].item() == 3.0
    assert obj["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.999)
    assert obj["blob"] == b"\x00\xffbytes" and obj["big"] == 2 ** 70
    assert obj["tied"].untyped_storage().data_ptr() == \
        obj["model"]["weight"].untyped_storage().data_ptr()  # stored once, shared
    with zipfile.ZipFile(tmp_path / "all.pt") as z, open(tmp_path / "all.pt", "rb") as f:
        for info in z.infolist():
            if "/data/" in info.filename:
                f.seek(info.header_offset + 26)
                n, e = (int.from_bytes(f.read(2), "little") for _ in range(2))
                assert (info.header_offset + 30 + n + e) % 64 == 0, info.filename


def test_torch_shared_storage_is_kept(tmp_path):
    """Tied weights (one storage, two names) stay one storage through uckpt and back."""
    import torch

    emb = torch.nn.Embedding(5, 3)
    head = torch.nn.Linear(3, 5, bias=False)
    head.weight = emb.weight
    sd = {"emb.weight": emb.weight.detach(), "head.weight": head.weight.detach()}
    torch.save(sd, tmp_path / "tied.pt")
    convert(tmp_path / "tied.pt", tmp_path / "u")
    assert uckpt.manifest(tmp_path / "u").tree["items"]["head.weight"]["path"] == "emb.weight"
    convert(tmp_path / "u", tmp_path / "back.pt")
    back = torch.load(tmp_path / "back.pt", weights_only=True)
    assert back["emb.weight"].data_ptr() == back["head.weight"].data_ptr()


def test_framework_objects_written_to_pickle_are_named(tmp_path):
    """A uckpt checkpoint of torch objects: tensors stay tensors silently, a module becomes its
    state dict with a warning naming it, and the way back restores the object nodes."""
    import torch

    model = torch.nn.Linear(2, 3)
    uckpt.save(tmp_path / "a", {"sd": model.state_dict(), "model": model})
    with pytest.warns(ConvertWarning) as caught:
        convert(tmp_path / "a", tmp_path / "b.pt")
    (message,) = [str(w.message) for w in caught]
    assert message.endswith(": model (torch.nn.modules.linear.Linear)")
    back = torch.load(tmp_path / "b.pt", weights_only=True)
    assert torch.equal(back["model"]["weight"], model.weight.detach())
    convert(tmp_path / "b.pt", tmp_path / "c")
    assert uckpt.manifest(tmp_path / "c").tree == uckpt.manifest(tmp_path / "a").tree


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _save_sharded(rank, path, port):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    full = torch.arange(48.0).reshape(6, 8).to(torch.bfloat16)
    dcp.save({"rows": distribute_tensor(full, mesh, [Shard(0)]),
              "cols": distribute_tensor(full, mesh, [Shard(1)]), "step": 9}, checkpoint_id=path)
    dist.destroy_process_group()


def test_sharded_dcp_is_assembled(tmp_path):
    """A DCP checkpoint saved by 2 ranks (tensors sharded by rows and by columns) reads back as
    whole tensors, bit for bit."""
    import torch
    import torch.multiprocessing as mp

    mp.spawn(_save_sharded, args=(str(tmp_path / "dcp"), _free_port()), nprocs=2)
    assert len(list((tmp_path / "dcp").glob("*.distcp"))) == 2
    convert(tmp_path / "dcp", tmp_path / "whole.pt")
    back = torch.load(tmp_path / "whole.pt", weights_only=True)
    full = torch.arange(48.0).reshape(6, 8).to(torch.bfloat16)
    assert torch.equal(back["rows"], full) and torch.equal(back["cols"], full)
    assert back["step"] == 9
    convert(tmp_path / "dcp", tmp_path / "u")
    assert uckpt.load(tmp_path / "u")["cols"].dtype == ml_dtypes.bfloat16
