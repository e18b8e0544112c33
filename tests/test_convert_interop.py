"""Smaller pieces of issue 14: DCP optimizer keys, NumPy arrays inside pickles, `python -m
uckpt`, --select and the prefixes, deflated NPZ in and out, safetensors metadata."""
import json
import pickle
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import uckpt
from convert_common import assert_error, assert_ok
from uckpt.conversion import RefusedGlobalError, convert, diff, open_checkpoint
from uckpt.errors import UckptError

pytestmark = pytest.mark.filterwarnings("ignore::uckpt.conversion.ConvertWarning")


def uckpt_module(*args):
    return subprocess.run([sys.executable, "-m", "uckpt", *map(str, args)], capture_output=True,
                          text=True, timeout=120)


def test_python_m_uckpt_is_the_command(tmp_path):
    np.savez(tmp_path / "a.npz", w=np.arange(4.0))
    proc = uckpt_module("convert", tmp_path / "a.npz", tmp_path / "a.safetensors")
    assert_ok(proc)
    assert proc.stdout.startswith("converted ")
    helps = [subprocess.run([sys.executable, "-m", m, "--help"], capture_output=True,
                            text=True, timeout=60).stdout for m in ("uckpt", "uckpt.cli.main")]
    assert helps[0] == helps[1] and "convert" in helps[0]
    assert_error(uckpt_module("inspect", tmp_path / "nothing"), "does not exist")
    assert uckpt_module("convert").returncode == 2


def test_dcp_optimizer_state_keys_are_parameter_ids(tmp_path):
    """optimizer.state_dict() saved with DCP -> torch.save: load_state_dict restores it."""
    torch = pytest.importorskip("torch")
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 3)).sum().backward()
    opt.step()
    dcp.save({"model": model.state_dict(), "optim": opt.state_dict()},
             checkpoint_id=str(tmp_path / "dcp"))
    with pytest.warns(Warning, match="mapped back to the parameter ids"):
        convert(tmp_path / "dcp", tmp_path / "x.pt")
    loaded = torch.load(tmp_path / "x.pt", weights_only=True)
    assert sorted(loaded["optim"]["state"]) == [0, 1, 2, 3]
    opt2 = torch.optim.Adam(model.parameters())
    opt2.load_state_dict(loaded["optim"])
    for i, p in enumerate(model.parameters()):
        for k, v in opt.state[p].items():
            assert torch.equal(v, opt2.state[p][k]), (i, k)


def test_numpy_arrays_inside_pickles(tmp_path):
    """Plain numeric arrays and scalars (protocols 2 and 5, C and Fortran order, big-endian)
    are read as arrays; an object array, a structured dtype or another NumPy global is
    refused without running anything."""
    state = {"rng": np.random.RandomState(5).get_state(),
             "f": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
             "be": np.arange(3, dtype=">i4"), "s": np.float32(2.5), "b": np.array([True, False])}
    for proto in (2, 5):
        path = tmp_path / f"p{proto}.pkl"
        path.write_bytes(pickle.dumps(state, protocol=proto))
        with open_checkpoint(path) as tree:
            root = tree.root
            assert root["rng"][0] == "MT19937"
            assert np.array_equal(root["rng"][1].read(), state["rng"][1])
            assert np.array_equal(root["f"].read(), state["f"])
            assert np.array_equal(root["be"].read(), state["be"])
            assert root["s"].kind == "scalar" and root["s"].read() == np.float32(2.5)
            assert root["b"].read().tolist() == [True, False]
    bad = {"obj": np.array([{"a": 1}], dtype=object),
           "rec": np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8")])}
    for key, value in bad.items():
        path = tmp_path / f"{key}.pkl"
        path.write_bytes(pickle.dumps({key: value}, protocol=2))
        with pytest.raises(UckptError):
            convert(path, tmp_path / f"{key}.npz")
    path = tmp_path / "load.pkl"
    path.write_bytes(pickle.dumps(np.load, protocol=2))
    with pytest.raises(RefusedGlobalError):
        convert(path, tmp_path / "load.npz")


def test_select_and_prefixes(tmp_path):
    np.savez(tmp_path / "a.npz", **{"model/enc.w": np.ones(2), "model/head.b": np.zeros(1),
                                    "opt/lr": np.float64(0.1)})
    convert(tmp_path / "a.npz", tmp_path / "m.safetensors", select="model",
            strip_prefix="enc.", add_prefix="bert.")
    with open_checkpoint(tmp_path / "m.safetensors") as tree:
        assert list(tree.root) == ["bert.w", "bert.head.b"]
    with pytest.raises(UckptError, match="has no 'nope'") as e:
        convert(tmp_path / "a.npz", tmp_path / "n.npz", select="model/nope")
    assert "enc.w" in e.value.hint
    assert not (tmp_path / "n.npz").exists()
    np.savez(tmp_path / "d.npz", **{"x.w": np.ones(1), "w": np.ones(1)})
    with pytest.raises(UckptError, match="collide"):
        convert(tmp_path / "d.npz", tmp_path / "e.npz", strip_prefix="x.")


def test_deflated_npz_in_and_out(tmp_path):
    """savez_compressed (Chainer's default) -> uckpt -> --compress NPZ: np.load reads the
    same arrays from deflated members; a CRC error in a member is still found."""
    rng = np.random.default_rng(0)
    arrays = {f"l{i}/W": rng.standard_normal((64, 300 + i)).astype(np.float32) for i in range(6)}
    np.savez_compressed(tmp_path / "c.npz", **arrays)
    convert(tmp_path / "c.npz", tmp_path / "u")
    convert(tmp_path / "u", tmp_path / "back.npz", compress="deflate")
    assert diff(tmp_path / "c.npz", tmp_path / "back.npz").identical
    with zipfile.ZipFile(tmp_path / "back.npz") as z:
        assert all(i.compress_type == zipfile.ZIP_DEFLATED for i in z.infolist())
    with np.load(tmp_path / "back.npz") as f:
        for k, v in arrays.items():
            assert np.array_equal(f[k], v)
    data = bytearray((tmp_path / "c.npz").read_bytes())
    with zipfile.ZipFile(tmp_path / "c.npz") as z:
        info = z.getinfo("l3/W.npy")
    at = info.header_offset + 30 + len(info.filename) + len(info.extra) + info.compress_size - 8
    data[at] ^= 0x01
    (tmp_path / "bad.npz").write_bytes(bytes(data))
    with pytest.raises(UckptError):
        convert(tmp_path / "bad.npz", tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


def test_safetensors_metadata_kept_and_format_set(tmp_path):
    from safetensors.numpy import save_file
    from safetensors import safe_open

    save_file({"w": np.ones(3, np.float32)}, tmp_path / "a.safetensors",
              metadata={"format": "tf", "note": "kept"})
    convert(tmp_path / "a.safetensors", tmp_path / "u")
    convert(tmp_path / "u", tmp_path / "b.safetensors")
    with safe_open(tmp_path / "b.safetensors", "np") as f:
        meta = f.metadata()
    assert meta["format"] == "tf" and meta["note"] == "kept"
    np.savez(tmp_path / "c.npz", w=np.ones(2))
    convert(tmp_path / "c.npz", tmp_path / "c.safetensors")
    with safe_open(tmp_path / "c.safetensors", "np") as f:
        assert f.metadata()["format"] == "pt"
    header = (tmp_path / "c.safetensors").read_bytes()
    n = int.from_bytes(header[:8], "little")
    assert json.loads(header[8:8 + n])["__metadata__"]["format"] == "pt"


def test_inspect_and_verify_foreign_files(tmp_path):
    """inspect lists a foreign file's arrays from its headers; verify reads every array and
    says what it checked; a damaged deflated member fails verify with exit 1."""
    np.savez_compressed(tmp_path / "a.npz", **{"l/W": np.arange(2000.0), "l/b": np.ones(3)})
    proc = uckpt_module("inspect", tmp_path / "a.npz", "--json")
    assert_ok(proc)
    doc = json.loads(proc.stdout)
    assert doc["format"] == "npz"
    assert [(a["path"], a["shape"]) for a in doc["leaves"]] == [("l/W", [2000]), ("l/b", [3])]
    proc = uckpt_module("verify", tmp_path / "a.npz")
    assert_ok(proc)
    assert proc.stdout.startswith("OK: npz: 2 arrays") and "CRC-32" in proc.stdout
    data = bytearray((tmp_path / "a.npz").read_bytes())
    with zipfile.ZipFile(tmp_path / "a.npz") as z:
        info = z.getinfo("l/W.npy")
    data[info.header_offset + 30 + len(info.filename) + len(info.extra) + 200] ^= 0xFF
    (tmp_path / "bad.npz").write_bytes(bytes(data))
    proc = uckpt_module("verify", tmp_path / "a.npz", tmp_path / "bad.npz")
    assert proc.returncode == 1 and "OK: npz" in proc.stdout
    assert "bad.npz" in proc.stderr and "1 of 2" in proc.stderr


def test_compress_for_a_uckpt_target(tmp_path):
    """--compress for a uckpt target compresses its chunks with zstd (format 6.3); the
    result reads back identical."""
    np.savez(tmp_path / "a.npz", w=np.arange(100000.0))
    convert(tmp_path / "a.npz", tmp_path / "u", compress="default")
    assert diff(tmp_path / "a.npz", tmp_path / "u").identical
    assert {c.codec for c in uckpt.manifest(tmp_path / "u").arrays["w"].chunks} == \
        {("bytegroup", "zstd")}
    with pytest.raises(UckptError, match="cannot be compressed with 'lzf'"):
        convert(tmp_path / "a.npz", tmp_path / "b.npz", compress="lzf")
