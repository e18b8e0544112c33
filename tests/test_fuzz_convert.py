"""Fuzzing the readers of ``uckpt convert`` (issue 10, item 6): every mutated input converts
correctly or fails with a clean ``uckpt.errors.UckptError``; never another exception, a hang,
a crash or memory beyond a bound.

Valid inputs are made here (NPZ stored and deflated, a ``torch.save`` zip, a legacy
``torch.save`` file, a plain pickle, safetensors, HDF5), then mutated by hypothesis: byte
flips, truncations, insertions, and structured mutations (zip central-directory and local
header fields, ``.npy`` headers and pickle opcodes inside re-zipped members, pickle opcodes
and their arguments, safetensors header values). Each case runs in a long-lived worker
process (HDF5's C library, or a bug, could crash or hang it, which must fail the test, not
the run) under a hard timeout; the worker converts the case to a target format, checks that
a successful conversion reads back identical to its source (``uckpt.conversion.diff``),
that nothing is left behind, and reports the peak of its resident memory during the case
(Linux ``/proc/self/clear_refs``), which must stay under ``MEMORY_SLACK`` plus twice the
input's size. Generated decompression bombs and Hugging Face indexes (issue 25: Zstandard
in uckpt sources, deflate in NPZ, ``torch.save`` and ``.keras`` zips, non-string
``weight_map`` values) are held to the stated bound of a conversion: that plus the largest
array the input really holds. With ``UCKPT_FUZZ_KEEP=DIR`` failing inputs are also copied
into DIR.

The normal run is bounded (derandomized, ``NORMAL_EXAMPLES`` per input kind: well under a
minute on two busy cores). ``UCKPT_FUZZ_LONG=1`` runs ``LONG_EXAMPLES`` per kind with a
random seed (hypothesis prints the seed and the failing example to reproduce it):

    UCKPT_FUZZ_LONG=1 .venv/bin/python -m pytest -q tests/test_fuzz_convert.py
"""
import io
import json
import os
import pickle
import pickletools
import re
import select
import shutil
import subprocess
import sys
import time
import warnings
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

LONG = os.environ.get("UCKPT_FUZZ_LONG", "") not in ("", "0")
NORMAL_EXAMPLES = 250
LONG_EXAMPLES = 5000
CASE_TIMEOUT = 120.0  # seconds one case may take on a busy machine before it is a hang
MEMORY_SLACK = 64 << 20  # bytes a case may add to the worker's resident memory, plus 2x input
TARGETS = ("uckpt", "npz", "pickle", "safetensors", "hdf5")
EXT = {"uckpt": "", "npz": ".npz", "pickle": ".pt", "safetensors": ".safetensors",
       "hdf5": ".h5"}

FUZZ = settings(max_examples=LONG_EXAMPLES if LONG else NORMAL_EXAMPLES, deadline=None,
                derandomize=not LONG, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])


# -- the worker: runs in its own process ---------------------------------------------------------
def _peak_reset() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM, the peak resident size, to the current one
        return True
    except OSError:
        return False


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def run_case(case: dict) -> dict:
    """Convert one case (in the worker); the outcome as a JSON-able dict."""
    import shutil
    import traceback

    from uckpt.conversion import ConvertWarning, Limits, convert, diff
    from uckpt.errors import UckptError

    src, dst = Path(case["src"]), Path(case["dst"])
    limits = Limits(max_ratio=case["max_ratio"]) if case.get("max_ratio") else None
    measured = _peak_reset()
    base = _status("VmRSS")
    out = {"outcome": "ok"}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvertWarning)
            try:
                convert(src, dst, src_format=case.get("src_format"), force=True, limits=limits)
            finally:
                out["convert_peak"] = _status("VmHWM") - base if measured else 0
            report = diff(src, dst, a_format=case.get("src_format"), limits=limits)
        if not report.identical:
            out = {"outcome": "mismatch",
                   "differences": [d.text() for d in report.differences[:5]]}
    except UckptError as e:
        out.update(outcome="error", type=type(e).__name__, message=str(e)[:300])
    except Exception as e:  # what the test exists to catch
        out.update(outcome="foreign", type=f"{type(e).__module__}.{type(e).__qualname__}",
                   message=str(e)[:300], traceback=traceback.format_exc()[-3000:])
    out["peak"] = _status("VmHWM") - base if measured else 0
    out["leftovers"] = [p.name for p in dst.parent.iterdir()
                        if ".uckpt-tmp-" in p.name or p.name.startswith("uckpt-keras-")]
    if dst.is_dir():
        shutil.rmtree(dst)
    elif dst.exists():
        dst.unlink()
    return out


def worker() -> None:
    """Read one JSON case per line on stdin; answer one JSON line on stdout."""
    import importlib

    import uckpt.conversion.api as api

    for name in ("h5py", "ml_dtypes"):  # imported before measuring, as every format's module
        importlib.import_module(name)

    for name in set(api.READERS.values()) | set(api.WRITERS.values()):
        api._module(name)
    for line in sys.stdin:
        sys.stdout.write(json.dumps(run_case(json.loads(line))) + "\n")
        sys.stdout.flush()


class Worker:
    """The worker process, seen from the test: ``run(case)`` with a hard timeout."""

    def __init__(self, log: Path, tmp: Path) -> None:
        self.log, self.tmp = log, tmp
        self.proc = None

    def start(self) -> None:
        env = dict(os.environ, PYTHONWARNINGS="ignore", PYTHONPATH=os.pathsep.join(sys.path),
                   TMPDIR=str(self.tmp))  # so that temporary files left behind are seen
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=open(self.log, "ab"), env=env)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def run(self, case: dict) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        self.proc.stdin.write((json.dumps(case) + "\n").encode())
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], CASE_TIMEOUT)
        if not ready:
            self.stop()
            return {"outcome": "hang"}
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            self.proc = None
            return {"outcome": "crash", "returncode": code,
                    "stderr": self.log.read_text(errors="replace")[-2000:]}
        return json.loads(line)


# -- valid inputs ----------------------------------------------------------------------------------
def _arrays():
    rng = np.random.default_rng(3)
    return {"predictor/l1/W": rng.standard_normal((3, 4)).astype(np.float32),
            "predictor/l1/b": np.arange(4, dtype=np.int64),
            "flag": np.array(True), "name": np.array("adam"),
            "half": np.asfortranarray(rng.standard_normal((2, 3)).astype(np.float16)),
            "empty": np.zeros((0, 2), np.uint8)}


def _torch_state():
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    weight = model.state_dict()["weight"]
    return {"model": model.state_dict(),
            "optimizer": {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.ones(2)}},
                          "param_groups": [{"lr": 0.1, "betas": (0.9, 0.999), "params": [0]}]},
            "tied": weight, "view": weight[:, 1], "expanded": torch.arange(3.0).expand(2, 3),
            "bf16": torch.ones(2, dtype=torch.bfloat16), "epoch": 7, "note": "héllo"}


def make_seeds(directory: Path) -> dict:
    """Small valid inputs, one per kind: name -> bytes."""
    import h5py
    import torch

    seeds = {}
    np.savez(directory / "a.npz", **_arrays())
    np.savez_compressed(directory / "c.npz", **_arrays())
    torch.save(_torch_state(), directory / "t.pt")
    torch.save(_torch_state(), directory / "legacy.pt", _use_new_zipfile_serialization=False)
    (directory / "plain.pkl").write_bytes(pickle.dumps(
        {"a": [1, 2.5, None, "x", b"y", 2 ** 70], "b": {1: (True, -0.0)}, "c": [[]] * 3},
        protocol=4))
    tensors = {"w": np.arange(6, dtype="<f4").reshape(2, 3), "b": np.ones(2, "<i2")}
    header, offset = {}, 0
    for name, arr in tensors.items():
        header[name] = {"dtype": {"<f4": "F32", "<i2": "I16"}[arr.dtype.str],
                        "shape": list(arr.shape), "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
    text = json.dumps(header).encode()
    (directory / "s.safetensors").write_bytes(
        len(text).to_bytes(8, "little") + text + b"".join(a.tobytes() for a in tensors.values()))
    with h5py.File(directory / "k.h5", "w") as f:
        g = f.create_group("layers/dense")
        g.attrs["weight_names"] = [b"kernel:0", b"bias:0"]
        g.create_dataset("kernel", data=np.arange(12, dtype=np.float32).reshape(3, 4),
                         compression="gzip", chunks=(3, 2))
        g["bias"] = np.zeros(4, np.float64)
        f["tied"] = g["bias"]
        f["lr"] = np.float32(0.5)
        f.create_dataset("name", data="dense", dtype=h5py.string_dtype())
    for name, file in (("npz", "a.npz"), ("npz_deflated", "c.npz"), ("torch_zip", "t.pt"),
                       ("torch_legacy", "legacy.pt"), ("pickle", "plain.pkl"),
                       ("safetensors", "s.safetensors"), ("hdf5", "k.h5")):
        seeds[name] = (directory / file).read_bytes()
    from uckpt.conversion import convert  # and the converter's own output, as a source

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        convert(directory / "t.pt", directory / "own.safetensors")
    seeds["own_safetensors"] = (directory / "own.safetensors").read_bytes()
    return seeds


FORMAT_OF = {"npz": "npz", "npz_deflated": "npz", "torch_zip": "pickle",
             "torch_legacy": "pickle", "pickle": "pickle", "safetensors": "safetensors",
             "own_safetensors": "safetensors", "hdf5": "hdf5"}


# -- mutations -------------------------------------------------------------------------------------
def _interesting(width: int, original: int = 0):
    top = (1 << (8 * width)) - 1
    values = {0, 1, 2, 7, 64, 255, top, top >> 1, (top >> 1) + 1, original + 1,
              max(original - 1, 0), min(original * 2, top), min(original * 1000 + 1, top)}
    return st.one_of(st.sampled_from(sorted(v for v in values if 0 <= v <= top)),
                     st.integers(0, top))


def _put(data: bytes, at: int, width: int, value: int) -> bytes:
    return data[:at] + value.to_bytes(width, "little") + data[at + width:]


#: (offset, width) of the fields of a zip central-directory entry and a local header
CENTRAL = [(4, 2), (6, 2), (8, 2), (10, 2), (16, 4), (20, 4), (24, 4), (28, 2), (30, 2),
           (32, 2), (42, 4)]
LOCAL = [(4, 2), (6, 2), (8, 2), (14, 4), (18, 4), (22, 4), (26, 2), (28, 2)]
END = [(8, 2), (10, 2), (12, 4), (16, 4), (20, 2)]


@st.composite
def zip_field(draw, data: bytes) -> bytes:
    """One field of a central-directory entry, local header or end record set to an
    interesting value."""
    spots = [(m.start(), CENTRAL) for m in re.finditer(b"PK\x01\x02", data)]
    spots += [(m.start(), LOCAL) for m in re.finditer(b"PK\x03\x04", data)]
    spots += [(m.start(), END) for m in re.finditer(b"PK\x05\x06", data)]
    if not spots:
        return data
    start, fields = draw(st.sampled_from(spots))
    offset, width = draw(st.sampled_from(fields))
    at = start + offset
    if at + width > len(data):
        return data
    original = int.from_bytes(data[at:at + width], "little")
    return _put(data, at, width, draw(_interesting(width, original)))


def _pickle_ops(data: bytes):
    """(opcode, position, end) of every opcode of a valid pickle."""
    ops = list(pickletools.genops(data))
    out = []
    for i, (op, _, pos) in enumerate(ops):
        end = ops[i + 1][2] if i + 1 < len(ops) else len(data)
        out.append((op, pos, end))
    return out


_OPCODES = sorted({op.code.encode("latin1") for op in pickletools.opcodes})


@st.composite
def pickle_mutation(draw, data: bytes, base: int = 0) -> bytes:
    """Mutate the pickle ``data[base:]`` opcode-wise: replace an opcode, set a fixed-width
    argument (a length, a memo index, an int) to an interesting value, delete an opcode,
    or repeat a run of opcodes (new sharing, new nesting)."""
    try:
        ops = _pickle_ops(data[base:])
    except ValueError:
        return data
    if not ops:
        return data
    i = draw(st.integers(0, len(ops) - 1))
    op, pos, end = ops[i]
    pos, end = pos + base, end + base
    kind = draw(st.sampled_from(["opcode", "argument", "delete", "repeat"]))
    if kind == "opcode":
        return data[:pos] + draw(st.sampled_from(_OPCODES)) + data[pos + 1:]
    if kind == "argument" and end - pos - 1 in (1, 2, 4, 8):
        width = end - pos - 1
        original = int.from_bytes(data[pos + 1:end], "little")
        return _put(data, pos + 1, width, draw(_interesting(width, original)))
    if kind == "argument":  # a length-prefixed argument: set its length
        width = {"BINUNICODE": 4, "BINBYTES": 4, "SHORT_BINUNICODE": 1, "SHORT_BINBYTES": 1,
                 "SHORT_BINSTRING": 1, "BINSTRING": 4, "BINUNICODE8": 8, "BINBYTES8": 8,
                 "LONG1": 1, "LONG4": 4}.get(op.name)
        if width is None:
            return data
        original = int.from_bytes(data[pos + 1:pos + 1 + width], "little")
        return _put(data, pos + 1, width, draw(_interesting(width, original)))
    if kind == "delete":
        return data[:pos] + data[end:]
    j = draw(st.integers(i, min(len(ops) - 1, i + 8)))
    stop = ops[j][2] + base
    times = draw(st.integers(1, 4))
    return data[:stop] + data[pos:stop] * times + data[stop:]


def rezip(data: bytes, change) -> bytes:
    """The zip ``data`` with one member's content replaced by ``change(name, content)``
    (None: unchanged), written again with the same compression and valid CRCs."""
    src = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for info in src.infolist():
            content = src.read(info)
            new = change(info.filename, content)
            z.writestr(info, content if new is None else new)
    return out.getvalue()


@st.composite
def member_mutation(draw, data: bytes) -> bytes:
    """Mutate the content of one zip member (a .npy header, a data.pkl) and re-zip it, so
    the change gets past the zip's own CRC checks."""
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    name = draw(st.sampled_from(names))
    content = zipfile.ZipFile(io.BytesIO(data)).read(name)
    if name.endswith("data.pkl"):
        new = draw(pickle_mutation(content))
    elif name.endswith(".npy") and content.startswith(b"\x93NUMPY"):
        new = draw(npy_header_mutation(content))
    else:
        new = draw(byte_mutation(content))
    return rezip(data, lambda n, c: new if n == name else None)


SHAPES = ["()", "(0,)", "(-1,)", "(1,)", "(3, 4)", "(4, 3)", "(2**40,)", "(0, 2**70)",
          "(1,)*65", "(10**12,)", "(1, 2, 3, 4)", "'x'", "(1.5,)", "(2**63,)"]
DESCRS = ["'<f4'", "'>f8'", "'|O'", "'<U5'", "'|S3'", "'|b1'", "'<c16'", "'|V8'",
          "[('a', '<f4')]", "'<i8'", "'<M8[s]'", "'<f2'", "'<f4'*99999", "42"]


@st.composite
def npy_header_mutation(draw, content: bytes) -> bytes:
    """Rewrite a .npy header with another shape, descr or fortran_order (data unchanged)."""
    head_len = int.from_bytes(content[8:10], "little") if content[6] == 1 else \
        int.from_bytes(content[8:12], "little")
    start = 10 if content[6] == 1 else 12
    text = content[start:start + head_len].decode("latin1")
    which = draw(st.sampled_from(["shape", "descr", "fortran"]))
    if which == "shape":
        text = re.sub(r"'shape': \([^)]*\)", "'shape': " + draw(st.sampled_from(SHAPES)), text)
    elif which == "descr":
        text = re.sub(r"'descr': '[^']*'", "'descr': " + draw(st.sampled_from(DESCRS)), text)
    else:
        text = text.replace("False", "True") if "False" in text else text.replace("True", "1")
    body = text.strip().encode("latin1")
    body += b" " * (-(start + len(body) + 1) % 64) + b"\n"
    size = len(body).to_bytes(2 if content[6] == 1 else 4, "little")
    return content[:8] + size + body + content[start + head_len:]


NUMBERS = ["-1", "0", "1", "4294967296", "9223372036854775808", "18446744073709551616",
           "1e308", "1.5", "null", "\"7\"", "[]", "1" * 5000]
CODES = ["\"F32\"", "\"BF16\"", "\"F8_E4M3\"", "\"C64\"", "\"U64\"", "\"BOOL\"", "\"OBJ\"",
         "\"F64\"", "7"]


@st.composite
def safetensors_mutation(draw, data: bytes) -> bytes:
    """Change one number, dtype or name of the JSON header; keep or fix its length field."""
    n = int.from_bytes(data[:8], "little")
    header = data[8:8 + n].decode("utf-8")
    which = draw(st.sampled_from(["number", "dtype", "name", "metadata"]))
    if which == "number":
        spots = list(re.finditer(r"(?<=[\[,:])\s*-?\d+", header))
        if spots:
            m = draw(st.sampled_from(spots))
            header = header[:m.start()] + draw(st.sampled_from(NUMBERS)) + header[m.end():]
    elif which == "dtype":
        spots = list(re.finditer(r'"[A-Z0-9_]+"', header))
        if spots:
            m = draw(st.sampled_from(spots))
            header = header[:m.start()] + draw(st.sampled_from(CODES)) + header[m.end():]
    elif which == "name":
        new = draw(st.sampled_from(["../../x", "/abs", "a\\\\b", "a//b", ".", "", "a\\u0000b",
                                    "a/./b", "x/..", "\\ud800", "C:x", "w/b"]))
        header = header.replace('"w"', json.dumps(new) if "\\" not in new else f'"{new}"', 1)
    else:
        header = header.replace('"uckpt":', '"uckpt_":', 1) if draw(st.booleans()) else \
            re.sub(r'"wrapped_root\\?":\s*\w+', '"wrapped_root":true', header, count=1)
    body = header.encode("utf-8", "surrogatepass")
    length = len(body) if draw(st.booleans()) else n
    return length.to_bytes(8, "little") + body + data[8 + n:]


@st.composite
def byte_mutation(draw, data: bytes) -> bytes:
    """Byte flips, a truncation, an insertion, or a run overwritten with one byte."""
    if not data:
        return draw(st.binary(max_size=16))
    kind = draw(st.sampled_from(["flip", "truncate", "insert", "fill"]))
    at = draw(st.integers(0, len(data) - 1))
    if kind == "flip":
        out = bytearray(data)
        for _ in range(draw(st.integers(1, 4))):
            at = draw(st.integers(0, len(data) - 1))
            out[at] ^= draw(st.integers(1, 255))
        return bytes(out)
    if kind == "truncate":
        return data[:at]
    if kind == "insert":
        return data[:at] + draw(st.binary(min_size=1, max_size=64)) + data[at:]
    n = draw(st.integers(1, 64))
    return data[:at] + bytes([draw(st.sampled_from([0, 0xFF, 0x7F, 0x80]))]) * n + data[at + n:]


def _legacy_pickle_start(data: bytes) -> int:
    """Where the second, third and fourth pickles of a legacy torch.save file start (the
    fuzzer mutates one of the four)."""
    starts, pos = [0], 0
    for _ in range(3):
        f = io.BytesIO(data[pos:])
        for op, _, _ in pickletools.genops(f):
            pass
        pos += f.tell()
        starts.append(pos)
    return starts


def mutation(seed: str, data: bytes):
    """The strategy of mutations for one kind of input."""
    generic = byte_mutation(data)
    if seed in ("npz", "npz_deflated", "torch_zip"):
        return st.one_of(generic, zip_field(data), member_mutation(data))
    if seed == "torch_legacy":
        return st.one_of(generic, st.sampled_from(_legacy_pickle_start(data)).flatmap(
            lambda base: pickle_mutation(data, base)))
    if seed == "pickle":
        return st.one_of(generic, pickle_mutation(data))
    if seed in ("safetensors", "own_safetensors"):
        return st.one_of(generic, safetensors_mutation(data))
    head = data[:4096]  # HDF5: its superblock and first object headers, then the rest
    return st.one_of(generic, byte_mutation(head).map(lambda h: h + data[4096:]))


# -- the tests -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fuzz(tmp_path_factory):
    directory = tmp_path_factory.mktemp("fuzz")
    seeds = make_seeds(directory)
    cases = directory / "cases"
    cases.mkdir()
    w = Worker(directory / "worker.log", cases)
    yield seeds, cases, w
    w.stop()


def size_of(src: Path) -> int:
    """Bytes of an input: a file, or every file of a directory."""
    if src.is_dir():
        return sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
    return src.stat().st_size


def check(result: dict, src: Path, held: int = 0, streamed: bool = False) -> None:
    """The outcome is a conversion or a uckpt error, with nothing left behind and bounded
    memory: the conversion within ``MEMORY_SLACK`` plus twice the input plus ``held``, the
    largest array the input really holds (docs/convert.md, "Memory and progress"); the
    whole case within that too where one side of the diff is a uckpt checkpoint
    (``streamed``: its arrays stream, the diff holds at most the other side's array),
    else (the diff holds an array of each side) within one more ``held``. A failing
    input is kept beside ``src`` (``*.failing``) to reproduce it."""
    limit = MEMORY_SLACK + 2 * size_of(src) + held
    diff_held = 0 if streamed else held
    problem = None
    if result["outcome"] not in ("ok", "error"):
        problem = (f"{result['outcome']}: {result.get('type', '')} {result.get('message', '')}"
                   f"\n{result.get('traceback', '')}{result.get('differences', '')}"
                   f"{result.get('stderr', '')}")
    elif result["leftovers"]:
        problem = f"left behind: {result['leftovers']}"
    elif result.get("convert_peak", 0) > limit:
        problem = f"the conversion took {result['convert_peak']} bytes, over {limit}: {result}"
    elif result["peak"] > limit + diff_held:
        problem = f"the case took {result['peak']} bytes more memory, over " \
                  f"{limit + diff_held}: {result}"
    if problem:
        kept = src.with_name(src.name + ".failing")
        keep(src, kept)
        if os.environ.get("UCKPT_FUZZ_KEEP"):  # a directory the developer names, to keep them
            keep(src, Path(os.environ["UCKPT_FUZZ_KEEP"]) / f"{src.stem}-{time.time_ns()}.failing")
        pytest.fail(f"{problem}\n(input kept as {kept})", pytrace=False)


def keep(src: Path, to: Path) -> None:
    if src.is_dir():
        shutil.rmtree(to, ignore_errors=True)
        shutil.copytree(src, to)
    else:
        to.write_bytes(src.read_bytes())


@pytest.mark.timeout(1800 if LONG else 600)
@pytest.mark.parametrize("seed", sorted(FORMAT_OF))
def test_mutated_input_converts_or_fails_cleanly(fuzz, seed):
    seeds, cases, w = fuzz
    original = seeds[seed]
    src = cases / f"{seed}.src"
    # the unmutated seed converts exactly, to every target
    for target in TARGETS:
        src.write_bytes(original)
        result = w.run({"src": str(src), "dst": str(cases / ("out" + EXT[target]))})
        assert result["outcome"] == "ok", (seed, target, result)

    @FUZZ
    @given(data=st.data())
    def case(data):
        mutated = data.draw(mutation(seed, original), label="mutated")
        target = data.draw(st.sampled_from(TARGETS), label="target")
        named = data.draw(st.booleans(), label="format named")
        src.write_bytes(mutated)
        result = w.run({"src": str(src), "dst": str(cases / ("out" + EXT[target])),
                        "src_format": FORMAT_OF[seed] if named else None})
        check(result, src)
        kind = result.get("type", result["outcome"])
        seen[kind] = seen.get(kind, 0) + 1

    seen = {}
    case()
    print(f"{seed}: {sum(seen.values())} cases: {seen}")  # shown with pytest -s


@pytest.mark.filterwarnings("ignore::uckpt.conversion.ConvertWarning")
@pytest.mark.parametrize("target", TARGETS)
def test_what_the_fuzzer_found_stays_fixed(tmp_path, target):
    """Found by this suite: a pickle of None came back from NPZ, safetensors and HDF5 as an
    empty dict (a record's None root was taken for "no match"); a 0-d complex128 array could
    not be written to safetensors (its raw bits need a trailing axis); a string holding a
    NUL could not be written to HDF5 (now kept in the structure record only)."""
    from uckpt.conversion import convert, diff, open_checkpoint

    np.savez(tmp_path / "c16.npz", z=np.array(1 + 2j))
    (tmp_path / "none.pkl").write_bytes(pickle.dumps(None, protocol=2))
    (tmp_path / "nul.pkl").write_bytes(pickle.dumps({"s": "x\0y", "n": 1}, protocol=2))
    for name, check in (("none.pkl", lambda root: root is None),
                        ("c16.npz", lambda root: root["z"].read() == 1 + 2j),
                        ("nul.pkl", lambda root: root == {"s": "x\0y", "n": 1})):
        src, dst = tmp_path / name, tmp_path / f"{name}_out{EXT[target]}"
        convert(src, dst)
        assert diff(src, dst).identical
        with open_checkpoint(dst) as tree:
            assert check(tree.root), (name, tree.root)


def test_the_worker_reports_foreign_errors_hangs_and_memory(fuzz, tmp_path):
    """The control: the harness itself sees what it is there to see."""
    seeds, _, w = fuzz
    src = tmp_path / "a.npz"
    src.write_bytes(seeds["npz"])
    ok = w.run({"src": str(src), "dst": str(tmp_path / "out.npz")})
    assert ok["outcome"] == "ok" and ok["peak"] < MEMORY_SLACK
    bad = w.run({"src": str(tmp_path / "missing"), "dst": str(tmp_path / "out.npz")})
    assert bad["outcome"] == "error" and bad["type"] == "CheckpointNotFoundError"
    foreign = w.run({"src": str(src), "dst": str(tmp_path / "out.npz"), "src_format": 3})
    assert foreign["outcome"] == "foreign" and "AttributeError" in foreign["type"]


# -- memory bounds: decompression bombs and hostile indexes (issue 25, section 3) ----------------
BOMB_EXAMPLES = 400 if LONG else 20
BOMB_FUZZ = settings(FUZZ, max_examples=BOMB_EXAMPLES)
MIB = 1 << 20


def _json_values():
    atoms = (st.none() | st.booleans() | st.integers(-2, 1 << 40) | st.floats(allow_nan=False)
             | st.text(max_size=4) | st.just("model.safetensors"))
    return st.recursive(atoms, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.text(max_size=3), inner, max_size=3), max_leaves=6)


@st.composite
def uckpt_bomb(draw, where: Path):
    """A uckpt checkpoint of 1-128 MiB of zeros (or a short ramp) in Zstandard frames (saved,
    or one frame of RLE blocks written by hand, which may hold only half of what it
    declares), its declared shape sometimes multiplied (the manifest re-sealed), read with
    the default ratio or a raised one. Held: the array, where its shape is true and within
    the ratio (a frame holding half is refused once the array is allocated)."""
    import uckpt

    from fuzz_common import manifest_doc, seal_manifest

    from bombs import write_bomb

    n = draw(st.sampled_from([1, 3, 24, 24, 128]), label="MiB") * MIB  # 128: past the slack
    made = draw(st.sampled_from(["zeros", "ramp", "rle", "rle holding half"]), label="made")
    factor = draw(st.sampled_from([1, 1, 1, 2, 1 << 12, 1 << 40]), label="shape factor")
    raised = draw(st.booleans(), label="max_ratio raised")
    shutil.rmtree(where, ignore_errors=True)
    if made.startswith("rle"):  # one frame of RLE blocks, written by hand (32,768x)
        write_bomb(where, n, hostile=made == "rle holding half")
    else:
        arr = np.zeros(n, np.uint8) if made == "zeros" else (np.arange(n) % 251).astype(np.uint8)
        uckpt.save(where, {"w": arr, "b": np.arange(3.0)}, compression="zstd")
    stored = sum(p.stat().st_size for p in where.glob("data-*.bin"))
    if factor != 1:
        like = (where / "manifest.json").read_bytes()
        doc = manifest_doc(like)  # a grid as a list of chunks
        entry = doc["arrays"]["w"]
        entry["shape"][0] *= factor
        entry["chunks"][0]["shape"][0] *= factor
        text = json.dumps(doc, separators=(",", ":")).encode()
        (where / "manifest.json").write_bytes(seal_manifest(text, like))
    held = n if factor == 1 and (raised or n <= 1032 * stored) else 0
    return {"src": str(where), "max_ratio": (1 << 20) if raised else None}, held


@st.composite
def npz_bomb(draw, where: Path):
    """An NPZ of one deflated member of 1-24 MiB of zeros, whose .npy header and zip
    entry declare its true size or lie. Held: the array, when nothing lies."""
    from bombs import deflated_zeros, npy_header, raw_zip

    n = draw(st.integers(1, 24), label="MiB") * MIB
    shape = draw(st.sampled_from([n, n, 32, 4 * n]), label="npy shape")
    stream, crc, size = deflated_zeros(n // MIB, head=npy_header((shape,)))
    declared = draw(st.sampled_from([size, size, 32, size + MIB, 2 * size]), label="declared")
    raw_zip(where, [(b"w.npy", stream, crc, declared, 8, 0)])
    return {"src": str(where)}, n if shape == n and declared == size else 0


@st.composite
def torch_bomb(draw, where: Path):
    """A torch.save zip whose storage member is deflated (1-16 MiB of zeros) and declares
    its true size or lies. Held: the tensor, when its size is true."""
    import torch

    from bombs import deflated_zeros, raw_zip

    n = draw(st.integers(1, 16), label="MiB") * MIB
    buf = io.BytesIO()
    torch.save({"w": torch.zeros(n, dtype=torch.uint8)}, buf)
    members, honest = [], True
    for info in zipfile.ZipFile(buf).infolist():
        content = zipfile.ZipFile(buf).read(info)
        name = info.filename.encode()
        if info.filename.endswith("/data/0"):
            stream, crc, size = deflated_zeros(n // MIB)
            declared = draw(st.sampled_from([size, size, size - 1, size + 1, 16]),
                            label="declared")
            honest = declared == size
            members.append((name, stream, crc, declared, 8, 0))
        else:
            members.append((name, content, zlib.crc32(content), len(content), 0, 0))
    raw_zip(where, members)
    return {"src": str(where)}, n if honest else 0


@st.composite
def keras_bomb(draw, where: Path):
    """A .keras archive whose deflated weights member is 1-128 MiB of HDF5 user block (zeros)
    then a small HDF5 file, declaring its true size or lying. Held: nothing large (the
    zeros are copied to disk a piece at a time, never held)."""
    from bombs import keras_archive

    mib = draw(st.sampled_from([1, 2, 16, 16, 128]), label="MiB")  # 128: past the slack
    keras_archive(where, mib, draw(st.sampled_from([0, 0, -1, 1, -MIB, 1 << 31]), label="lie"))
    return {"src": str(where)}, 0


@st.composite
def hf_index(draw, where: Path):
    """A Hugging Face directory (or its index file alone) whose index has any JSON values
    in ``weight_map`` and ``metadata``; sometimes both kinds of index."""
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir()
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    (where / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header +
                                              np.ones(2, "<f4").tobytes())
    values = _json_values()
    weight_map = draw(st.one_of(values, st.dictionaries(
        st.sampled_from(["w", "b", "zz"]), st.just("model.safetensors") | values,
        max_size=3)), label="weight_map")
    doc = {"weight_map": weight_map}
    if draw(st.booleans(), label="has metadata"):
        doc["metadata"] = draw(values | st.fixed_dictionaries({"total_size": values}),
                               label="metadata")
    index = where / "model.safetensors.index.json"
    index.write_text(json.dumps(doc))
    if draw(st.booleans(), label="other index"):
        other = draw(values, label="other weight_map")
        (where / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": other}))
    src = index if draw(st.booleans(), label="index file alone") else where
    return {"src": str(src), "src_format": draw(st.sampled_from([None, "hf"]))}, 0


BOMBS = {"uckpt_zstd": (uckpt_bomb, ""), "npz_deflate": (npz_bomb, ".npz"),
         "torch_deflate": (torch_bomb, ".pt"), "keras_deflate": (keras_bomb, ".keras"),
         "hf_index": (hf_index, "")}


@pytest.mark.timeout(1800 if LONG else 600)
@pytest.mark.parametrize("kind", sorted(BOMBS))
def test_bombs_and_hostile_indexes_stay_within_their_bound(fuzz, kind):
    """Every generated input converts within MEMORY_SLACK + 2 x its size + the largest array
    it really holds (the conversion alone; the diff may hold one more unless one side is a
    uckpt checkpoint, whose arrays it streams), or fails with a UckptError; both outcomes
    occur."""
    _, cases, w = fuzz
    generate, suffix = BOMBS[kind]
    where = cases / f"{kind}{suffix}"

    @BOMB_FUZZ
    @given(data=st.data())
    def case(data):
        spec, held = data.draw(generate(where), label=kind)
        target = data.draw(st.sampled_from(TARGETS), label="target")
        result = w.run({**spec, "dst": str(cases / ("out" + EXT[target]))})
        check(result, Path(spec["src"]), held, streamed=kind == "uckpt_zstd" or target == "uckpt")
        seen[result["outcome"]] = seen.get(result["outcome"], 0) + 1

    seen = {}
    case()
    print(f"{kind}: {seen}")
    assert "error" in seen and ("ok" in seen or kind == "hf_index"), seen


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    worker()
