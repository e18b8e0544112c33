"""Converting never runs code from its input and refuses inputs that point outside themselves
or declare more data than they hold: one test per refusal (issue 6, item 4); and bounds the
work and memory a hostile input can cost: billion-laughs pickles, zip bombs, unsafe names
(issue 10, item 5)."""
import builtins
import io
import os
import pickle
import pickletools
import re
import resource
import struct
import subprocess
import sys
import threading
import zipfile
import zlib
from typing import Tuple

import h5py
import numpy as np
import pytest

from bombs import npy_header, raw_zip
from convert_common import assert_error, cli, leftovers
from uckpt.conversion import (LimitExceededError, Limits, RefusedGlobalError, UnsafeInputError,
                              UnsafeNameError, convert, diff, open_checkpoint)
from uckpt.errors import (ChecksumMismatchError, CorruptCheckpointError, UnsupportedDtypeError,
                          UnsupportedObjectError)


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
    with pytest.raises(CorruptCheckpointError, match="array 'huge' declares 8000000000000 "
                                                     r"bytes .* but its zip member holds 8 "):
        convert(tmp_path / "a.npz", tmp_path / "out")


def test_zip_member_expanding_beyond_deflate_is_refused(tmp_path):
    """A compressed member whose declared size no deflate stream of its length can produce."""
    with zipfile.ZipFile(tmp_path / "a.npz", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("a.npy", _npy((4,), b"\0" * 32))
    data = bytearray((tmp_path / "a.npz").read_bytes())
    central = data.rindex(b"PK\x01\x02")
    data[central + 24:central + 28] = (1 << 31).to_bytes(4, "little")  # uncompressed size
    (tmp_path / "a.npz").write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match=r"zip member 'a.npy' declares 2147483648 "
                                                     r"bytes from \d+ compressed, \d+ per byte; "
                                                     "deflate cannot expand more than 1032"):
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
    from uckpt.conversion.interchange import Leaf

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


# -- bounded work on hostile input (issue 10, item 5) ------------------------------------------
MEASURE = """
import resource, subprocess, sys
proc = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=120)
sys.stderr.write(proc.stderr)
print(proc.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def measured(*args, address_space=None):
    """``uckpt ARGS`` in a subprocess: (exit status, stderr, peak resident KiB of it and
    its children). ``address_space`` caps its memory (RLIMIT_AS), so a bound that does not
    hold fails the test instead of exhausting the machine."""
    def limit():
        if address_space:
            resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))

    proc = subprocess.run([sys.executable, "-c", MEASURE, sys.executable, "-m",
                           "uckpt.cli.main", *map(str, args)], capture_output=True, text=True,
                          timeout=180, preexec_fn=limit,
                          env=dict(os.environ, PYTHONWARNINGS="ignore"))
    code, kib = proc.stdout.split()
    return int(code), proc.stderr, int(kib)


@pytest.fixture(scope="module")
def baseline_kib(tmp_path_factory):
    """Peak resident KiB of a dry run of a tiny NPZ: the interpreter and uckpt's imports."""
    path = tmp_path_factory.mktemp("base") / "tiny.npz"
    np.savez(path, w=np.ones(2))
    code, err, kib = measured("convert", path, path.with_suffix(".h5"), "--dry-run")
    assert code == 0, err
    return kib


def laughs(levels=9, fan=10) -> bytes:
    """A "billion laughs" pickle: each list holds ``fan`` references to the one before."""
    x = [0]
    for _ in range(levels):
        x = [x] * fan
    return pickletools.optimize(pickle.dumps({"a": x}, protocol=2))


@pytest.mark.parametrize("container", ["raw pickle", "torch.save zip"])
def test_billion_laughs_pickle_is_refused_before_expanding(tmp_path, container, baseline_kib):
    data = laughs()
    assert len(data) < 250  # 10**9 lists once expanded
    src = tmp_path / "laughs.pt"
    if container == "raw pickle":
        src.write_bytes(data)
    else:
        torch_zip(src, data)
    code, err, kib = measured("convert", src, tmp_path / "out.npz")
    assert code == 1 and "Traceback" not in err, err
    for fragment in ("more than 100,000 nodes once its shared references are expanded",
                     "--max-nodes N", "UCKPT_CONVERT_MAX_NODES"):
        assert fragment in err, (fragment, err)
    assert kib - baseline_kib < 32 << 10, (kib, baseline_kib)
    with pytest.raises(LimitExceededError) as info:
        convert(src, tmp_path / "out.npz")
    assert info.value.limit == "max_nodes" and isinstance(info.value, UnsafeInputError)
    assert not (tmp_path / "out.npz").exists() and not leftovers(tmp_path)


def test_shared_references_within_a_raised_limit_convert(tmp_path, monkeypatch):
    """A legitimate pickle that shares a list 2,000 times (about 200,000 nodes expanded from
    a few kilobytes) is refused by default and converts, expanded, with a raised limit."""
    row = list(range(100))
    (tmp_path / "shared.pkl").write_bytes(pickle.dumps({"rows": [row] * 2000}, protocol=2))
    with pytest.raises(LimitExceededError, match="more than 100,000 nodes"):
        convert(tmp_path / "shared.pkl", tmp_path / "a.pt")
    convert(tmp_path / "shared.pkl", tmp_path / "a.pt", limits=Limits(max_nodes=300_000))
    with open_checkpoint(tmp_path / "a.pt") as tree:
        assert tree.root["rows"][1999] == row and len(tree.root["rows"]) == 2000
    proc = cli("convert", tmp_path / "shared.pkl", tmp_path / "b.pt", "--max-nodes", "300000")
    assert proc.returncode == 0, proc.stderr
    monkeypatch.setenv("UCKPT_CONVERT_MAX_NODES", "300000")
    convert(tmp_path / "shared.pkl", tmp_path / "c.pt")
    assert diff(tmp_path / "a.pt", tmp_path / "c.pt").identical
    monkeypatch.setenv("UCKPT_CONVERT_MAX_NODES", "1000")
    with pytest.raises(LimitExceededError, match="more than 1,000 nodes .*the limit as set"):
        convert(tmp_path / "shared.pkl", tmp_path / "d.pt")
    with pytest.raises(ValueError, match="max_nodes must be a positive int"):
        Limits(max_nodes=0)
    assert cli("convert", tmp_path / "shared.pkl", tmp_path / "e.pt", "--max-nodes",
               "0").returncode == 2


def test_deep_and_cyclic_pickles_are_refused(tmp_path):
    """Nesting deeper than 200 levels (100,000 here, which would overflow Python's stack) and
    a list that contains itself are refused by name, never as a RecursionError."""
    depth = 100_000
    (tmp_path / "deep.pkl").write_bytes(b"\x80\x02" + b"(" * depth + b"l" * depth + b".")
    with pytest.raises(LimitExceededError, match="nests deeper than 200 levels") as info:
        convert(tmp_path / "deep.pkl", tmp_path / "out.pt")
    assert info.value.limit == "max_depth"
    loop = []
    loop.append(loop)
    (tmp_path / "cycle.pkl").write_bytes(pickle.dumps({"x": loop}, protocol=2))
    with pytest.raises(LimitExceededError, match=r"contains itself \(a reference cycle\)"):
        convert(tmp_path / "cycle.pkl", tmp_path / "out.pt")
    state = {"v": 1}
    for _ in range(300):  # an OrderedDict's pickled attributes nest too deep
        state = {"v": state}
    from collections import OrderedDict

    od = OrderedDict(w=1.0)
    od._metadata = state
    (tmp_path / "meta.pkl").write_bytes(pickle.dumps(od, protocol=2))
    with pytest.raises(LimitExceededError, match="nests deeper than 200 levels"):
        convert(tmp_path / "meta.pkl", tmp_path / "out.pt")


@pytest.mark.parametrize("data,message", [
    (b"\x80\x02Nr\xff\xff\xff\x3f.", "stores memo entry 1073741823 after 3 opcodes"),
    (b"\x80\x04\x8e" + (1 << 62).to_bytes(8, "little") + b".", "not a valid pickle"),
    (b"\x80\x02X\xff\xff\xff\x7f.", "not a valid pickle"),
])
def test_pickle_opcodes_cannot_allocate_beyond_the_file(tmp_path, data, message):
    """A memo index or a length far beyond the pickle is refused before CPython's unpickler
    would allocate for it (run under a 1.5 GiB address space: no bound, no pass)."""
    (tmp_path / "bomb.pkl").write_bytes(data)
    code, err, _ = measured("convert", tmp_path / "bomb.pkl", tmp_path / "out.pt",
                            address_space=3 << 29)
    assert code == 1 and "Traceback" not in err and message in err, err


def test_expanded_tensors_are_bounded_by_the_ratio(tmp_path):
    """A tensor whose stride repeats one stored element: a real torch expand converts; one
    that makes 4 GiB out of 4 bytes is refused by --max-ratio before anything is made."""
    import torch

    from uckpt.conversion.interchange import Leaf
    from uckpt.conversion.torch_writer import Emitter

    torch.save({"e": torch.arange(4.0).expand(3, 4)}, tmp_path / "e.pt")
    convert(tmp_path / "e.pt", tmp_path / "e.npz")
    assert (np.load(tmp_path / "e.npz")["e"] == np.tile(np.arange(4.0), (3, 1))).all()
    pkl = Emitter({}).dump({"w": Leaf("float32", (1 << 30,), lambda: None)})
    pkl = pkl.replace(b"J\x00\x00\x00\x40", b"J\x01\x00\x00\x00", 1)  # storage of 1 element
    pkl = pkl.replace(b"(J\x01\x00\x00\x00t\x89", b"(J\x00\x00\x00\x00t\x89", 1)  # stride 0
    torch_zip(tmp_path / "x.pt", pkl, {"data/0": b"\0" * 4})
    with pytest.raises(LimitExceededError, match="makes 4294967296 bytes out of 4 stored, "
                                                 "more than 1032 per byte") as info:
        convert(tmp_path / "x.pt", tmp_path / "x.npz")
    assert "--max-ratio" in str(info.value)
    pkl = Emitter({}).dump({"w": Leaf("float32", (1,) * 70, lambda: None)})
    torch_zip(tmp_path / "d.pt", pkl, {"data/0": b"\0" * 4})
    with pytest.raises(CorruptCheckpointError, match="a shape no array can have"):
        convert(tmp_path / "d.pt", tmp_path / "d.npz")


# -- zip members: sizes, inflation, names --------------------------------------------------------
def deflate_zeros(n: int, head: bytes = b"") -> Tuple[bytes, int]:
    """(raw deflate stream, CRC-32) of ``head`` followed by ``n`` zero bytes."""
    z, crc, zero = zlib.compressobj(9, zlib.DEFLATED, -15), zlib.crc32(head), bytes(1 << 20)
    parts = [z.compress(head)]
    for _ in range(n >> 20):
        parts.append(z.compress(zero))
        crc = zlib.crc32(zero, crc)
    parts.append(z.flush())
    return b"".join(parts), crc


BOMB = 256 << 20  # bytes of zeros in the deflate streams below (about 260 KB compressed)


@pytest.fixture(scope="module")
def bombs(tmp_path_factory):
    """NPZ files of 256 MiB of deflated zeros: honest; declaring 32 bytes but inflating to
    256 MiB; declaring in its .npy header 32 bytes where the member declares 256 MiB."""
    d = tmp_path_factory.mktemp("bombs")
    head = npy_header((BOMB,))
    stream, crc = deflate_zeros(BOMB, head)
    raw_zip(d / "honest.npz", [(b"w.npy", stream, crc, len(head) + BOMB, 8, 0)])
    raw_zip(d / "lying.npz", [(b"w.npy", stream, crc, len(head) + 32, 8, 0)])
    small = npy_header((32,))
    stream, crc = deflate_zeros(BOMB, small)
    raw_zip(d / "header.npz", [(b"w.npy", stream, crc, len(small) + BOMB, 8, 0)])
    return d


def test_deflated_npz_needs_one_array_not_two(bombs, tmp_path, baseline_kib):
    """256 MiB of zeros deflated into 260 KB convert with a peak of the array plus buffers
    (before: twice the array), and the output holds them."""
    code, err, kib = measured("convert", bombs / "honest.npz", tmp_path / "out.npz")
    assert code == 0, err
    assert kib - baseline_kib < (BOMB >> 10) + (48 << 10), (kib, baseline_kib)
    out = np.load(tmp_path / "out.npz", mmap_mode="r")["w"]
    assert out.shape == (BOMB,) and not out[::1 << 16].any()


def test_npz_member_inflating_past_its_declared_size_is_refused(bombs, tmp_path, baseline_kib):
    code, err, kib = measured("convert", bombs / "lying.npz", tmp_path / "out.npz")
    assert code == 1 and "Traceback" not in err, err
    assert "zip member 'w.npy' inflates to more than the 160 bytes it declares" in err
    assert kib - baseline_kib < 48 << 10, (kib, baseline_kib)
    with pytest.raises(UnsafeInputError, match="inflates to more than"):
        with open_checkpoint(bombs / "lying.npz") as tree:
            tree.root["w"].read()


def test_npz_header_must_agree_with_its_member_before_inflating(bombs, tmp_path, baseline_kib):
    code, err, kib = measured("convert", bombs / "header.npz", tmp_path / "out.npz")
    assert code == 1 and "Traceback" not in err, err
    assert "array 'w' declares 32 bytes" in err and f"holds {BOMB} after" in err, err
    assert kib - baseline_kib < 48 << 10, (kib, baseline_kib)


def test_damaged_deflate_members_are_refused(tmp_path):
    head = npy_header((64,))
    stream, crc = deflate_zeros(0, head + b"\1" * 64)
    raw_zip(tmp_path / "crc.npz", [(b"w.npy", stream, crc ^ 1, len(head) + 64, 8, 0)])
    with pytest.raises(ChecksumMismatchError, match="fails its CRC-32 check"):
        convert(tmp_path / "crc.npz", tmp_path / "out.npz")
    raw_zip(tmp_path / "short.npz", [(b"w.npy", stream[:-8], crc, len(head) + 64, 8, 0)])
    with pytest.raises(CorruptCheckpointError, match="ends after|incomplete|not a valid"):
        convert(tmp_path / "short.npz", tmp_path / "out.npz")
    raw_zip(tmp_path / "enc.npz", [(b"w.npy", stream, crc, len(head) + 64, 8, 1)])
    with pytest.raises(UnsupportedObjectError, match="is encrypted"):
        convert(tmp_path / "enc.npz", tmp_path / "out.npz")
    with zipfile.ZipFile(tmp_path / "bz.npz", "w", zipfile.ZIP_BZIP2) as z:
        z.writestr("w.npy", head + b"\0" * 64)
    with pytest.raises(UnsupportedObjectError, match="compression method 12"):
        convert(tmp_path / "bz.npz", tmp_path / "out.npz")
    assert not leftovers(tmp_path)


@pytest.mark.parametrize("name,why", [
    ("../../x", "'..' component"), ("/etc/x", "absolute path"), ("a\\b", "backslash"),
    ("a/./b", "'.' component"), ("a//b", "empty component"), ("", "it is empty"),
    ("C:x", "drive letter"), ("a\nb", "control character"), ("a/", "empty component"),
])
def test_npz_unsafe_member_names_are_refused(tmp_path, name, why):
    with zipfile.ZipFile(tmp_path / "a.npz", "w") as z:
        z.writestr("ok.npy", _npy((1,), b"\0" * 8))
        z.writestr(name + ".npy", _npy((1,), b"\0" * 8))
    for target in ("out.npz", "out.safetensors"):
        with pytest.raises(UnsafeNameError) as info:
            convert(tmp_path / "a.npz", tmp_path / target)
        assert info.value.name == name + ".npy" and why in str(info.value)
        assert repr(name + ".npy") in str(info.value)
    assert not leftovers(tmp_path) and {p.name for p in tmp_path.iterdir()} == {"a.npz"}


def test_npz_name_with_nul_is_refused_and_cli_names_the_member(tmp_path):
    """zipfile cuts a name at NUL (so "w.npy\\0x" would collide with "w.npy")."""
    data = _npy((1,), b"\0" * 8)
    raw_zip(tmp_path / "nul.npz", [(b"w.npy\0x", data, zlib.crc32(data), len(data), 0, 0)])
    with pytest.raises(UnsafeNameError, match="holds a NUL character"):
        convert(tmp_path / "nul.npz", tmp_path / "out.npz")
    with zipfile.ZipFile(tmp_path / "dots.npz", "w") as z:
        z.writestr("../../x.npy", data)
    assert_error(cli("convert", tmp_path / "dots.npz", tmp_path / "out.npz"),
                 "zip member '../../x.npy' cannot be used as a name: it has a '..' component")
    assert not (tmp_path / "out.npz").exists() and not (tmp_path.parent / "x.npy").exists()


def test_safetensors_unsafe_keys_are_refused(tmp_path):
    _safetensors(tmp_path / "a.safetensors",
                 b'{"../w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', b"\0" * 4)
    with pytest.raises(UnsafeNameError, match=r"tensor '../w' cannot be used as a name"):
        convert(tmp_path / "a.safetensors", tmp_path / "out.pt")


@pytest.mark.filterwarnings("ignore::uckpt.conversion.ConvertWarning")
@pytest.mark.parametrize("key", ["..", ".", "", "a\\b", "x\0y"])
def test_unsafe_dict_keys_are_refused_where_names_become_paths(tmp_path, key):
    """A dict key becomes a zip member name (NPZ) or an HDF5 path (HDF5): refused there;
    Pickle, safetensors and uckpt hold it as it is."""
    (tmp_path / "k.pkl").write_bytes(pickle.dumps({"m": {key: 1.5, "ok": 2}}, protocol=2))
    for target, what in (("out.npz", "a zip member name"), ("out.h5", "an HDF5 path")):
        with pytest.raises(UnsafeNameError, match=f"cannot be written as {what}"):
            convert(tmp_path / "k.pkl", tmp_path / target)
    for target in ("out.pt", "out.safetensors", "out_ckpt"):
        convert(tmp_path / "k.pkl", tmp_path / target)
        with open_checkpoint(tmp_path / target) as tree:
            assert tree.root["m"][key] == 1.5
    assert not leftovers(tmp_path)


# -- HDF5 ------------------------------------------------------------------------------------------
def test_hdf5_hard_link_bomb_is_refused_and_hard_links_share(tmp_path):
    """Groups hard-linked ten times at each of seven levels (10**7 nodes from a small file)
    are refused by --max-nodes; a dataset linked twice is one shared array."""
    with h5py.File(tmp_path / "bomb.h5", "w") as f:
        g = f.create_group("g0")
        g["w"] = np.ones(1)
        for level in range(1, 8):
            new = f.create_group(f"g{level}")
            for i in range(10):
                new[str(i)] = g
            g = new
    with pytest.raises(LimitExceededError, match="more than 100,000 nodes"):
        convert(tmp_path / "bomb.h5", tmp_path / "out.npz")
    with h5py.File(tmp_path / "tied.h5", "w") as f:
        f["a"] = np.arange(3.0)
        f["b"] = f["a"]
    with open_checkpoint(tmp_path / "tied.h5") as tree:
        assert tree.root["a"] is tree.root["b"]
    convert(tmp_path / "tied.h5", tmp_path / "tied_ckpt")
    assert diff(tmp_path / "tied.h5", tmp_path / "tied_ckpt").identical


def _vlen_bomb(path):
    """An HDF5 file whose string attribute's length field says 4 GiB (the value is 5 bytes)."""
    with h5py.File(path, "w") as f:
        f["w"] = np.ones(2)
        f["w"].attrs["name"] = "dense"
    data = bytearray(path.read_bytes())
    heap = data.index(b"GCOL")
    for at in (m.start() - 4 for m in re.finditer(re.escape(struct.pack("<Q", heap)), data)):
        if data[at:at + 4] == struct.pack("<I", 5):  # length 5, then this heap's address
            data[at:at + 4] = struct.pack("<I", 0xFFFFFF00)
            path.write_bytes(bytes(data))
            return
    raise AssertionError("no variable-length descriptor found")


def test_hdf5_string_length_bomb_is_read_in_a_bounded_child(tmp_path, baseline_kib):
    """HDF5 allocates (and clears) what a string's length field declares before reading it:
    4 GiB here. The attribute is read in a child process of bounded memory: a clean error,
    and a peak far under 4 GiB (forked child; a fresh one when threads run)."""
    _vlen_bomb(tmp_path / "bomb.h5")
    code, err, kib = measured("convert", tmp_path / "bomb.h5", tmp_path / "out.npz")
    assert code == 1 and "Traceback" not in err, err
    assert "HDF5 cannot read a value: attribute 'name' of /w" in err, err
    assert kib - baseline_kib < 384 << 10, (kib, baseline_kib)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        with pytest.raises(CorruptCheckpointError, match="attribute 'name' of /w"):
            convert(tmp_path / "bomb.h5", tmp_path / "out.npz")
    finally:
        stop.set()
        other.join()


def test_sources_that_are_not_regular_files_are_refused(tmp_path):
    """A FIFO would block a reader forever: refused at once, whatever the format."""
    os.mkfifo(tmp_path / "fifo")
    for args in ((), ("--from", "hdf5"), ("--from", "npz"), ("--from", "pickle")):
        proc = cli("convert", tmp_path / "fifo", tmp_path / "out.npz", *args, timeout=60)
        assert_error(proc, "is a FIFO, not a regular file")


def test_dcp_data_file_that_is_a_symlink_is_refused(tmp_path):
    path = _dcp(tmp_path)
    data = next(path.glob("*.distcp"))
    data.rename(tmp_path / "elsewhere.distcp")
    data.symlink_to(tmp_path / "elsewhere.distcp")
    with pytest.raises(UnsafeInputError, match="is a symbolic link"):
        with open_checkpoint(path) as tree:
            tree.root["w"].read()
