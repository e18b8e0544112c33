"""Converting never runs code from its input and refuses inputs that point outside themselves
or declare more data than they hold: one test per refusal (issue 6, item 4)."""
import builtins
import io
import os
import pickle
import subprocess
import zipfile

import h5py
import numpy as np
import pytest

from convert_common import assert_error, cli, leftovers
from uckpt.conversion import RefusedGlobalError, UnsafeInputError, convert, open_checkpoint
from uckpt.errors import CorruptCheckpointError, UnsupportedDtypeError


class SystemCall:
    """Unpickling it runs ``touch MARKER`` through os.system."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


class ExecCall(SystemCall):
    def __reduce__(self):
        return builtins.exec, (f"open({self.marker!r}, 'w').close()",)


class PopenCall(SystemCall):
    def __reduce__(self):
        return subprocess.Popen, (["touch", self.marker],)


PAYLOADS = [(SystemCall, "system"), (ExecCall, "builtins.exec"), (PopenCall, "subprocess.Popen")]


def torch_zip(path, pkl: bytes, members=None):
    """A torch.save-style archive holding ``pkl`` as its data.pkl."""
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/version", "3\n")
        for name, data in (members or {}).items():
            z.writestr("archive/" + name, data)


def test_the_payloads_really_run_code_when_unpickled(tmp_path):
    """The control: plain pickle.loads of each payload creates its marker."""
    for cls, _ in PAYLOADS:
        marker = tmp_path / f"{cls.__name__}.marker"
        obj = pickle.loads(pickle.dumps(cls(marker), protocol=2))
        if isinstance(obj, subprocess.Popen):
            obj.wait()
        assert marker.exists(), cls


@pytest.mark.parametrize("cls,name", PAYLOADS)
@pytest.mark.parametrize("container", ["raw pickle", "torch.save zip"])
def test_malicious_pickle_is_refused_by_name(tmp_path, cls, name, container):
    marker = tmp_path / "MARKER"
    data = pickle.dumps({"weight": cls(marker)}, protocol=2)
    src = tmp_path / "evil.pt"
    if container == "raw pickle":
        src.write_bytes(data)
    else:
        torch_zip(src, data)
    with pytest.raises(RefusedGlobalError) as info:
        convert(src, tmp_path / "out")
    assert name in info.value.name and name in str(info.value)
    assert "nothing was imported or run" in str(info.value)
    assert not marker.exists()
    assert not (tmp_path / "out").exists() and not leftovers(tmp_path)


@pytest.mark.parametrize("target", [b"c_codecs\nencode\n", b"ctorch\nFloatStorage\n",
                                    b"ctorch\nfloat32\n", b"ctorch._utils\n_rebuild_tensor_v2\n"])
def test_pickle_may_not_change_the_stand_ins(tmp_path, target):
    """BUILD (set attributes) on an allowed global, which could otherwise rewire it, fails."""
    torch_zip(tmp_path / "a.pt", b"\x80\x02" + target + b"}X\x02\x00\x00\x00fnNsb.")
    with pytest.raises(CorruptCheckpointError, match="a pickle may not change a"):
        convert(tmp_path / "a.pt", tmp_path / "out")  # ^ {"fn": None}, then BUILD


def test_cli_refuses_malicious_pickle(tmp_path):
    marker = tmp_path / "MARKER"
    (tmp_path / "evil.pkl").write_bytes(pickle.dumps([SystemCall(marker)], protocol=4))
    proc = cli("convert", tmp_path / "evil.pkl", tmp_path / "out.h5")
    assert_error(proc, "refers to posix.system", "refuses to load")
    assert not marker.exists() and not (tmp_path / "out.h5").exists()


def test_whole_module_saved_with_torch_save_is_refused(tmp_path):
    """torch.save(model) pickles the module's class; only state dicts can be converted."""
    import torch

    torch.save(torch.nn.Linear(2, 2), tmp_path / "model.pt")
    with pytest.raises(RefusedGlobalError, match="torch.nn.modules.linear.Linear") as info:
        convert(tmp_path / "model.pt", tmp_path / "out")
    assert "state_dict()" in str(info.value)


def test_npz_object_array_is_refused_without_unpickling(tmp_path):
    marker = tmp_path / "MARKER"
    np.savez(tmp_path / "a.npz", w=np.ones(2), evil=np.array([SystemCall(marker)], dtype=object))
    with pytest.raises(UnsafeInputError, match="'evil' is an object array"):
        convert(tmp_path / "a.npz", tmp_path / "out")
    assert not marker.exists()
    np.load(tmp_path / "a.npz", allow_pickle=True)["evil"]  # the control: numpy runs it
    assert marker.exists()


def _npy(shape, data: bytes) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": "<f8", "fortran_order": False, "shape": shape})
    return buf.getvalue() + data


@pytest.mark.parametrize("compression", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
def test_npz_declaring_more_than_the_file_is_refused(tmp_path, compression):
    with zipfile.ZipFile(tmp_path / "a.npz", "w", compression) as z:
        z.writestr("huge.npy", _npy((10 ** 12,), b"\0" * 8))
    with pytest.raises(CorruptCheckpointError, match="array 'huge' declares 8000000000000 bytes, but the file holds only 8"):
        convert(tmp_path / "a.npz", tmp_path / "out")


def test_zip_member_expanding_beyond_deflate_is_refused(tmp_path):
    """A compressed member whose declared size no deflate stream of its length can produce."""
    with zipfile.ZipFile(tmp_path / "a.npz", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("a.npy", _npy((4,), b"\0" * 32))
    data = bytearray((tmp_path / "a.npz").read_bytes())
    central = data.rindex(b"PK\x01\x02")
    data[central + 24:central + 28] = (1 << 31).to_bytes(4, "little")  # uncompressed size
    (tmp_path / "a.npz").write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match=r"\(compressed\) declares 2147483648"):
        convert(tmp_path / "a.npz", tmp_path / "out")


def test_torch_storage_larger_than_its_member_is_refused(tmp_path):
    import torch

    buf = io.BytesIO()
    torch.save({"w": torch.ones(3)}, buf)
    src = zipfile.ZipFile(buf)
    with zipfile.ZipFile(tmp_path / "short.pt", "w") as z:
        for info in src.infolist():
            data = src.read(info)
            z.writestr(info.filename, data[:4] if info.filename.endswith("data/0") else data)
    with pytest.raises(CorruptCheckpointError, match="storage '0' declares 12 bytes"):
        convert(tmp_path / "short.pt", tmp_path / "out")


def test_torch_tensor_beyond_its_storage_is_refused(tmp_path):
    """A tensor whose size and stride reach past its storage (a crafted data.pkl)."""
    from uckpt.conversion.torch_writer import Emitter
    from uckpt.conversion.model import Leaf

    pkl = Emitter({}).dump({"w": Leaf("float32", (10 ** 6,), lambda: None)})
    torch_zip(tmp_path / "t.pt", pkl.replace(b"J\x40\x42\x0f\x00", b"J\x03\x00\x00\x00", 1),
              {"data/0": b"\0" * 12})
    with pytest.raises(CorruptCheckpointError, match="declares 4000000 bytes"):
        convert(tmp_path / "t.pt", tmp_path / "out")


@pytest.fixture
def h5(tmp_path):
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["data"] = np.arange(4.0)
    return tmp_path / "a.h5", other


def _refused(path, tmp_path, *fragments):
    with pytest.raises(UnsafeInputError) as info:
        convert(path, tmp_path / "out")
    for f in fragments:
        assert f in str(info.value), (f, str(info.value))
    assert not (tmp_path / "out").exists()


def test_hdf5_external_link_is_refused(h5, tmp_path):
    path, other = h5
    with h5py.File(path, "w") as f:
        f["g/ext"] = h5py.ExternalLink(str(other), "/data")
    _refused(path, tmp_path, "/g/ext", "external link", "other.h5")


def test_hdf5_external_storage_is_refused(h5, tmp_path):
    path, _ = h5
    (tmp_path / "raw.bin").write_bytes(b"\0" * 16)
    with h5py.File(path, "w") as f:
        f.create_dataset("x", shape=(4,), dtype="f4", external=[(str(tmp_path / "raw.bin"), 0, 16)])
    _refused(path, tmp_path, "/x", "external file", "raw.bin")


def test_hdf5_virtual_dataset_into_another_file_is_refused(h5, tmp_path):
    path, other = h5
    layout = h5py.VirtualLayout(shape=(4,), dtype="f8")
    layout[:] = h5py.VirtualSource(str(other), "data", shape=(4,))
    with h5py.File(path, "w") as f:
        f.create_virtual_dataset("v", layout)
    _refused(path, tmp_path, "/v", "virtual dataset", "other.h5")


def test_hdf5_soft_link_to_a_group_and_cycles_are_refused(h5, tmp_path):
    path, _ = h5
    with h5py.File(path, "w") as f:
        f.create_group("g")["w"] = np.ones(2)
        f["loop"] = h5py.SoftLink("/g")
    _refused(path, tmp_path, "/loop", "soft link to the group /g")
    with h5py.File(path, "w") as f:
        g = f.create_group("g")
        g["up"] = f["/"]  # a hard link back to the root
    _refused(path, tmp_path, "/g/up", "cycle")


def test_hdf5_dataset_declaring_more_than_the_file_is_refused(tmp_path):
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f.create_dataset("huge", shape=(10 ** 10,), dtype="f8")  # never written: no storage
    with pytest.raises(CorruptCheckpointError, match="dataset /huge declares 80000000000"):
        convert(tmp_path / "a.h5", tmp_path / "out")


def _safetensors(path, header: bytes, data: bytes = b""):
    path.write_bytes(len(header).to_bytes(8, "little") + header + data)


@pytest.mark.parametrize("header,data,message", [
    (b'{"w":{"dtype":"F32","shape":[1000000],"data_offsets":[0,4000000]}}', b"\0" * 8,
     "tensor 'w' declares 4000000 bytes"),
    (b'{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', b"\0" * 12,
     "spans 8 bytes, its shape needs 12"),
    (b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
     b'"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}', b"\0" * 12, "overlap"),
])
def test_safetensors_bad_offsets_are_refused(tmp_path, header, data, message):
    _safetensors(tmp_path / "a.safetensors", header, data)
    with pytest.raises(CorruptCheckpointError, match=message):
        convert(tmp_path / "a.safetensors", tmp_path / "out")


def test_safetensors_header_longer_than_the_file_is_refused(tmp_path):
    (tmp_path / "a.safetensors").write_bytes((10 ** 9).to_bytes(8, "little") + b"{}")
    with pytest.raises(CorruptCheckpointError, match="the header declares 1000000000 bytes"):
        convert(tmp_path / "a.safetensors", tmp_path / "out", src_format="safetensors")


def test_safetensors_unknown_dtype_is_named(tmp_path):
    _safetensors(tmp_path / "a.safetensors",
                 b'{"q":{"dtype":"F8_E4M3FNUZ","shape":[1],"data_offsets":[0,1]}}', b"\0")
    with pytest.raises(UnsupportedDtypeError, match="'q' has dtype 'F8_E4M3FNUZ'"):
        convert(tmp_path / "a.safetensors", tmp_path / "out")


def _dcp(tmp_path):
    import torch
    import torch.distributed.checkpoint as dcp

    path = tmp_path / "dcp"
    with pytest.warns(UserWarning):  # "assuming the intent is to save in a single process"
        dcp.save({"w": torch.ones(3)}, checkpoint_id=path)
    return path


def test_dcp_metadata_with_a_malicious_global_is_refused(tmp_path):
    path = _dcp(tmp_path)
    marker = tmp_path / "MARKER"
    (path / ".metadata").write_bytes(pickle.dumps(SystemCall(marker), protocol=4))
    with pytest.raises(RefusedGlobalError, match="posix.system"):
        convert(path, tmp_path / "out")
    assert not marker.exists()


def test_dcp_data_file_outside_the_directory_is_refused(tmp_path):
    path = _dcp(tmp_path)
    md = pickle.loads((path / ".metadata").read_bytes())  # the test trusts its own file
    for info in md.storage_data.values():
        info.relative_path = "../" + info.relative_path
    (path / ".metadata").write_bytes(pickle.dumps(md))
    with pytest.raises(UnsafeInputError, match="names the data file '../__0_0.distcp'"):
        with open_checkpoint(path) as tree:
            tree.root["w"].read()
