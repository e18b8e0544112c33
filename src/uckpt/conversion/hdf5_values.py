"""HDF5 attributes and string datasets, read in a child process of bounded memory.

HDF5 reads a variable-length value (a string attribute, a string dataset) by first
allocating, and clearing, as many bytes as the value's 4-byte length field declares,
before it looks at the data: one flipped length makes a 10 KB file take 4 GiB. So every
attribute and every string dataset is read in a child process whose address space is
limited (``RLIMIT_AS``, Linux) to what it holds plus 256 MiB plus twice the file's
size; a value that needs more fails there, as a clean :class:`~uckpt.errors.
CorruptCheckpointError`, and a crash of the HDF5 library there cannot take the caller
down. The child is forked when the caller runs one Python thread (a few milliseconds),
else started afresh (``python -m uckpt.conversion.hdf5_values``, about half a second).

Values cross back as JSON: attributes in the form of :func:`encode_attr`, which
:func:`decode_attr` turns back into the same HDF5 types.
"""
from __future__ import annotations

import base64
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional

import numpy as np

from ..errors import CorruptCheckpointError

SLACK = 256 << 20  # bytes of address space a child may add, beyond twice the file's size
TIMEOUT = 60.0  # seconds a child may take (reading attributes takes milliseconds)


_FD_PATH = re.compile(r"/proc/\d+/fd/\d+")


@contextmanager
def h5_file(h5py, path: str) -> Iterator[Any]:
    """``h5py.File(path, "r")``, closed on leaving. A ``/proc/<pid>/fd/<n>`` path (a file
    without a name, see :mod:`.keras_archive`) is opened as a Python file object, since
    HDF5 asks for the real path of a name it opens, which such a file does not have."""
    raw = open(path, "rb") if _FD_PATH.fullmatch(path) else None
    try:
        f = h5py.File(raw if raw is not None else path, "r")
        try:
            yield f
        finally:
            f.close()
    finally:
        if raw is not None:
            raw.close()


# -- attribute values as JSON -------------------------------------------------------------------
def encode_attr(value: Any) -> Optional[Dict[str, Any]]:
    """An attribute value as JSON that :func:`decode_attr` turns back into the same HDF5
    type; None when it has no such form (compound, references)."""
    if isinstance(value, str):
        return {"t": "str", "v": value} if _text(value) else None
    if isinstance(value, bytes):  # also np.bytes_: a fixed-length string
        return {"t": "bytes", "v": value.decode("latin1")}
    arr = np.asarray(value)
    if arr.dtype.kind == "O":
        items = arr.ravel().tolist()
        if all(isinstance(i, str) and _text(i) for i in items):
            return {"t": "strs", "shape": list(arr.shape), "v": items}
        return None
    if arr.dtype.kind in "biufcS" and arr.dtype.names is None:
        return {"t": "array" if isinstance(value, np.ndarray) else "scalar",
                "dtype": arr.dtype.str, "shape": list(arr.shape),
                "data": base64.b64encode(arr.tobytes()).decode("ascii")}
    return None


def _text(value: str) -> bool:
    """Valid Unicode (h5py keeps bytes that are not UTF-8 as unpaired surrogates)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def decode_attr(doc: Dict[str, Any], h5py) -> Any:
    kind = doc.get("t")
    if kind == "str":
        return str(doc["v"])
    if kind == "bytes":
        return np.bytes_(str(doc["v"]).encode("latin1"))
    if kind == "strs":
        return np.array(doc["v"], dtype=h5py.string_dtype()).reshape(doc["shape"])
    if kind in ("array", "scalar"):
        arr = np.frombuffer(base64.b64decode(doc["data"]), dtype=np.dtype(doc["dtype"]))
        arr = arr.reshape(doc["shape"]).copy()
        return arr if kind == "array" else arr[()]
    raise ValueError(f"unknown attribute encoding {kind!r}")


# -- in the child ---------------------------------------------------------------------------------
def collect(path: str, attrs: List[str], strings: List[str]) -> Dict[str, Any]:
    """``{"attrs": {object: {name: encoded or None}}, "strings": {dataset: text}}``, or
    ``{"error": text}`` naming what could not be read."""
    import h5py

    out: Dict[str, Any] = {"attrs": {}, "strings": {}}
    where = ""
    try:
        with h5_file(h5py, path) as f:
            for name in attrs:
                obj = f[name]
                kept: Dict[str, Any] = {}
                for key in obj.attrs:
                    where = f"attribute {key!r} of {name}"
                    kept[key] = encode_attr(obj.attrs[key]) if _text(key) else None
                out["attrs"][name] = kept
            for name in strings:
                where = f"the string dataset {name}"
                out["strings"][name] = f[name].asstr()[()]
    except Exception as e:  # the child reports whatever it met, as text
        return {"error": f"{where or path}: {type(e).__name__}: {e}"}
    return out


def _die_with_parent() -> None:
    """Linux: the child is killed when its parent dies (a hung HDF5 call must not outlive
    the conversion that started it)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _limit_memory(budget: int) -> None:
    import resource

    try:
        with open("/proc/self/status") as f:
            size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        want = size + budget
        if hard == resource.RLIM_INFINITY or want < hard:
            resource.setrlimit(resource.RLIMIT_AS, (want, hard))
    except (OSError, ValueError, StopIteration):
        pass  # no /proc: the child runs unlimited (documented: the bound is Linux's)


def _child_main() -> None:
    _die_with_parent()
    request = json.loads(sys.stdin.read())
    _limit_memory(request["budget"])
    sys.stdout.write(json.dumps(collect(request["path"], request["attrs"],
                                        request["strings"])))


# -- in the caller --------------------------------------------------------------------------------
def read_values(path: str, attrs: List[str], strings: List[str]) -> Dict[str, Any]:
    """What :func:`collect` returns, read in a child process of bounded memory; raises
    :class:`~uckpt.errors.CorruptCheckpointError` when the child fails."""
    if not attrs and not strings:
        return {"attrs": {}, "strings": {}}
    request = {"path": os.path.abspath(path), "attrs": attrs, "strings": strings,
               "budget": SLACK + 2 * os.path.getsize(path)}
    if threading.active_count() == 1 and hasattr(os, "fork"):
        text, failure = _forked(request)
    else:
        text, failure = _spawned(request)
    if failure is None:
        try:
            result = json.loads(text)
        except ValueError:
            failure = "its answer was cut short"
        else:
            if "error" not in result:
                return result
            failure = result["error"]
    raise CorruptCheckpointError(
        f"{path}: HDF5 cannot read a value: {failure}", path=path,
        hint="the file is damaged or was crafted (HDF5 values are read with at most "
             f"{SLACK >> 20} MiB plus twice the file's size)")


def _forked(request: Dict[str, Any]):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 0
        try:
            os.close(r)
            _die_with_parent()
            _limit_memory(request["budget"])
            data = json.dumps(collect(request["path"], request["attrs"],
                                      request["strings"])).encode()
            view = memoryview(data)
            while view:
                view = view[os.write(w, view):]
        except BaseException:  # nothing may escape a forked child into the caller's code
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    chunks, deadline = [], time.monotonic() + TIMEOUT
    try:
        while True:
            ready, _, _ = select.select([r], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                break
            chunk = os.read(r, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(r)
        _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return "", f"the reading process ended by signal {os.WTERMSIG(status)}"
    if os.WEXITSTATUS(status):
        return "", "the reading process failed"
    return b"".join(chunks).decode("utf-8", "replace"), None


def _spawned(request: Dict[str, Any]):
    root = str(Path(__file__).resolve().parents[2])
    code = (f"import sys; sys.path.insert(0, {root!r}); "
            "from uckpt.conversion.hdf5_values import _child_main; _child_main()")
    try:
        proc = subprocess.run([sys.executable, "-c", code], input=json.dumps(request),
                              capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return "", f"the reading process took more than {TIMEOUT:.0f} s"
    if proc.returncode:
        return "", f"the reading process failed (exit status {proc.returncode})"
    return proc.stdout, None


if __name__ == "__main__":
    _child_main()
