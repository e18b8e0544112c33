"""Conversions are faithful: every array bit-exact with its dtype, names, nesting, plain values,
NumPy scalars and shared arrays kept, through every format and back (Python API, no
framework needed)."""
import json
import warnings

import h5py
import ml_dtypes
import numpy as np
import pytest

import uckpt
from convert_common import EXT, TARGETS, rich_state, target
from uckpt.conversion import ConvertWarning, convert, diff, open_checkpoint
from uckpt.conversion.interchange import Leaf

pytestmark = pytest.mark.filterwarnings("ignore::uckpt.conversion.ConvertWarning")


@pytest.fixture(scope="module")
def rich(tmp_path_factory):
    path = tmp_path_factory.mktemp("rich") / "ckpt"
    uckpt.save(path, rich_state(), step=42, metadata={"run": "convert-test"})
    return path


def assert_same_checkpoint(a, b):
    """Same manifest tree (structure, plain values, sharing), step, metadata and bits."""
    ma, mb = uckpt.manifest(a), uckpt.manifest(b)
    assert ma.tree == mb.tree
    assert (ma.step, ma.metadata) == (mb.step, mb.metadata)
    assert {p: (e.dtype, e.shape) for p, e in ma.arrays.items()} == \
        {p: (e.dtype, e.shape) for p, e in mb.arrays.items()}
    la, lb = uckpt.load(a), uckpt.load(b)
    for path in ma.arrays:
        x, y = _get(la, ma.tree, path), _get(lb, mb.tree, path)
        assert x.tobytes() == y.tobytes(), path
    report = diff(a, b)
    assert report.identical, [d.text() for d in report.differences]


def _get(tree, skeleton, path):
    """The loaded array at an array path (the first node that refers to it)."""
    def find(node, value):
        if node["type"] in ("array", "bytes") and node["path"] == path:
            return value
        items = node.get("items")
        if node["type"] == "object":
            return find(node["state"], value)
        if isinstance(items, dict):
            for k, v in items.items():
                key = int(k) if node.get("key_type") == "int" else k
                got = find(v, value[key])
                if got is not None:
                    return got
        elif isinstance(items, list):
            for i, v in enumerate(items):
                got = find(v, value[i])
                if got is not None:
                    return got
        return None
    got = find(skeleton, tree)
    return np.frombuffer(got, np.uint8) if isinstance(got, bytes) else np.asarray(got)


@pytest.mark.parametrize("fmt", TARGETS)
def test_round_trip_keeps_everything(rich, tmp_path, fmt):
    mid = target(tmp_path, "mid", fmt)
    assert convert(rich, mid).dst_format == fmt
    convert(mid, tmp_path / "back")
    assert_same_checkpoint(rich, tmp_path / "back")
    uckpt.verify(tmp_path / "back")


def test_chain_through_every_format(rich, tmp_path):
    prev = rich
    for i, fmt in enumerate(("npz", "hdf5", "safetensors", "pickle", "npz", "uckpt")):
        nxt = target(tmp_path, f"step{i}", fmt)
        convert(prev, nxt)
        prev = nxt
    assert_same_checkpoint(rich, prev)


def test_target_readers_see_plain_arrays(rich, tmp_path):
    """Other readers get every array under its name; types they lack hold the exact bits."""
    state = rich_state()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvertWarning)
        for fmt in ("npz", "hdf5", "safetensors"):
            convert(rich, target(tmp_path, "t", fmt))
    texts = [str(w.message) for w in caught]
    assert any("NPZ has no bfloat16, float8_e4m3fn, float8_e5m2" in t for t in texts), texts
    assert any("safetensors has no complex128" in t for t in texts), texts
    assert any("safetensors holds only tensors" in t and "optimizer/param_groups/0/lr" in t
               for t in texts), texts

    with np.load(tmp_path / "t.npz", allow_pickle=False) as z:
        assert z["dtypes/bfloat16"].dtype == np.uint16
        assert z["dtypes/bfloat16"].tobytes() == state["dtypes"]["bfloat16"].tobytes()
        assert z["dtypes/complex128"].tobytes() == state["dtypes"]["complex128"].tobytes()
        assert z["tied"].tobytes() == state["model"]["weight"].tobytes()  # a copy for readers
        assert z["optimizer/param_groups/0/lr"][()] == 0.1  # plain values too
        assert str(z["optimizer/param_groups/0/name"]) == "héllo ✓"
        assert z["weird~1key~0name/a~1b"].tolist() == [0, 1, 2]
        record = json.loads(z["__uckpt__"].tobytes())
        assert record["dtypes"]["dtypes/bfloat16"] == "bfloat16"
    with h5py.File(tmp_path / "t.h5") as f:
        ds = f["dtypes/float8_e5m2"]
        assert ds.dtype == np.uint8 and ds.attrs["uckpt_dtype"] == "float8_e5m2"
        assert ds[()].tobytes() == state["dtypes"]["float8_e5m2"].tobytes()
        assert f["dtypes/complex64"].dtype == np.complex64
        assert list(f["optimizer/state"]) == ["0", "5"]
    from safetensors.numpy import safe_open
    with safe_open(tmp_path / "t.safetensors", framework="numpy") as f:
        assert f.get_tensor("dtypes/complex128").dtype == np.uint64
        assert f.get_tensor("dtypes/complex128").shape == (3, 4, 2)
        assert f.get_tensor("model/weight").tobytes() == state["model"]["weight"].tobytes()


def test_npz_written_by_numpy(tmp_path):
    """Names nest, 0-d strings are strings, and Fortran-order, big-endian and compressed
    members read exactly."""
    big = np.arange(6, dtype=">i4").reshape(2, 3)
    fortran = np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4))
    np.savez_compressed(tmp_path / "a.npz", **{"net/l1/W": fortran, "net/l1/b": big,
                                               "log": np.asarray('{"loss": 1}'), "t": np.int64(3)})
    with open_checkpoint(tmp_path / "a.npz") as tree:
        assert tree.format == "npz"
        assert list(tree.root) == ["net", "log", "t"]
        assert tree.root["log"] == '{"loss": 1}'
        w, b = tree.root["net"]["l1"]["W"], tree.root["net"]["l1"]["b"]
        assert w.read().tobytes() == np.ascontiguousarray(fortran).tobytes()
        assert b.dtype == "int32" and b.read().tolist() == big.tolist()
        assert b.read().dtype.byteorder in "<="


def test_npz_names_that_cannot_nest_stay_flat(tmp_path):
    np.savez(tmp_path / "a.npz", **{"a": np.ones(1), "a/b": np.zeros(1)})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvertWarning)
        convert(tmp_path / "a.npz", tmp_path / "b")
    assert any("kept flat" in str(w.message) for w in caught)
    assert sorted(uckpt.load(tmp_path / "b")) == ["a", "a/b"]


def test_hdf5_written_by_h5py(tmp_path):
    """Groups nest; attributes, compressed and chunked datasets, a soft link to a dataset, a
    string dataset, bool and complex data all survive a round trip to uckpt and back."""
    src = tmp_path / "a.h5"
    data = np.random.default_rng(0).standard_normal((50, 40)).astype(np.float32)
    with h5py.File(src, "w") as f:
        f.attrs["created_by"] = "h5py"
        g = f.create_group("layer")
        g.attrs["weight_names"] = np.array([b"kernel", b"bias"])
        g.attrs["scale"] = np.float32(0.5)
        g.create_dataset("kernel", data=data, compression="gzip", chunks=(10, 10))
        g.create_dataset("mask", data=np.array([True, False]))
        g.create_dataset("z", data=np.array([1 + 2j], np.complex128))
        f.create_dataset("name", data="hello", dtype=h5py.string_dtype())
        f["alias"] = h5py.SoftLink("/layer/kernel")
    convert(src, tmp_path / "u")
    convert(tmp_path / "u", tmp_path / "b.h5")
    with h5py.File(tmp_path / "b.h5") as f:
        assert f.attrs["created_by"] == "h5py"
        assert f["layer"].attrs["weight_names"].tolist() == [b"kernel", b"bias"]
        assert f["layer"].attrs["scale"].dtype == np.float32
        assert f["layer/kernel"][()].tobytes() == data.tobytes()
        assert f["alias"][()].tobytes() == data.tobytes()
        assert f["layer/mask"].dtype == bool and f["layer/z"].dtype == np.complex128
        assert f["name"].asstr()[()] == "hello"
    assert diff(src, tmp_path / "b.h5").identical


def test_safetensors_written_by_the_package(tmp_path):
    import torch
    from safetensors.torch import save_file

    t = {"embed.weight": torch.randn(5, 3).to(torch.bfloat16), "lm/head": torch.arange(4),
         "f8": torch.zeros(3, dtype=torch.float8_e4m3fn)}
    save_file(t, tmp_path / "m.safetensors", metadata={"format": "pt"})
    with open_checkpoint(tmp_path / "m.safetensors") as tree:
        assert tree.format == "safetensors"
        assert tree.root["embed.weight"].dtype == "bfloat16"
        assert tree.root["lm"]["head"].read().tolist() == [0, 1, 2, 3]
        assert tree.root["embed.weight"].read().view(np.uint16).tobytes() == \
            t["embed.weight"].view(torch.uint16).numpy().tobytes()


def test_torch_save_legacy_and_bare_roots(tmp_path):
    """Pre-zip torch.save files, tensors at the root, views and transposes read exactly; a
    root that is not a dict comes back as it was."""
    import torch

    base = torch.arange(24.0).reshape(4, 6)
    obj = {"t": base.t(), "v": base[1:3, ::2], "h": torch.ones(3, dtype=torch.float16)}
    torch.save(obj, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    with open_checkpoint(tmp_path / "legacy.pt") as tree:
        for k, v in obj.items():
            assert tree.root[k].read().tobytes() == v.contiguous().numpy().tobytes(), k
    torch.save([base, base[0]], tmp_path / "list.pt")
    convert(tmp_path / "list.pt", tmp_path / "u")
    convert(tmp_path / "u", tmp_path / "back.pt")
    back = torch.load(tmp_path / "back.pt", weights_only=True)
    assert isinstance(back, list) and torch.equal(back[0], base) and torch.equal(back[1], base[0])


def test_structure_record_ignored_when_the_file_was_changed(rich, tmp_path):
    """Another tool rewrote the NPZ with an extra array: the record no longer fits, the file's
    own layout is used, with a warning."""
    convert(rich, tmp_path / "a.npz")
    with np.load(tmp_path / "a.npz") as z:
        members = {k: z[k] for k in z.files}
    members["added"] = np.ones(2)
    np.savez(tmp_path / "b.npz", **members)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvertWarning)
        convert(tmp_path / "b.npz", tmp_path / "c")
    assert any("does not match" in str(w.message) for w in caught)
    assert uckpt.load(tmp_path / "c")["added"].tolist() == [1.0, 1.0]


def test_leaf_reads_only_when_asked(rich):
    with open_checkpoint(rich) as tree:
        leaf = tree.root["dtypes"]["bfloat16"]
        assert isinstance(leaf, Leaf) and (leaf.dtype, leaf.shape) == ("bfloat16", (3, 4))
        assert leaf.read().dtype == np.dtype(ml_dtypes.bfloat16)
        assert tree.root["tied"] is tree.root["model"]["weight"]


def test_extensions_name_targets(tmp_path, rich):
    for fmt, ext in EXT.items():
        if ext:
            assert convert(rich, tmp_path / f"x{ext}", dry_run=True).dst_format == fmt
    assert convert(rich, tmp_path / "model.bin", dry_run=True).dst_format == "pickle"
    assert convert(rich, tmp_path / "x.npz", dst_format="hdf5", dry_run=True).dst_format == \
        "hdf5"
    assert not list(tmp_path.iterdir())  # dry runs write nothing
