"""Machinery of the checkpoint fuzz suite (tests/test_fuzz_checkpoint.py).

* :func:`fingerprint`: a flat, comparable description of a loaded tree (every
  leaf's type, dtype, shape and a hash of its bytes), so two results can be
  compared exactly and a difference named by its path.
* :func:`dumps`: JSON text with what ``json.dumps`` will not write on purpose:
  duplicate keys (:class:`Dup`), raw text such as 5,000-digit integers or
  100,000 nested brackets (:class:`Raw`); lone surrogates come out as ``\\ud800``
  escapes. :func:`seal_manifest` turns manifest text into manifest bytes the way
  the writer does (docs/format.md), so that a structured mutation reaches the
  parser behind the manifest's integrity check.
* A worker process (``python tests/fuzz_common.py serve WARM_ROOT``) runs one
  operation at a time on a checkpoint, under a time limit (``setitimer``; the
  handler raises, so even a blocking ``open`` of a FIFO returns), an
  address-space limit (``RLIMIT_AS``: a runaway allocation ends as a
  ``MemoryError`` instead of eating the machine) and measures the operation's
  peak resident memory (``VmHWM``, reset through ``/proc/self/clear_refs``).
  :class:`Worker` drives it from the test process and kills it if it does not
  answer (a hang the alarm could not break).
* :class:`Source`, :class:`Case`, :func:`run_case` and :func:`judge`: a case is a
  mutated copy of an intact checkpoint; :func:`judge` says what is wrong with
  each operation's outcome (the oracle, described in test_fuzz_checkpoint.py).

The memory bound of an operation (DESIGN invariant 9), above its resident size
before it starts: RSS_SLACK for those that stream (STREAM_OPS: the manifest
readers, verify, ls), whatever sizes the checkpoint declares; for those that
load (LOAD_OPS), twice the bytes of arrays its manifest declares (``accepts``:
what a load that passed its memory check allocates, and the plain copy the
worker fingerprints) + RSS_SLACK. RSS_SLACK (48 MiB)
covers the interpreter's own working memory: parsing a manifest of a few MB,
read blocks, Zstandard's buffers, thread stacks touched by the read threads,
NumPy temporaries; the checkpoints fuzzed are a few KB to 100 KB (or decode to
hundreds of MB: the decompression bombs), so anything that allocates by a
hostile declared size exceeds it by far.
"""
from __future__ import annotations

import dataclasses

import hashlib
import io
import json
import os
import re
import resource
import select
import shutil
import signal
import struct
import subprocess
import sys
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import crc32c
import numpy as np
from grid_listing import listed

HERE = Path(__file__).resolve().parent

#: seconds one operation may take in the worker before its alarm fires (the checkpoints
#: are tiny: a normal operation takes milliseconds even on a busy machine)
OP_SECONDS = 10.0
#: seconds the test process waits for an answer before it kills the worker
KILL_SECONDS = OP_SECONDS + 20.0
#: resident memory an operation may use beyond what it loads (see above)
RSS_SLACK = 48 << 20
#: address space the worker may reserve beyond its size after warm-up plus twice the
#: declared data (thread stacks and malloc arenas are reserved, not used): an allocation
#: of a hostile declared size fails even when it would not be touched
AS_SLACK = 256 << 20

#: operations on the checkpoint that read only its manifest, and those that read data too;
#: "manager" restores from the root, "ls" and "verify_all" are ``uckpt ls --json ROOT``
#: and ``uckpt verify --all ROOT``
MANIFEST_OPS = ("manifest", "inspect", "inspect_json")
DATA_OPS = ("load", "restore", "verify", "cli_verify", "verify_all")
OPS = MANIFEST_OPS + DATA_OPS + ("manager", "ls")
CLI_OPS = ("inspect", "inspect_json", "cli_verify", "verify_all")
#: operations bounded by a constant, and those bounded by what they load
STREAM_OPS = MANIFEST_OPS + ("verify", "cli_verify", "verify_all", "ls")
LOAD_OPS = ("load", "restore", "manager")


# --- comparing results --------------------------------------------------------------------------
def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "backslashreplace")).hexdigest()[:16]


def _plain_array(a: np.ndarray) -> np.ndarray:
    """What the NumPy-only reader of docs/format.md gives: bfloat16 widened to float32,
    float8 as its uint8 bits."""
    name = a.dtype.name
    if name == "bfloat16":
        return a.astype(np.float32)
    if name.startswith("float8"):
        return a.view(np.uint8)
    return a


def fingerprint(value: Any, plain: bool = False) -> Dict[str, str]:
    """path -> description of every node of a loaded tree (dict keys in order, container
    types and lengths, arrays by dtype, shape and a hash of their bytes, floats by their
    bits). ``plain``: describe arrays as the docs/format.md reader returns them."""
    out: Dict[str, str] = {}

    def walk(v: Any, path: str) -> None:
        if isinstance(v, dict):
            out[path] = f"dict {_digest(ascii([(type(k).__name__, _key_text(k)) for k in v]))}"
            for k, item in v.items():
                walk(item, f"{path}/{_key_text(k)}")
        elif isinstance(v, (list, tuple)):
            out[path] = f"{type(v).__name__}[{len(v)}]"
            for i, item in enumerate(v):
                walk(item, f"{path}/{i}")
        elif isinstance(v, np.ndarray):
            a = _plain_array(v) if plain else v
            out[path] = (f"ndarray {a.dtype.name} {a.shape} "
                         f"{hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]}")
        elif isinstance(v, np.generic):
            a = _plain_array(np.asarray(v)) if plain else np.asarray(v)
            out[path] = f"scalar {a.dtype.name} {a.tobytes().hex()}"
        elif isinstance(v, float):
            out[path] = f"float {struct.pack('<d', v).hex()}"
        elif isinstance(v, int) and not isinstance(v, bool):
            out[path] = f"int {v:x}"  # hex: no 4,300-digit limit
        else:
            text = ascii(v)
            out[path] = f"{type(v).__name__} {text if len(text) < 80 else _digest(text)}"

    walk(value, "")
    return out


def _key_text(k: Any) -> str:
    return f"{k:x}" if isinstance(k, int) and not isinstance(k, bool) else ascii(k)


def fingerprint_diff(got: Dict[str, str], want: Dict[str, str], limit: int = 3,
                     other: str = "saved") -> str:
    """The first differences between two fingerprints, for a failure message; ``other``
    names where ``want`` comes from."""
    lines = []
    for path in list(want) + [p for p in got if p not in want]:
        if got.get(path) != want.get(path):
            lines.append(f"{path or '<root>'}: got {got.get(path, 'nothing')}, "
                         f"{other} {want.get(path, 'nothing')}")
    more = f" (+{len(lines) - limit} more)" if len(lines) > limit else ""
    return "; ".join(lines[:limit]) + more


def manifest_digest(manifest) -> str:
    """One hash of everything a :class:`uckpt.format.Manifest` holds (whatever version it
    was read from: its arrays' chunks as tuples of their fields)."""
    arrays = {p: [a.dtype, list(a.shape), a.root, [dataclasses.astuple(c) for c in a.chunks]]
              for p, a in manifest.arrays.items()}
    held = {"format_version": manifest.format_version, "world_size": manifest.world_size,
            "step": manifest.step, "metadata": manifest.metadata, "generator": manifest.generator,
            "created": manifest.created, "tree": manifest.tree, "bases": manifest.bases,
            "files": {f.name: [f.rank, f.size] for f in manifest.files.values()},
            "merkle_root": manifest.merkle_root, "checksum": manifest.checksum,
            "parts": [dataclasses.astuple(e) for e in manifest.parts], "arrays": arrays}
    return _digest(ascii(sorted(fingerprint(held).items())))


# --- writing manifests --------------------------------------------------------------------------
class Raw(str):
    """Text written into the JSON as it is."""


class Dup(dict):
    """An object whose first key :func:`dumps` writes twice (with ``dup_value``)."""

    dup_value: Any = None


def dumps(v: Any) -> str:
    """Compact JSON text of ``v``, with :class:`Raw` and :class:`Dup` honoured; strings are
    escaped to ASCII (a lone surrogate becomes ``\\udXXX``)."""
    if isinstance(v, Raw):
        return str(v)
    if isinstance(v, dict):
        items = [f"{json.dumps(k)}:{dumps(x)}" for k, x in v.items()]
        if isinstance(v, Dup) and v:
            items.append(f"{json.dumps(next(iter(v)))}:{dumps(v.dup_value)}")
        return "{" + ",".join(items) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(dumps(x) for x in v) + "]"
    return json.dumps(v, allow_nan=True)


#: from format version 2 on (docs/format.md, section 3.4): the file ends with these 39 bytes, the
#: digits being the CRC-32C of every byte before the value's opening quote
CHECKSUM_KEY = b'"manifest_checksum":'
_SEAL_TAIL = re.compile(rb'"manifest_checksum":"crc32c:[0-9a-f]{8}"\}\n')


def manifest_doc(data: bytes, directory: Optional[Path] = None) -> Dict[str, Any]:
    """The JSON document of a manifest file, less its checksum member (``directory``: the
    checkpoint's, where a format-1.0 root's parts are read from)."""
    doc = listed(json.loads(data), directory)  # chunk lists, so that chunks can be edited
    doc.pop("manifest_checksum", None)
    return doc


def is_sealed(data: bytes) -> bool:
    """Whether a manifest file ends in the checksum member, with the right CRC-32C."""
    return (_SEAL_TAIL.fullmatch(data[-39:]) is not None
            and data[-11:-3] == b"%08x" % crc32c.crc32c(data[:-19]))


def seal_manifest(text: bytes, like: bytes) -> bytes:
    """Manifest bytes for the JSON object ``text`` as docs/format.md (3.4) says a writer
    makes them if ``like`` (an intact manifest) has a checksum, else ``text`` itself:
    drop the closing brace, append ``,"manifest_checksum":``, the CRC-32C of all that
    as ``"crc32c:XXXXXXXX"``, the brace and a line feed."""
    if not is_sealed(like):
        return text
    covered = text.rstrip()[:-1] + b"," + CHECKSUM_KEY
    return covered + b'"crc32c:%08x"}\n' % crc32c.crc32c(covered)


def stale_seal(text: bytes, like: bytes) -> bytes:
    """``text`` ending in the checksum member of ``like`` as it was (an edit nobody
    re-sealed); ``text`` itself when ``like`` has no checksum."""
    if not is_sealed(like):
        return text
    return text.rstrip()[:-1] + b"," + like[-39:]


# --- the worker (runs in its own process) -------------------------------------------------------
class OpTimeout(BaseException):
    """Raised by the alarm in the worker; a BaseException so that no ``except Exception``
    of the code under test swallows it."""


def _on_alarm(signum, frame):
    raise OpTimeout(f"no answer within {OP_SECONDS} s")


def _proc_status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident size (Linux >= 4.0)


def _template(value: Any) -> Any:
    """A state of the same structure as a loaded tree: arrays of the same dtype and shape
    filled with 0xA5 bytes, plain values replaced by other values of their type."""
    if isinstance(value, dict):
        return {k: _template(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        a = np.empty_like(value)
        a.reshape(-1).view(np.uint8)[...] = 0xA5
        return a
    placeholders = {bool: lambda v: not v, int: lambda v: -12345, float: lambda v: -1.5,
                    str: lambda v: "placeholder", bytes: lambda v: b"placeholder",
                    list: lambda v: [], tuple: lambda v: ()}
    if type(value) in placeholders:
        return placeholders[type(value)](value)
    if isinstance(value, np.generic):
        return type(value)(0)
    return value


def _where(exc: BaseException) -> str:
    """Where an exception came from: the innermost frame in uckpt (and the raising one)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "?"

    def show(f):
        name = f.filename
        for marker in ("/src/", "/site-packages/", "/lib/python"):
            if marker in name:
                name = name.split(marker, 1)[1]
                break
        return f"{name}:{f.lineno} in {f.name}"

    ours = [f for f in frames if "/uckpt/" in f.filename]
    text = show(ours[-1]) if ours else show(frames[-1])
    if ours and ours[-1] is not frames[-1]:
        text += f" (raised in {show(frames[-1])})"
    return text


class _Server:
    def __init__(self) -> None:
        import uckpt  # before any measurement

        self.uckpt = uckpt
        self.pristine: Dict[str, Any] = {}

    def state(self, req) -> Any:
        key = req["pristine"]
        if key not in self.pristine:
            self.pristine[key] = self.uckpt.load(key)
        tree = self.pristine[key]
        return _template({k: v for k, v in tree.items() if k not in req["skip"]})

    # operations: each returns a JSON-able result
    def op_load(self, req, state):
        tree = self.uckpt.load(req["dir"])
        return {"fp": fingerprint(tree), "plain": fingerprint(tree, plain=True)}

    def op_restore(self, req, state):
        self.uckpt.load(req["dir"], state, strict=not req["skip"])
        return {"fp": fingerprint(state)}

    def op_verify(self, req, state):
        return {"manifest": manifest_digest(self.uckpt.verify(req["dir"]))}

    def op_manifest(self, req, state):
        return {"manifest": manifest_digest(self.uckpt.manifest(req["dir"]))}

    def op_cli_verify(self, req, state):
        return _cli(["verify", req["dir"]])

    def op_inspect(self, req, state):
        return _cli(["inspect", req["dir"]])

    def op_inspect_json(self, req, state):
        return _cli(["inspect", "--json", req["dir"]])

    def op_verify_all(self, req, state):
        return _cli(["verify", "--all", req["root"]])

    def op_ls(self, req, state):
        return _cli(["ls", "--json", req["root"]])

    def op_manager(self, req, state):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the fallback warns, by design
            with self.uckpt.CheckpointManager(req["root"]) as m:
                step = m.restore(state, strict=not req["skip"])
        return {"step": step, "fp": fingerprint(state)}

    def op_doc_reader(self, req, state):
        """The NumPy reader of docs/format.md (format 1.0) or docs/format-legacy.md (an
        integer format version), whichever the checkpoint needs (with a fast CRC-32C)."""
        from spec_doc import reader_for  # tests/ is on sys.path (see __main__)

        reader = reader_for(req["dir"])
        reader["crc32c"] = crc32c.crc32c
        m, arrays = reader["read_checkpoint"](req["dir"])
        return {"plain": fingerprint(reader["decode"](m["tree"], arrays))}

    def op_selftest(self, req, state):
        """Misbehaviours the oracle must catch, to test the harness itself."""
        what = req["what"]
        if what == "hang":
            os.mkfifo(req["dir"] + "/fifo")
            with open(req["dir"] + "/fifo", "rb") as f:  # blocks: nobody writes
                f.read()
        if what == "allocate":
            a = np.ones(3 * req["declared"] + RSS_SLACK, dtype=np.uint8)  # touched
            return {"fp": fingerprint(int(a[-1]))}
        if what == "raise":
            raise IndexError("an error outside the UckptError hierarchy")
        if what == "crash":
            os._exit(3)
        return {}

    def handle(self, req) -> Dict[str, Any]:
        fn = getattr(self, "op_" + req["op"])
        try:
            state = self.state(req) if req["op"] in ("restore", "manager") else None
        except Exception as e:  # noqa: BLE001 - the intact source does not load
            return {"op": req["op"], "status": "error", "type": type(e).__name__, "uckpt": False,
                    "message": "no state to restore into: " + _text(e)[:500], "where": _where(e),
                    "peak": 0}
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = _proc_status("VmSize") + 2 * req["declared"] + AS_SLACK
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
        _reset_peak()
        before = _proc_status("VmRSS")
        reply: Dict[str, Any] = {"op": req["op"]}
        try:
            signal.setitimer(signal.ITIMER_REAL, req.get("seconds", OP_SECONDS))
            try:
                reply.update(status="ok", result=fn(req, state))
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except OpTimeout:
            reply.update(status="hang")
        except BaseException as e:  # noqa: B902 - every outcome is reported
            reply.update(status="error", type=type(e).__name__,
                         uckpt=isinstance(e, self.uckpt.errors.UckptError),
                         message=_text(e)[:600], where=_where(e))
        finally:
            resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
        reply["peak"] = max(0, _proc_status("VmHWM") - before)
        reply["accepts"] = self.accepts(req["dir"]) if req["op"] in LOAD_OPS else 0
        return reply

    def accepts(self, directory: str) -> int:
        """The bytes of arrays the manifest at ``directory`` declares (0 if it does not
        parse): the most a load may allocate for them."""
        try:
            return self.uckpt.manifest(directory).nbytes
        except Exception:  # noqa: BLE001 - the operation itself reported it
            return 0


def _text(e: BaseException) -> str:
    try:
        return str(e)
    except Exception:  # noqa: BLE001 - a message that cannot be made is reported as such
        return f"<{type(e).__name__}: message cannot be formatted>"


def _cli(argv: List[str]) -> Dict[str, Any]:
    """Run ``uckpt ARGV`` in this process, its output going to strict UTF-8 streams (as
    to a pipe or a terminal: a string that is not valid Unicode cannot be written)."""
    from uckpt.cli.main import main

    streams = [io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict",
                                write_through=True) for _ in range(2)]
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = streams
    try:
        rc = main(argv)
    finally:
        sys.stdout, sys.stderr = saved
    out, err = (s.buffer.getvalue().decode("utf-8", "replace") for s in streams)
    if len(err) > 2000:
        err = err[:1000] + " ... " + err[-1000:]
    return {"rc": rc, "out": out[:20000], "err": err}


def serve(warm_root: str) -> None:
    """Answer one JSON request per line of stdin with one JSON line; after a hang (a
    thread may still be stuck) answer and exit."""
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever the code under test prints goes to stderr
    signal.signal(signal.SIGALRM, _on_alarm)
    server = _Server()
    warm = os.path.join(warm_root, "step_00000002")
    for op in OPS:  # imports, thread start-up, first-use caches: before any measurement
        req = {"op": op, "dir": warm, "root": warm_root, "pristine": warm, "skip": [],
               "declared": 0, "seconds": 60.0}
        reply = server.handle(req)
        if reply["status"] != "ok":
            replies.write(json.dumps({"status": "warm-up failed", "reply": reply}) + "\n")
            replies.flush()
            return
    replies.write(json.dumps({"status": "ready"}) + "\n")
    replies.flush()
    for line in sys.stdin:
        reply = server.handle(json.loads(line))
        replies.write(json.dumps(reply) + "\n")
        replies.flush()
        if reply["status"] == "hang":
            return


# --- driving the worker from the test process ---------------------------------------------------
class Worker:
    """One worker process, restarted after a hang or a crash."""

    def __init__(self, warm_root: Path, log: Path) -> None:
        self.warm_root, self.log = warm_root, log
        self.proc: Optional[subprocess.Popen] = None

    def _start(self) -> None:
        env = dict(os.environ, MALLOC_ARENA_MAX="2", PYTHONFAULTHANDLER="1")
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "serve", str(self.warm_root)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env)
        ready = self._read(120.0)
        if ready is None or ready.get("status") != "ready":
            self.close()
            raise RuntimeError(f"the fuzz worker did not start: {ready} (log: {self.log})")

    def _read(self, timeout: float) -> Optional[Dict[str, Any]]:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return None
        line = self.proc.stdout.readline()
        return json.loads(line) if line else {"status": "crashed"}

    def call(self, req: Dict[str, Any]) -> Dict[str, Any]:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        self.proc.stdin.write((json.dumps(req) + "\n").encode())
        self.proc.stdin.flush()
        reply = self._read(KILL_SECONDS)
        if reply is None:
            self.close()
            return {"op": req["op"], "status": "killed", "peak": 0}
        if reply["status"] == "crashed":
            rc = self.proc.wait()
            self.proc = None
            return {"op": req["op"], "status": "crashed", "rc": rc, "peak": 0,
                    "log": self.log.read_text(errors="replace")[-400:]}
        if reply["status"] == "hang":
            self.close()  # it exits by itself; a thread of it may be stuck
        return reply

    def close(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            for stream in (self.proc.stdin, self.proc.stdout):
                stream.close()
            self.proc = None


# --- cases and the oracle -----------------------------------------------------------------------
@dataclass
class Source:
    """An intact checkpoint that cases are made from."""

    name: str
    path: Path  # the intact copy, never changed
    manifest: bytes  # its manifest file
    doc: Dict[str, Any]  # the manifest's JSON (grids and table listed as chunks)
    sealed: bool  # its manifest is (or, written by this uckpt, must be) integrity-checked
    skip: List[str]  # top-level keys in-place restores leave out (framework objects)
    declared: int  # bytes of its data files
    expected: Dict[str, Any] = field(default_factory=dict)  # op -> result on an intact copy
    #: the checkpoint it has as its base (``bases``), named ``step_00000001`` there: the
    #: intact step 1 of its cases, instead of a copy of itself
    base: Optional[Path] = None
    #: what the manager restores when it falls back to that base (the fingerprint)
    fallback: Optional[Dict[str, str]] = None

    @property
    def raw(self) -> Dict[str, Any]:
        """The manifest's JSON as written (a version-6 table and grids kept), less its
        checksum member: a fresh copy to edit."""
        doc = json.loads(self.manifest)
        doc.pop("manifest_checksum", None)
        return doc


@dataclass
class Case:
    """A mutated copy of a source and what each operation may do with it.

    Verdicts (``data`` for the operations that read data, ``manifest`` for those that
    read only the manifest): "ok": must succeed with exactly the saved values; "fail":
    must raise a UckptError; "either": one of the two; "weak": the manifest was
    changed and re-sealed (or has no integrity check): a UckptError, or a success
    that agrees with the reader of docs/format.md and with the other operations."""

    source: Source
    desc: str
    data: str
    manifest: str
    names: Optional[str] = None  # an error must name this entry of the directory
    #: the verdict for in-place restores (which leave ``source.skip`` out), if another
    partial: Optional[str] = None
    #: op -> verdict, where it is neither of the above
    overrides: Dict[str, str] = field(default_factory=dict)

    def verdict(self, op: str) -> str:
        if op in self.overrides:
            return self.overrides[op]
        if op in MANIFEST_OPS:
            return self.manifest
        if op in ("restore", "manager") and self.partial is not None:
            return self.partial
        return self.data


def request(case: Case, op: str, target: Path, root: Path) -> Dict[str, Any]:
    return {"op": op, "dir": str(target), "root": str(root), "pristine": str(case.source.path),
            "skip": case.source.skip, "declared": case.source.declared}


def run_case(worker: Worker, case: Case, mutate: Callable[[Path], None], workdir: Path,
             ops=OPS) -> List[str]:
    """Copy the source to ``workdir/root/step_00000001`` (intact) and ``step_00000002``,
    ``mutate`` the second, run ``ops`` on it (``manager``: restore from the root) and
    return the oracle's complaints."""
    root = workdir / "root"
    target = root / "step_00000002"
    try:
        shutil.copytree(case.source.base or case.source.path, root / "step_00000001")
        shutil.copytree(case.source.path, target)
        mutate(target)
        replies = {op: worker.call(request(case, op, target, root)) for op in ops}
        if case.data == "weak" and replies.get("load", {}).get("status") == "ok":
            replies["doc_reader"] = worker.call(request(case, "doc_reader", target, root))
        return [f"{case.source.name}: {case.desc}: {op}: {problem}"
                for op in ops for problem in judge(case, op, replies)]
    finally:
        force_remove(workdir)


def establish(worker: Worker, source: Source, workdir: Path) -> None:
    """Run every operation on an intact copy; they must all succeed, consistently."""
    case = Case(source, "intact copy", "ok", "ok")
    root = workdir / "root"
    try:
        shutil.copytree(source.base or source.path, root / "step_00000001")
        shutil.copytree(source.path, root / "step_00000002")
        replies = {op: worker.call(request(case, op, root / "step_00000002", root)) for op in OPS}
        if source.base is not None:
            fallback = worker.call(request(case, "restore", root / "step_00000001", root))
            assert fallback["status"] == "ok", (source.name, fallback)
            source.fallback = fallback["result"]["fp"]
    finally:
        force_remove(workdir)
    bad = {op: r for op, r in replies.items() if r["status"] != "ok"}
    assert not bad, f"{source.name}: operations fail on an intact copy: {bad}"
    source.expected = {op: r["result"] for op, r in replies.items()}
    load, restore, manager = (source.expected[op] for op in ("load", "restore", "manager"))
    assert not _inconsistent(restore["fp"], load["fp"], source.skip), source.name
    assert manager["step"] == 2 and manager["fp"] == restore["fp"], (source.name, manager)
    assert source.expected["verify"] == source.expected["manifest"], source.name
    problems = [p for op in OPS for p in judge(case, op, replies)]
    assert not problems, (source.name, problems)


def _inconsistent(restored: Dict[str, str], loaded: Dict[str, str], skip) -> Dict[str, str]:
    """Entries of an in-place restore that differ from a load of the same checkpoint (the
    root entry lists the keys, fewer when some were skipped)."""
    return {p: v for p, v in restored.items() if (p or not skip) and loaded.get(p) != v}


def _said(r: Dict[str, Any]) -> str:
    first = r["message"].strip().splitlines()[0] if r["message"].strip() else ""
    return f"{r['type']}: {first[:200]} [at {r['where']}]"


def judge(case: Case, op: str, replies: Dict[str, Dict[str, Any]]) -> List[str]:
    """What is wrong with the outcome of ``op`` (an empty list when nothing is)."""
    r = replies[op]
    if r["status"] == "hang":
        return [f"hangs (no answer within {OP_SECONDS:g} s; the alarm broke it)"]
    if r["status"] == "killed":
        return [f"hangs (no answer within {KILL_SECONDS:g} s even to the alarm; worker killed)"]
    if r["status"] == "crashed":
        return [f"the worker process died (exit {r['rc']}): {r['log']}"]
    out = []
    accepts = r.get("accepts", 0) if op in LOAD_OPS else 0
    if r["peak"] > 2 * accepts + RSS_SLACK:
        out.append(f"peak memory +{r['peak'] >> 20} MiB, above the bound of "
                   + (f"2 x {accepts} declared bytes + " if op in LOAD_OPS else "")
                   + f"{RSS_SLACK >> 20} MiB")
    verdict = case.verdict(op)
    if op == "manager":
        return out + _judge_manager(case, r, replies)
    if r["status"] == "error":
        return out + _judge_error(case, verdict, r)
    if op == "ls":
        return out + _judge_ls(case, r["result"])
    if op in CLI_OPS:
        return out + _judge_cli(case, verdict, r["result"])
    return out + _judge_result(case, op, verdict, r["result"], replies)


def _judge_error(case: Case, verdict: str, r) -> List[str]:
    if not r["uckpt"]:
        return [f"raised {_said(r)}, not a UckptError"]
    if verdict == "ok":
        return [f"false alarm on an intact checkpoint: {_said(r)}"]
    if case.names and case.names not in r["message"]:
        return [f"the error does not name {case.names!r}: {_said(r)}"]
    return []


def _judge_cli(case: Case, verdict: str, res) -> List[str]:
    rc, err = res["rc"], res["err"]
    if "Traceback" in err:
        return [f"prints a traceback: {err[-300:]!r}"]
    if rc == 0:
        return [f"exits 0 on a damaged checkpoint: {res['out'][:200]!r}"] \
            if verdict == "fail" else []
    if rc != 1 or "uckpt: error:" not in err:
        return [f"exit status {rc} with stderr {err[-300:]!r}"]
    if verdict == "ok":
        return [f"false alarm on an intact checkpoint: {err.strip()[:300]!r}"]
    if case.names and case.names not in err:
        return [f"the error does not name {case.names!r}: {err.strip()[:300]!r}"]
    return []


def _judge_ls(case: Case, res) -> List[str]:
    """``uckpt ls`` lists the intact step 1 as committed, a step 2 whose manifest is damaged
    as damaged (or not at all), an intact step 2 as committed."""
    if "Traceback" in res["err"] or res["rc"] != 0:
        return [f"exit status {res['rc']}: {res['err'].strip()[-300:]!r}"]
    try:
        listed = {e["name"]: e["status"] for e in json.loads(res["out"])["checkpoints"]}
    except (ValueError, KeyError, TypeError) as e:
        return [f"prints no JSON list of checkpoints ({e}): {res['out'][:200]!r}"]
    out = []
    if listed.get("step_00000001") != "committed":
        out.append(f"lists the intact step_00000001 as {listed.get('step_00000001')!r}")
    second = listed.get("step_00000002")
    if case.manifest == "fail" and second not in ("damaged", None):
        out.append(f"lists step_00000002, whose manifest is damaged, as {second!r}")
    if case.manifest == case.data == "ok" and second != "committed":
        out.append(f"lists the intact step_00000002 as {second!r}")
    return out


def _judge_result(case: Case, op: str, verdict: str, res, replies) -> List[str]:
    key = "fp" if "fp" in res else "manifest"
    want = case.source.expected[op][key]
    if verdict == "fail":
        same = res[key] == want
        how = ("values as saved: the change went unnoticed" if same else
               "other values than saved (silent corruption): " +
               (fingerprint_diff(res[key], want) if key == "fp" else "manifest differs"))
        return [f"succeeded on a damaged checkpoint, with {how}"]
    if verdict in ("ok", "either"):
        if res[key] != want:
            diff = fingerprint_diff(res[key], want) if key == "fp" else "manifest differs"
            return [f"succeeded with other values than saved (silent corruption): {diff}"]
        return []
    load = replies.get("load", {})  # "weak": consistent with the other readers
    if op == "load":
        doc = replies.get("doc_reader")
        if doc and doc["status"] == "ok" and doc["result"]["plain"] != res["plain"]:
            return ["disagrees with the reader of docs/format.md: " + fingerprint_diff(
                res["plain"], doc["result"]["plain"], other="that reader gives")]
    if op == "restore" and load.get("status") == "ok":
        if _inconsistent(res["fp"], load["result"]["fp"], case.source.skip):
            return ["restores other values than load returns: " + fingerprint_diff(
                res["fp"], load["result"]["fp"], other="load gives")]
    return []


def _judge_manager(case: Case, r, replies) -> List[str]:
    weak = "weak" in (case.data, case.manifest)
    if r["status"] == "error":
        if not r["uckpt"]:
            return [f"raised {_said(r)}, not a UckptError"]
        return [] if weak else [f"did not fall back to the intact step 1: raised {_said(r)}"]
    step, got = r["result"]["step"], r["result"]["fp"]
    want = case.source.expected["restore"]["fp"]
    if step not in (1, 2):
        return [f"restored {step!r}, not step 1 or 2"]
    if step == 1 and case.source.fallback is not None:
        want = case.source.fallback
    if step == 1 or not weak:
        if step == 2 and "fail" in (case.verdict("manager"), case.manifest):
            return ["restored the damaged step 2 instead of falling back to step 1"
                    + ("" if got == want else ": " + fingerprint_diff(got, want))]
        if got != want:
            return [f"restored step {step} with other values than saved: "
                    + fingerprint_diff(got, want)]
        return []
    rest = replies.get("restore", {})
    if rest.get("status") == "ok" and rest["result"]["fp"] != got:
        return ["restored step 2 with other values than an in-place restore of it gives: "
                + fingerprint_diff(got, rest["result"]["fp"], other="that restore gives")]
    return []


def force_remove(path: Path) -> None:
    """Remove a case's directory whatever was done to it (modes, FIFOs, symlinks)."""
    if not os.path.lexists(path):
        return
    if os.path.isdir(path) and not os.path.islink(path):
        os.chmod(path, 0o700)
        with os.scandir(path) as it:
            for e in it:
                if e.is_dir(follow_symlinks=False):
                    force_remove(Path(e.path))
                else:
                    os.unlink(e.path)
        os.rmdir(path)
    else:
        os.unlink(path)


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        sys.path.insert(0, str(HERE))
        serve(sys.argv[2])
    else:
        sys.exit("usage: fuzz_common.py serve WARM_ROOT")
