"""Orbax checkpoints in `uckpt convert` (issue 31, item 5): `StandardCheckpointer` /
`PyTreeCheckpointer` outputs, OCDBT and not, and CheckpointManager directories read through
TensorStore; conversions to Orbax that `ocp.StandardCheckpointer().restore` gives back bit for
bit, as NumPy and as `jax.Array`."""
import json
import os
import re

import numpy as np
import pytest

from convert_common import assert_error, assert_ok, cli, cli_without

ocp = pytest.importorskip("orbax.checkpoint")
jax = pytest.importorskip("jax")
ml_dtypes = pytest.importorskip("ml_dtypes")

import uckpt  # noqa: E402
from uckpt.cli.main import main  # noqa: E402
from uckpt.conversion import convert, open_checkpoint  # noqa: E402
from uckpt.conversion.interchange import leaves  # noqa: E402
from uckpt.errors import CorruptCheckpointError  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::uckpt.conversion.ConvertWarning",
                                        "ignore::UserWarning", "ignore::DeprecationWarning")

RNG = np.random.RandomState(0)


def make_tree(shift=0):
    """A nested pytree of dicts and lists: float32, bfloat16 (NaN bits included), int32,
    uint32 (a raw PRNG key), a 0-d array, a jax.Array and a Python number."""
    half = RNG.randn(3, 2).astype(ml_dtypes.bfloat16)
    half.view(np.uint16)[0, 0] = 0x7FC1  # a NaN payload: compared bit for bit
    return {"params": {"dense": {"kernel": RNG.randn(4, 3).astype(np.float32) + shift,
                                 "bias": half},
                       "layers": [np.arange(5, dtype=np.int32) + shift,
                                  {"scale": np.float32(1.5 + shift)}]},
            "rng": np.array([0, 42 + shift], dtype=np.uint32),
            "device": jax.numpy.arange(6, dtype=jax.numpy.float32).reshape(2, 3) + shift,
            "step": 7 + shift}


def bits(tree):
    """{path: (dtype, bytes)} of every array of an Orbax pytree (NumPy or jax.Array)."""
    out = {}
    for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
        a = np.asarray(x)
        out[jax.tree_util.keystr(path)] = (a.dtype.name, a.shape, a.tobytes())
    return out


def uckpt_bits(path):
    """{path: (dtype, bytes)} of every array of a checkpoint, read through uckpt."""
    with open_checkpoint(path) as tree:
        return {p: (leaf.dtype, leaf.shape, leaf.read().tobytes()) for p, leaf in leaves(tree.root)}


def targets(tree):
    """The restore target Orbax users pass: ShapeDtypeStructs with a device sharding for the
    arrays, the numbers (Orbax's scalars) as they are."""
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return jax.tree.map(lambda x: x if np.ndim(x) == 0 and not hasattr(x, "dtype") else
                        jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=sharding), tree)


def save(path, tree, ocdbt=True):
    ck = ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=ocdbt))
    ck.save(path, tree)
    return path


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("orbax")
    tree = make_tree()
    manager = ocp.CheckpointManager(root / "mgr")
    for step in (1, 2):
        manager.save(step, args=ocp.args.StandardSave(make_tree(step)))
    manager.wait_until_finished()
    return {"tree": tree, "ocdbt": save(root / "ocdbt", tree),
            "zarr": save(root / "zarr", tree, ocdbt=False), "mgr": root / "mgr"}


@pytest.mark.parametrize("layout", ["ocdbt", "zarr"])
def test_orbax_to_uckpt_to_orbax_bit_for_bit(saved, tmp_path, layout):
    """Orbax -> uckpt -> Orbax: the same arrays in uckpt, then the same restore, bit for bit,
    as NumPy (no target) and as jax.Array (a target with shardings); the layout is kept."""
    src = saved[layout]
    assert_ok(cli("convert", src, tmp_path / "u"))
    got = uckpt_bits(tmp_path / "u")
    assert got["params/dense/bias"][0] == "bfloat16"
    assert got["params/layers/0"][2] == np.arange(5, dtype=np.int32).tobytes()
    assert_ok(cli("convert", tmp_path / "u", tmp_path / "back", "--to", "orbax"))
    want = bits(ocp.StandardCheckpointer().restore(src))
    back = ocp.StandardCheckpointer().restore(tmp_path / "back")
    assert bits(back) == want
    assert isinstance(back["params"]["layers"], list)
    on_device = ocp.StandardCheckpointer().restore(tmp_path / "back", targets(back))
    assert isinstance(on_device["params"]["dense"]["kernel"], jax.Array)
    assert bits(on_device) == want
    assert (tmp_path / "back" / "manifest.ocdbt").is_file() == (layout == "ocdbt")


def test_uckpt_to_orbax_to_uckpt_bit_for_bit(tmp_path):
    """A uckpt checkpoint saved by uckpt.save -> Orbax (restored by Orbax) -> uckpt."""
    tree = {"w": RNG.randn(8, 3).astype(np.float32),
            "h": RNG.randn(4).astype(ml_dtypes.bfloat16),
            "ids": [np.arange(3, dtype=np.int32), np.array([1, 2], dtype=np.uint32)],
            "s": np.array(2.5, dtype=np.float32)}
    uckpt.save(tmp_path / "u", tree)
    convert(tmp_path / "u", tmp_path / "o", dst_format="orbax")
    restored = ocp.StandardCheckpointer().restore(tmp_path / "o")
    assert bits(restored) == bits(tree)
    assert bits(ocp.StandardCheckpointer().restore(tmp_path / "o", targets(tree))) == bits(tree)
    convert(tmp_path / "o", tmp_path / "u2")
    assert uckpt_bits(tmp_path / "u2") == uckpt_bits(tmp_path / "u")


def test_manager_directory_means_its_latest_step(saved, tmp_path):
    """A CheckpointManager's directory is its latest step; ROOT/STEP names another."""
    want2 = bits(ocp.StandardCheckpointer().restore(saved["mgr"] / "2" / "default"))
    want1 = bits(ocp.StandardCheckpointer().restore(saved["mgr"] / "1" / "default"))
    assert want1 != want2
    convert(saved["mgr"], tmp_path / "latest", dst_format="orbax")
    assert bits(ocp.StandardCheckpointer().restore(tmp_path / "latest")) == want2
    convert(saved["mgr"] / "1", tmp_path / "one", dst_format="orbax")
    assert bits(ocp.StandardCheckpointer().restore(tmp_path / "one")) == want1


def test_inspect_verify_diff_accept_orbax(saved, tmp_path, capsys):
    convert(saved["ocdbt"], tmp_path / "u")
    assert main(["inspect", str(saved["zarr"])]) == 0
    out = capsys.readouterr().out
    assert "format       orbax" in out and re.search(r"params/dense/bias +bfloat16 +\(3, 2\)", out)
    assert main(["verify", str(saved["mgr"])]) == 0
    assert "OK: orbax: 7 arrays" in capsys.readouterr().out
    assert main(["diff", str(saved["ocdbt"]), str(tmp_path / "u")]) == 0
    assert "identical" in capsys.readouterr().out


def test_refused_without_orbax(saved, tmp_path):
    """orbax and tensorstore that cannot be imported (a real ImportError): a uckpt error
    with the install hint, exit status 1, nothing written."""
    proc = cli_without(["orbax", "orbax.checkpoint", "tensorstore"], "convert",
                       saved["ocdbt"], tmp_path / "u")
    assert_error(proc, "needs tensorstore", "pip install orbax-checkpoint")
    assert os.listdir(tmp_path) == []


def copy_of(src, dst):
    for d, _, files in os.walk(src):
        for f in files:
            p = os.path.join(dst, os.path.relpath(os.path.join(d, f), src))
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(os.path.join(d, f), "rb") as a, open(p, "wb") as b:
                b.write(a.read())
    return dst


def test_missing_chunk_of_a_leaf(saved, tmp_path):
    src = copy_of(saved["zarr"], tmp_path / "c")
    os.unlink(src / "params.layers.0" / "0")
    with pytest.raises(CorruptCheckpointError, match=r"reading leaf 'params\.layers\.0' failed"):
        convert(src, tmp_path / "u")
    assert not (tmp_path / "u").exists()


def test_missing_ocdbt_manifest(saved, tmp_path):
    src = copy_of(saved["ocdbt"], tmp_path / "c")
    os.unlink(src / "manifest.ocdbt")
    with pytest.raises(CorruptCheckpointError, match=r"reading leaf '.*' failed") as e:
        convert(src, tmp_path / "u")
    assert str(src) in str(e.value) and "earlier checkpoint" in e.value.hint


def test_damaged_metadata(saved, tmp_path):
    src = copy_of(saved["ocdbt"], tmp_path / "c")
    (src / "_METADATA").write_text("{not json")
    with pytest.raises(CorruptCheckpointError, match=r"_METADATA: not valid JSON"):
        convert(src, tmp_path / "u")
    (src / "_METADATA").write_text(json.dumps({"tree_metadata": {"x": {"key_metadata": 3}}}))
    proc = cli("convert", src, tmp_path / "u")
    assert_error(proc, "_METADATA: no 'tree_metadata'", "earlier checkpoint")
