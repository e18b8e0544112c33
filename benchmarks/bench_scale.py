"""Coordination cost against the number of ranks: threads stand in for ranks.

The state of issue 27: ``--tensors`` (2,000) arrays sharded FSDP-style (rank r holds
row block r of each, a :class:`uckpt.Shard` of ``--rows`` rows) plus ``--replicated``
(100) small arrays every rank holds whole. Arrays are tiny, so I/O is negligible and
what is measured is coordination: planning, the exchanges, the manifest.

Per rank count, in one process (``uckpt.testing.ThreadWorld``: every rank runs the real
collective code on its own thread; the exchanges are JSON-encoded as over MPI), on a
``memory://`` store:

1. a :class:`uckpt.CheckpointManager` over the world saves step 1 (first save) and
   step 2 (a later save, same structure, new values);
2. every rank loads step 2 into its own row blocks (``uckpt.load(..., comm=)``), which
   are then checked;
3. one thread opens step 2 lazily (``uckpt.open``, or where there is none the lazy
   reader of ``uckpt convert``/``inspect``, ``uckpt.conversion.api.open_checkpoint``).

Measured (see benchmarks/README.md, "bench_scale.py"): bytes each rank receives in the
exchanges of each save and load; CPU seconds of the calls in :data:`PROBES` (wrappers
set up here, around uckpt's own functions) and of each rank's whole save and load;
the checkpoint's root manifest, part files and data files; the manifest bytes each
rank reads at load. Times are *thread CPU seconds* (``time.thread_time``): the threads
share one interpreter lock, so wall time is the sum over all ranks, not one rank's.

    .venv/bin/python benchmarks/bench_scale.py --label before               # 1,16,64
    .venv/bin/python benchmarks/bench_scale.py --ranks 1,4 --repeat 1 --label smoke
    .venv/bin/python benchmarks/bench_scale.py --plot before after          # compare runs

Results: ``benchmarks/results/scale_<label>.{md,json}`` and, with ``--plot``,
``scale.{md,png}`` (each label against the rank count, log-log, with linear
extrapolation to ``--extrapolate`` ranks).
"""
from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import statistics
import sys
import threading
import time
import traceback
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402

REPO = C.BENCH_DIR.parent
if not any(Path(p).resolve() == (REPO / "src").resolve() for p in sys.path if p):
    try:
        import uckpt  # noqa: F401  (the tree under test, from PYTHONPATH)
    except ImportError:
        sys.path[:0] = [str(REPO / "src"), str(REPO / "adapters")]

import uckpt  # noqa: E402
from uckpt.testing import ThreadWorld  # noqa: E402
from uckpt.testing.threads import ThreadCommunicator  # noqa: E402

#: (module, function, label): uckpt functions timed (thread CPU) on the rank calling
#: them, where the tree under test has them. The attribute is replaced in the module
#: that calls it (a name imported with ``from x import f`` lives in the caller's module).
PROBES: List[Tuple[str, str, str]] = [
    # the module paths since issue 26's layout (saving/, loading/) ...
    ("uckpt.saving.collective", "local_metadata", "local metadata"),
    ("uckpt.saving.collective", "global_plan", "global plan"),
    ("uckpt.saving.root_plan", "global_plan", "global plan"),  # a first save, on rank 0
    ("uckpt.saving.root_plan", "global_columns", "global plan"),  # ... in columns
    ("uckpt.saving.collective", "assemble_manifest", "manifest assemble"),
    ("uckpt.saving.collective", "encode_manifest_files", "manifest encode"),
    ("uckpt.saving.own_parts", "write_own_part", "manifest own part"),
    ("uckpt.saving.own_parts", "head_manifest", "manifest assemble"),
    ("uckpt.saving.own_parts", "encode_root_of", "manifest encode"),
    ("uckpt.loading.reader", "manifest_io.read", "manifest read+parse"),
    ("uckpt.loading.reader", "manifest_io.read_root", "manifest read+parse"),
    ("uckpt.loading.reader", "attach_covering", "manifest read+parse"),
    # ... and before it (the "before" tree of docs/benchmarks.md)
    ("uckpt.collective", "local_metadata", "local metadata"),
    ("uckpt.collective", "global_plan", "global plan"),
    ("uckpt.collective", "assemble_manifest", "manifest assemble"),
    ("uckpt.collective", "encode_manifest_files", "manifest encode"),
    # a manifest split by rank (issue 27): each rank's own part, the root from records
    ("uckpt.own_parts", "write_own_part", "manifest own part"),
    ("uckpt.own_parts", "head_manifest", "manifest assemble"),
    ("uckpt.own_parts", "encode_root_of", "manifest encode"),
    ("uckpt.reader", "manifest_io.read", "manifest read+parse"),
    ("uckpt.reader", "manifest_io.read_root", "manifest read+parse"),
    ("uckpt.reader", "attach_covering", "manifest read+parse"),
]

#: the labels summed into "manifest build" (the coordinator's root and, where ranks
#: write their own parts, each rank's part)
BUILD = ("manifest assemble", "manifest encode", "manifest own part")

PHASES = ("save1", "save2", "load")

# ------------------------------------------------------------------------------------
# Who is calling: the rank and phase of the current thread
# ------------------------------------------------------------------------------------

_here = threading.local()


class Ledger:
    """Per phase and rank: CPU seconds by probe label, bytes received by exchange label,
    manifest/data bytes read from the store."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.cpu: Dict[Tuple[str, int], Dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.calls: Dict[Tuple[str, int], Dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.recv: Dict[Tuple[str, int], Dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.sent: Dict[Tuple[str, int], Dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.read: Dict[Tuple[str, int], Dict[str, int]] = defaultdict(lambda: defaultdict(int))

    @staticmethod
    def who() -> Optional[Tuple[str, int]]:
        phase, rank = getattr(_here, "phase", None), getattr(_here, "rank", None)
        return None if phase is None or rank is None else (phase, rank)

    def add(self, table: Dict, label: str, value: float) -> None:
        key = self.who()
        if key is not None:
            with self._lock:
                table[key][label] += value


LEDGER = Ledger()


def _probe(fn: Callable, label: str) -> Callable:
    def timed(*args, **kwargs):
        outer = getattr(_here, "probing", None)
        _here.probing = label
        t0 = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            if outer is None:  # nested probes: the outer one holds the time
                LEDGER.add(LEDGER.cpu, label, time.thread_time() - t0)
                LEDGER.add(LEDGER.calls, label, 1)
            _here.probing = outer
    timed.__wrapped__ = fn  # type: ignore[attr-defined]
    return timed


def install_probes() -> List[str]:
    """Wrap every function of :data:`PROBES` the tree under test has; returns their names
    (the others are left out of the report's list)."""
    found = []
    for module, dotted, label in PROBES:
        try:
            owner = importlib.import_module(module)
            *path, name = dotted.split(".")
            for part in path:
                owner = getattr(owner, part)
            fn = getattr(owner, name)
        except (ImportError, AttributeError):
            continue
        if not hasattr(fn, "__wrapped__") or getattr(fn, "__name__", "") != "timed":
            setattr(owner, name, _probe(fn, label))
        found.append(f"{module}.{dotted}")
    return found


def install_read_counter() -> None:
    """Count the bytes read from the memory store, by kind: the manifest (the root and
    its parts: names starting with ``manifest``) and data files."""
    from uckpt.storage.blob.memory import MemoryStore

    original = MemoryStore.read_into
    if getattr(original, "__name__", "") == "counted":
        return

    def counted(self, key, offset, buf):
        n = original(self, key, offset, buf)
        kind = "manifest" if key.rpartition("/")[2].startswith("manifest") else "data"
        LEDGER.add(LEDGER.read, kind, n)
        LEDGER.add(LEDGER.read, kind + " reads", 1)
        return n

    MemoryStore.read_into = counted  # type: ignore[method-assign]


class CountingWorld(ThreadWorld):
    """A :class:`ThreadWorld` that counts what each rank sends and receives, labelled by
    the step of the save or load (``(planning)``, ``(writing)``, ``(commit)``: the
    ``what`` of :meth:`Communicator.gather_outcomes`) or else by the collective."""

    def exchange(self, group, call, rank, operation, payload):
        got = super().exchange(group, call, rank, operation, payload)
        label = getattr(_here, "step", None) or operation
        if operation.startswith("broadcast"):
            root = int(operation.split("=")[1].rstrip(")"))
            received = len(got[root])
        elif operation.startswith("scatter("):  # each rank its own piece (the root's
            # payload: the pieces' ends, a newline, the pieces: uckpt.testing.threads)
            data = got[int(operation.split("=")[1].rstrip(")"))]
            ends = [0] + json.loads(data[:data.index(b"\n")])
            received = ends[rank + 1] - ends[rank]
        elif operation.startswith("gather("):  # only the root receives
            root = int(operation.split("=")[1].rstrip(")"))
            received = sum(len(p) for p in got) if rank == root else 0
        elif operation == "all_reduce_minmax":  # a reduction: the result's size
            received = len(payload)
        elif operation == "barrier":
            received = 0
        else:
            received = sum(len(p) for p in got)
        LEDGER.add(LEDGER.recv, label, received)
        LEDGER.add(LEDGER.recv, "exchanges", 1)
        LEDGER.add(LEDGER.sent, label, len(payload))
        return got

    def communicators(self) -> List["CountingCommunicator"]:
        return [CountingCommunicator(self, r, ()) for r in range(self.size)]


class CountingCommunicator(ThreadCommunicator):
    """Labels the exchanges by the step of :meth:`gather_outcomes` (and its variants)
    that began last: the collectives that follow one (a broadcast of its verdict, the
    plan exchange after a reduction) count towards the same step."""

    def _step(self, what: str) -> None:
        _here.step = what.rpartition("(")[2].rstrip(")") if what.endswith(")") else "gather"

    def gather_outcomes(self, fn, what="operation"):
        self._step(what)
        return super().gather_outcomes(fn, what)

    def gather_outcomes_to(self, fn, root=0, what="operation"):
        self._step(what)
        return super().gather_outcomes_to(fn, root, what)

    def agree_outcomes(self, fn, width, what="operation"):
        self._step(what)
        return super().agree_outcomes(fn, width, what)

    def duplicate(self) -> "CountingCommunicator":
        self.barrier()
        return CountingCommunicator(self.world, self._rank,
                                    self.group + (next(self._duplicates),))


# ------------------------------------------------------------------------------------
# The state
# ------------------------------------------------------------------------------------

def rank_state(rank: int, world: int, args, value: float) -> Dict[str, Any]:
    """Rank ``rank``'s state: row block ``rank`` of each sharded array, the replicated ones
    whole."""
    rows, cols = args.rows, args.cols
    model = {}
    for i in range(args.tensors):
        block = np.full((rows, cols), value + i + rank / world, dtype=np.float32)
        model[f"layers.{i}.weight"] = uckpt.Shard(block, (rows * world, cols), (rows * rank, 0))
    norms = {f"norm.{j}": np.full(args.small, value + j, dtype=np.float32)
             for j in range(args.replicated)}
    return {"model": model, "norms": norms, "step": int(value)}


def rank_target(rank: int, world: int, args) -> Dict[str, Any]:
    rows, cols = args.rows, args.cols
    model = {f"layers.{i}.weight": uckpt.Shard(np.zeros((rows, cols), np.float32),
                                               (rows * world, cols), (rows * rank, 0))
             for i in range(args.tensors)}
    norms = {f"norm.{j}": np.zeros(args.small, np.float32) for j in range(args.replicated)}
    return {"model": model, "norms": norms, "step": 0}


def check_loaded(target: Dict[str, Any], rank: int, world: int, args, value: float) -> None:
    for i in (0, args.tensors - 1):
        got = target["model"][f"layers.{i}.weight"].array
        if not np.all(got == np.float32(value + i + rank / world)):
            raise AssertionError(f"rank {rank}: layers.{i}.weight loaded wrong values")
    for j in (0, args.replicated - 1):
        if args.replicated and not np.all(target["norms"][f"norm.{j}"] == np.float32(value + j)):
            raise AssertionError(f"rank {rank}: norm.{j} loaded wrong values")


# ------------------------------------------------------------------------------------
# One run of one rank count
# ------------------------------------------------------------------------------------

def is_part(name: str) -> bool:
    """A manifest part file (``manifest.part-00000.json``), not the root."""
    return name.startswith("manifest.") and name != "manifest.json"


def lazy_open(path: str):
    """``uckpt.open`` where the tree under test has it, else the lazy reader of
    ``uckpt convert`` / ``uckpt inspect``; returns (what was called, the opened object)."""
    opener = getattr(uckpt, "open", None)
    if opener is not None:
        return "uckpt.open", opener(path)
    from uckpt.conversion.api import open_checkpoint
    return "uckpt.conversion.api.open_checkpoint", open_checkpoint(path, "uckpt")


def run_world(world_size: int, args, tag: str) -> Dict[str, Any]:
    """Save twice and load once on ``world_size`` thread ranks; returns the numbers."""
    global LEDGER
    LEDGER = Ledger()
    root = f"memory://{tag}/run"
    world = CountingWorld(world_size, timeout=args.timeout)
    totals: Dict[Tuple[str, int], Dict[str, float]] = defaultdict(dict)
    errors: List[str] = []
    paths: Dict[str, str] = {}
    t_build = time.perf_counter()
    states = [rank_state(r, world_size, args, 1.0) for r in range(world_size)]
    build_s = time.perf_counter() - t_build

    def body(comm: CountingCommunicator) -> None:
        r = comm.rank
        _here.rank = r
        try:
            with uckpt.CheckpointManager(root, comm=comm) as mgr:
                for phase, step, value in (("save1", 1, 1.0), ("save2", 2, 2.0)):
                    state = states[r] if value == 1.0 else rank_state(r, world_size, args, value)
                    _here.phase, _here.step = phase, None
                    w0, c0 = time.perf_counter(), time.thread_time()
                    mgr.save(step, state)
                    totals[(phase, r)] = {"cpu": time.thread_time() - c0,
                                          "wall": time.perf_counter() - w0}
                    _here.phase = None
                    states[r] = None  # type: ignore[call-overload]
                    del state
                path = str(mgr.path(2))
                if r == 0:
                    paths["step2"] = path
            target = rank_target(r, world_size, args)
            _here.phase, _here.step = "load", None
            w0, c0 = time.perf_counter(), time.thread_time()
            uckpt.load(path, target, comm=comm)
            totals[("load", r)] = {"cpu": time.thread_time() - c0,
                                   "wall": time.perf_counter() - w0}
            _here.phase = None
            check_loaded(target, r, world_size, args, 2.0)
        except BaseException as e:  # noqa: BLE001 - reported with the point
            errors.append(f"rank {r}: {type(e).__name__}: {e}".splitlines()[0][:300])
            if r == 0 or len(errors) == 1:
                errors.append(traceback.format_exc())
        finally:
            _here.phase = _here.rank = _here.step = None

    threads = [threading.Thread(target=body, args=(c,), name=f"rank-{c.rank}", daemon=True)
               for c in world.communicators()]
    gc.collect()
    was = gc.isenabled()
    gc.disable()  # a collection of every rank's garbage would be billed to one rank
    w0 = time.perf_counter()
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        if was:
            gc.enable()
    wall = time.perf_counter() - w0
    states.clear()
    out: Dict[str, Any] = {"ranks": world_size, "wall_s": wall, "build_state_s": build_s,
                           "errors": errors}
    if errors:
        return out

    # the lazy open, once, by rank 0's thread's stand-in (this thread)
    _here.rank, _here.phase = 0, "open"
    c0, w0 = time.thread_time(), time.perf_counter()
    how, opened = lazy_open(paths["step2"])
    out["open_cpu_s"] = time.thread_time() - c0
    out["open_wall_s"] = time.perf_counter() - w0
    out["open_how"] = how
    close = getattr(opened, "close", None)
    if close is not None:
        close()
    _here.rank = _here.phase = None
    out["open_manifest_bytes"] = LEDGER.read.get(("open", 0), {}).get("manifest", 0)

    # the files of step 2
    from uckpt.storage import locate
    store, name = locate(paths["step2"])
    prefix = store.key(name) + "/"
    files = sorted((k[len(prefix):], n) for k, n in store.blob.list(prefix))
    out["files"] = {
        "root_manifest_bytes": sum(n for k, n in files if k == "manifest.json"),
        "part_files": sum(1 for k, _ in files if is_part(k)),
        "part_bytes": sum(n for k, n in files if is_part(k)),
        "data_files": sum(1 for k, _ in files if not k.startswith("manifest")),
        "data_bytes": sum(n for k, n in files if not k.startswith("manifest")),
    }
    store.blob.delete_prefix(store.prefix)  # the root "run/": frees the point's memory

    per_phase: Dict[str, Any] = {}
    for phase in PHASES:
        ranks = range(world_size)
        rec: Dict[str, Any] = {
            "cpu_s": [totals[(phase, r)]["cpu"] for r in ranks],
            "wall_s": [totals[(phase, r)]["wall"] for r in ranks],
            "probes_cpu_s": [dict(LEDGER.cpu.get((phase, r), {})) for r in ranks],
            "probe_calls": [dict(LEDGER.calls.get((phase, r), {})) for r in ranks],
            "received_bytes": [dict(LEDGER.recv.get((phase, r), {})) for r in ranks],
            "sent_bytes": [dict(LEDGER.sent.get((phase, r), {})) for r in ranks],
            "read_bytes": [dict(LEDGER.read.get((phase, r), {})) for r in ranks],
        }
        per_phase[phase] = rec
    out["phases"] = per_phase
    return out


# ------------------------------------------------------------------------------------
# Summaries: one number per metric and rank count
# ------------------------------------------------------------------------------------

def _received(rec: Dict[str, Any], r: int) -> int:
    return sum(v for k, v in rec["received_bytes"][r].items() if k != "exchanges")


def _probe_s(rec: Dict[str, Any], r: int, labels) -> Optional[float]:
    got = rec["probes_cpu_s"][r]
    hit = [got[x] for x in labels if x in got]
    return sum(hit) if hit else None


def _max(values) -> Optional[float]:
    values = [v for v in values if v is not None]
    return max(values) if values else None


#: metric key -> (column title, unit, function of one run's result)
METRICS: Dict[str, Tuple[str, str, Callable[[Dict[str, Any]], Optional[float]]]] = {}


def metric(key: str, title: str, unit: str):
    def register(fn):
        METRICS[key] = (title, unit, fn)
        return fn
    return register


for _phase, _name in (("save1", "first save"), ("save2", "later save")):
    def _bind(phase=_phase, name=_name):
        metric(f"{phase}_recv_rank0", f"{name}: bytes received, rank 0", "B")(
            lambda o: _received(o["phases"][phase], 0))
        metric(f"{phase}_recv_max", f"{name}: bytes received, most by a rank", "B")(
            lambda o: _max(_received(o["phases"][phase], r) for r in range(o["ranks"])))
        metric(f"{phase}_recv_others", f"{name}: bytes received, most by a rank but 0", "B")(
            lambda o: _max(_received(o["phases"][phase], r) for r in range(1, o["ranks"])))
        metric(f"{phase}_plan_recv_max",
               f"{name}: bytes received in the plan step, most by a rank", "B")(
            lambda o: _max(o["phases"][phase]["received_bytes"][r].get("planning", 0)
                           for r in range(o["ranks"])))
        for step in ("writing", "commit"):
            metric(f"{phase}_{step}_recv_max",
                   f"{name}: bytes received in the {step} step, most by a rank", "B")(
                lambda o, step=step: _max(o["phases"][phase]["received_bytes"][r].get(step, 0)
                                          for r in range(o["ranks"])))
            metric(f"{phase}_{step}_recv_others",
                   f"{name}: bytes received in the {step} step, most by a rank but 0", "B")(
                lambda o, step=step: _max(o["phases"][phase]["received_bytes"][r].get(step, 0)
                                          for r in range(1, o["ranks"])))
        metric(f"{phase}_plan_s", f"{name}: global plan CPU s, most by a rank", "s")(
            lambda o: _max(_probe_s(o["phases"][phase], r, ("global plan",))
                           for r in range(o["ranks"])))
        metric(f"{phase}_build_s", f"{name}: manifest build CPU s, most by a rank", "s")(
            lambda o: _max(_probe_s(o["phases"][phase], r, BUILD) for r in range(o["ranks"])))
        metric(f"{phase}_rank0_s", f"{name}: rank 0 (coordinator) CPU s, whole save", "s")(
            lambda o: o["phases"][phase]["cpu_s"][0])
        metric(f"{phase}_cpu_max", f"{name}: CPU s, most by a rank, whole save", "s")(
            lambda o: max(o["phases"][phase]["cpu_s"]))
    _bind()

metric("root_bytes", "root manifest bytes", "B")(lambda o: o["files"]["root_manifest_bytes"])
metric("part_bytes", "part files bytes (all)", "B")(lambda o: o["files"]["part_bytes"])
metric("part_files", "part files", "n")(lambda o: o["files"]["part_files"])
metric("load_meta_read_max", "load: manifest bytes read, most by a rank", "B")(
    lambda o: _max(o["phases"]["load"]["read_bytes"][r].get("manifest", 0)
                   for r in range(o["ranks"])))
metric("load_parse_s", "load: manifest read+parse CPU s, most by a rank", "s")(
    lambda o: _max(_probe_s(o["phases"]["load"], r, ("manifest read+parse",))
                   for r in range(o["ranks"])))
metric("load_cpu_max", "load: CPU s, most by a rank, whole load", "s")(
    lambda o: max(o["phases"]["load"]["cpu_s"]))
metric("load_recv_max", "load: bytes received, most by a rank", "B")(
    lambda o: _max(_received(o["phases"]["load"], r) for r in range(o["ranks"])))
metric("open_s", "lazy open CPU s (one thread)", "s")(lambda o: o.get("open_cpu_s"))
metric("open_meta_read", "lazy open: manifest bytes read", "B")(
    lambda o: o.get("open_manifest_bytes"))

#: the columns of the Markdown table, in order
TABLE = ["save1_plan_recv_max", "save1_recv_max", "save1_plan_s", "save1_build_s", "save1_rank0_s",
         "save2_plan_recv_max", "save2_writing_recv_max", "save2_writing_recv_others",
         "save2_commit_recv_max", "save2_recv_max", "save2_recv_others", "save2_plan_s",
         "save2_rank0_s",
         "root_bytes", "part_bytes", "load_meta_read_max", "load_parse_s", "load_cpu_max",
         "open_s"]


def summarize(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Median over the runs of one rank count, per metric (and every run's value)."""
    good = [r for r in runs if not r.get("errors")]
    out: Dict[str, Any] = {"ranks": runs[0]["ranks"], "runs": len(good),
                           "errors": [e for r in runs for e in r.get("errors", [])]}
    for key, (_title, _unit, fn) in METRICS.items():
        vals = []
        for r in good:
            try:
                v = fn(r)
            except (KeyError, IndexError, TypeError):
                v = None
            if v is not None:
                vals.append(float(v))
        out[key] = statistics.median(vals) if vals else None
        out[key + "_all"] = vals
    return out


def fit_line(xs: List[float], ys: List[float]) -> Optional[Tuple[float, float]]:
    """Least-squares ``y = a + b x`` through the points (None with fewer than two)."""
    pts = [(x, y) for x, y in zip(xs, ys) if y is not None]
    if len(pts) < 2:
        return None
    x = np.array([p[0] for p in pts], float)
    y = np.array([p[1] for p in pts], float)
    b, a = np.polyfit(x, y, 1)
    return float(a), float(b)


def extrapolate(summary: List[Dict[str, Any]], key: str, ranks: int) -> Optional[float]:
    """``key`` at ``ranks`` on the line through the two largest rank counts measured
    (each metric here grows linearly or stays constant with the ranks)."""
    pts = sorted((s["ranks"], s[key]) for s in summary if s.get(key) is not None)
    if not pts:
        return None
    if pts[-1][0] >= ranks:
        return dict(pts).get(ranks)
    if len(pts) < 2:
        return None
    line = fit_line([p[0] for p in pts[-2:]], [p[1] for p in pts[-2:]])
    if line is None:
        return None
    return max(0.0, line[0] + line[1] * ranks)


def fmt(v: Optional[float], unit: str, approx: bool = False) -> str:
    if v is None:
        return "—"
    text = C.fmt_bytes(v) if unit == "B" else (str(int(v)) if unit == "n" else C.fmt_s(v))
    return f"~{text}" if approx else text


def table(summary: List[Dict[str, Any]], extra: List[int]) -> str:
    headers = ["ranks"] + [METRICS[k][0] for k in TABLE]
    rows = [[f"{s['ranks']:,}"] + [fmt(s.get(k), METRICS[k][1]) for k in TABLE] for s in summary]
    measured = {s["ranks"] for s in summary}
    for n in extra:
        if n not in measured:
            rows.append([f"{n:,} (extrapolated)"] +
                        [fmt(extrapolate(summary, k, n), METRICS[k][1], True) for k in TABLE])
    return C.markdown_table(headers, rows)


# ------------------------------------------------------------------------------------
# Main
# ------------------------------------------------------------------------------------

def tree_commit(where: Path) -> Optional[str]:
    """The git commit of the tree under test (``+`` if it has changes), or None."""
    import subprocess

    try:
        head = subprocess.run(["git", "-C", str(where), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(where), "status", "--porcelain", "--", "."],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + ("+" if dirty else "")) or None


def measure(args) -> int:
    probes = install_probes()
    install_read_counter()
    env = C.environment()
    env["uckpt"] = f"{getattr(uckpt, '__version__', '?')} from {Path(uckpt.__file__).parent}"
    env["uckpt_commit"] = tree_commit(Path(uckpt.__file__).parent)
    load0 = os.getloadavg()
    print(f"uckpt from {Path(uckpt.__file__).parent}; probes: {', '.join(probes)}", flush=True)
    summary, raw, skipped = [], [], []
    previous: Optional[Tuple[int, float]] = None  # (ranks, seconds) of the last point
    for n in args.rank_list:
        if previous is not None and args.budget > 0:
            guess = previous[1] * (n / previous[0]) ** 2  # every rank does O(ranks) work
            if guess > args.budget:
                print(f"[{n} ranks] skipped: ~{guess:.0f} s expected (the last point took "
                      f"{previous[1]:.0f} s at {previous[0]} ranks; --budget {args.budget:g})",
                      flush=True)
                skipped.append({"ranks": n, "expected_s": guess})
                continue
        repeat = args.repeat if n <= args.repeat_max_ranks else 1
        runs = []
        for i in range(repeat):
            t0 = time.perf_counter()
            res = run_world(n, args, f"scale-{n}-{i}")
            res["seconds"] = time.perf_counter() - t0
            runs.append(res)
            gc.collect()
            C.malloc_trim()
            if res["errors"]:
                print(f"[{n} ranks] run {i + 1}: FAILED: {res['errors'][0]}", flush=True)
                print(res["errors"][-1], flush=True)
                break
            s1, s2, ld = (res["phases"][p] for p in PHASES)
            print(f"[{n} ranks] run {i + 1}/{repeat}: {res['seconds']:.1f} s; rank 0 CPU: save1 "
                  f"{s1['cpu_s'][0]:.3f} s, save2 {s2['cpu_s'][0]:.3f} s, load "
                  f"{ld['cpu_s'][0]:.3f} s; received by rank 0 in save1 "
                  f"{C.fmt_bytes(_received(s1, 0))}", flush=True)
        raw.append(runs)
        s = summarize(runs)
        summary.append(s)
        previous = (n, max(r["seconds"] for r in runs))
        write_results(summary, raw, skipped, args, env, probes, load0)  # each point kept
        if s["errors"]:
            break
    text = write_results(summary, raw, skipped, args, env, probes, load0)
    print("\n" + text, flush=True)
    print(f"wrote {Path(args.results_dir) / f'scale_{args.label}'}.{{md,json}}", flush=True)
    return 1 if any(s["errors"] for s in summary) else 0


def write_results(summary, raw, skipped, args, env, probes, load0) -> str:
    """Write ``scale_<label>.{md,json}`` with the points measured so far; returns the table."""
    text = report(summary, skipped, args, env, probes, load0)
    rd = Path(args.results_dir)
    rd.mkdir(parents=True, exist_ok=True)
    (rd / f"scale_{args.label}.md").write_text(text)
    C.write_json(rd / f"scale_{args.label}.json", {
        "benchmark": "scale", "label": args.label,
        "state": {"tensors": args.tensors, "rows_per_rank": args.rows, "cols": args.cols,
                  "replicated": args.replicated, "replicated_elements": args.small},
        "ranks": args.rank_list, "repeat": args.repeat, "repeat_max_ranks": args.repeat_max_ranks,
        "budget_s": args.budget, "skipped": skipped, "probes": probes,
        "loadavg_start": list(load0), "loadavg_end": list(os.getloadavg()),
        "environment": env, "summary": summary, "runs": raw,
    })
    return text


def report(summary, skipped, args, env, probes, load0) -> str:
    head = [
        f"# Coordination cost against ranks: {args.label}",
        "",
        f"State per rank: {args.tensors:,} float32 arrays sharded by rows ({args.rows} x "
        f"{args.cols} per rank: global {args.rows} x ranks rows) + {args.replicated} replicated "
        f"arrays of {args.small} float32 + one int. Ranks are threads of one process "
        f"(uckpt.testing.ThreadWorld), store memory://.",
        "Each point: CheckpointManager.save(1), .save(2) (same structure), uckpt.load of step 2 "
        "into every rank's own row blocks (checked), a lazy open of step 2 on one thread. "
        f"Median of {args.repeat} runs up to {args.repeat_max_ranks} ranks, one run above.",
        "Seconds are thread CPU seconds (time.thread_time) of one rank: the threads share one "
        "interpreter lock, so wall time sums all ranks. Bytes received: the JSON payloads of "
        "every exchange the rank took part in (all_gather: every rank's; broadcast: the root's).",
        f"Probed: {', '.join(probes)}.",
        f"Machine: {env.get('cpu_count')} CPUs, {C.fmt_bytes(env.get('mem_total_bytes'))} RAM, "
        f"{env.get('platform')}; Python {env.get('python')}, numpy {env.get('numpy')}; "
        f"uckpt {env.get('uckpt')} (commit {env.get('uckpt_commit')}).",
        f"Run at {env.get('time')}; 1-min load average {load0[0]:.2f} at start, "
        f"{os.getloadavg()[0]:.2f} at end.",
        "",
    ]
    body = table(summary, [n for n in args.extrapolate_list])
    notes = ["", "Rows marked extrapolated: on the line through the two largest rank counts "
             "measured (linear in ranks), not measured."]
    if skipped:
        notes.append("Not measured (expected to exceed --budget): " + ", ".join(
            f"{s['ranks']:,} ranks (~{s['expected_s']:.0f} s)" for s in skipped) + ".")
    errs = [e for s in summary for e in s["errors"][:1]]
    if errs:
        notes += ["", "Errors:", *[f"- {e}" for e in errs]]
    return "\n".join(head) + body + "\n" + "\n".join(notes) + "\n"


# ------------------------------------------------------------------------------------
# Comparison of labelled runs: table and log-log plot
# ------------------------------------------------------------------------------------

#: metric key -> panel title, for the plot
PLOTTED = {
    "save1_plan_s": "global plan CPU s (first save)",
    "save1_build_s": "manifest build CPU s (first save)",
    "save2_rank0_s": "later save: rank 0 CPU s",
    "load_parse_s": "load: manifest read+parse CPU s",
    "save2_recv_max": "later save: bytes received per rank",
    "root_bytes": "root manifest bytes",
    "load_meta_read_max": "load: manifest bytes read per rank",
    "save1_recv_max": "first save: bytes received per rank",
}


#: the columns of the compact comparison (one row per rank count, "A / B" per cell)
COMPACT = {
    "save1_plan_recv_max": "plan step: bytes received per rank",
    "save1_plan_s": "global plan s",
    "save1_build_s": "manifest build s",
    "save2_plan_recv_max": "later save, plan step: bytes received per rank",
    "save2_rank0_s": "later save: rank 0 s",
    "root_bytes": "root manifest",
    "part_bytes": "parts (all)",
    "load_meta_read_max": "load: manifest bytes read per rank",
    "load_parse_s": "load: manifest parse s",
    "open_s": "lazy open s",
}


def value_at(run: Dict[str, Any], key: str, n: int) -> str:
    """``key`` at ``n`` ranks in ``run``: measured, or extrapolated (marked ~)."""
    measured = {s["ranks"]: s for s in run["summary"]}
    unit = METRICS[key][1]
    if n in measured:
        return fmt(measured[n].get(key), unit)
    return fmt(extrapolate(run["summary"], key, n), unit, True)


def compare(args) -> int:
    rd = Path(args.results_dir)
    runs = {label: json.loads((rd / f"scale_{label}.json").read_text()) for label in args.plot}
    counts = sorted({s["ranks"] for r in runs.values() for s in r["summary"]}
                    | set(args.extrapolate_list))
    lines = [f"# Coordination cost against ranks: {' / '.join(args.plot)}", "",
             f"Each cell: {' / '.join(args.plot)}. CPU seconds of one rank (the most of any "
             "rank); ~: extrapolated linearly from the two largest rank counts measured.", "",
             C.markdown_table(["ranks", *COMPACT.values()], [
                 [f"{n:,}"] + [" / ".join(value_at(r, k, n) for r in runs.values())
                               for k in COMPACT] for n in counts]), ""]
    for key in TABLE:
        lines += [f"## {METRICS[key][0]}", "", C.markdown_table(
            ["ranks", *runs], [[f"{n:,}"] + [value_at(r, key, n) for r in runs.values()]
                               for n in counts]), ""]
    (rd / "scale.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    try:
        plot(runs, rd / "scale.png", max(counts))
    except ImportError as e:
        print(f"no plot: {e}")
    print(f"wrote {rd / 'scale'}.{{md,png}}")
    return 0


#: the targets of issue 27 at 4,096 ranks, marked on the plot: metric -> (ranks, value)
TARGETS = {"save2_rank0_s": (4096, 0.5)}


def plot(runs: Dict[str, Dict[str, Any]], path: Path, upto: int) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(PLOTTED)
    cols = 4
    fig, axes = plt.subplots(2, cols, figsize=(4.2 * cols, 7.5))
    for ax, key in zip(axes.flat, keys):
        unit = METRICS[key][1]
        for i, (label, r) in enumerate(runs.items()):
            pts = [(s["ranks"], s.get(key)) for s in r["summary"] if s.get(key)]
            if not pts:
                continue
            color = f"C{i}"
            ax.plot(*zip(*pts), "o-", color=color, label=label)
            last = pts[-1][0]
            if last < upto:  # a + b n is no straight line on log-log axes: sample it
                ext = [(n, extrapolate(r["summary"], key, int(n)))
                       for n in np.geomspace(last, upto, 24)]
                ext = [(n, v) for n, v in ext if v]
                if len(ext) > 1:
                    ax.plot(*zip(*ext), ":", color=color, label=f"{label} (extrapolated)")
        if key in TARGETS:
            n, v = TARGETS[key]
            ax.plot([n], [v], "x", color="red", markersize=9, label="issue 27 target")
            ax.legend(fontsize=7)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(PLOTTED[key], fontsize=9)
        ax.set_xlabel("ranks")
        ax.set_ylabel("bytes" if unit == "B" else "seconds")
        ax.grid(True, which="both", alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle("uckpt coordination cost vs ranks (thread ranks, tiny arrays; "
                 + C.machine_line() + ")", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", default="1,16,64", help="rank counts to measure (default 1,16,64)")
    p.add_argument("--tensors", type=int, default=2000, help="sharded arrays (default 2000)")
    p.add_argument("--rows", type=int, default=2, help="rows of each sharded array per rank (2)")
    p.add_argument("--cols", type=int, default=4, help="columns of each sharded array (4)")
    p.add_argument("--replicated", type=int, default=100, help="replicated arrays (default 100)")
    p.add_argument("--small", type=int, default=16, help="elements of a replicated array (16)")
    p.add_argument("--repeat", type=int, default=3, help="runs per rank count (median; default 3)")
    p.add_argument("--repeat-max-ranks", type=int, default=16,
                   help="rank counts above this run once (default 16)")
    p.add_argument("--budget", type=float, default=300,
                   help="skip a rank count expected to take longer than this many seconds "
                        "(from the last one, as ranks squared; 0: never skip; default 300)")
    p.add_argument("--timeout", type=float, default=3600, help="collective timeout, s (3600)")
    p.add_argument("--extrapolate", default="256,1024,4096",
                   help="rank counts not measured to extrapolate to (default 256,1024,4096)")
    p.add_argument("--label", default="run", help="names the results: scale_<label>.{md,json}")
    p.add_argument("--results-dir", default=str(C.RESULTS_DIR))
    p.add_argument("--plot", nargs="+", metavar="LABEL",
                   help="measure nothing: compare the saved runs of these labels "
                        "(scale.md, scale.png)")
    args = p.parse_args(argv)
    args.rank_list = [int(x) for x in args.ranks.split(",") if x.strip()]
    args.extrapolate_list = [int(x) for x in args.extrapolate.split(",") if x.strip()]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.plot:
        return compare(args)
    return measure(args)


if __name__ == "__main__":
    sys.exit(main())
