"""The levels of issue 28 on 4 ranks as 2 or 4 simulated nodes: save stall and background
time of the memory level (``shm://``), a node-local disk tier and the durable tiers, the
cost of each redundancy scheme against none, restore times (memory level, after a node
loss, durable local disk and S3, same run) and memory per node.

    .venv/bin/python benchmarks/bench_levels.py                          # both sizes, 2 and 4 nodes
    .venv/bin/python benchmarks/bench_levels.py --sizes resnet50 --nodes 2 --repeat 1

For each size and node count, ``mpiexec -n 4`` runs this script as workers; rank r is on
node ``node<r // (4 / nodes)>`` (``UCKPT_NODE``), the memory level is
``shm://<unique>-{node}`` with ``UCKPT_SHM_DIR`` a fresh directory under ``/dev/shm`` and
the node-local disk ``<dir>/local/{node}/<unique>``. The state is a bench_sync state (its
tensors' names, shapes and bytes: parameters, buffers, SGD momentum), built with NumPy and
sharded ZeRO-3 style: every tensor is split by rows over the 4 ranks (``uckpt.Shard``;
0-d tensors are ``uckpt.PerRank``), so each rank reads back only what its node holds.

Redundancy: where a committed manifest declares ``redundancy:scheme`` (the manager writes
it for ``Tier(redundancy=...)``), the scheme's cost is inside the save's background time
and a node loss is rebuilt by ``restore``. Where it does not (a uckpt whose saves do not
write redundancy), the cost is measured as ``uckpt.levels.exchange.protect_across`` over the
job's communicator and the node's share files, run after the save is committed, and a
lost node is rebuilt with ``uckpt.levels.rebuild_across.repair_across`` before ``restore``;
the report says which path each row measured.

Results go to stdout and to ``benchmarks/results/levels.{md,json}`` and
``levels_<state>_<nodes>nodes.png``. See
docs/benchmarks.md for what limits each figure.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402

RANKS = 4
MANIFEST = "manifest.json"
STEP = 1


def tiny_spec() -> C.ModelSpec:
    """A few small tensors, for a smoke run (tests/test_bench_levels.py)."""
    return C.ModelSpec("tiny",
                       (("fc.weight", (256, 64), "float32"), ("fc.bias", (256,), "float32")),
                       (("bn.num_batches_tracked", (), "int64"),))


SIZES = {**C.SPECS, "tiny": tiny_spec}


# --------------------------------------------------------------------------
# The state: a bench_sync state's tensors, sharded by rows over the ranks
# --------------------------------------------------------------------------

def entries(spec: C.ModelSpec):
    """``(path, shape, dtype)`` of every tensor of the state: parameters, their SGD
    momentum buffers (``optimizer/state/<i>/momentum_buffer``) and the buffers."""
    out = [(("model", name), shape, dtype) for name, shape, dtype in spec.params]
    out += [(("optimizer", "state", str(i), "momentum_buffer"), shape, dtype)
            for i, (_, shape, dtype) in enumerate(spec.params)]
    out += [(("model", name), shape, dtype) for name, shape, dtype in spec.buffers]
    return out


def build_state(spec: C.ModelSpec, rank: int, n: int, zero: bool = False):
    """This rank's part of the state: rows ``[r * rows / n, (r + 1) * rows / n)`` of each
    tensor as a ``uckpt.Shard``; a 0-d tensor (or one with fewer rows than ranks) as a
    ``uckpt.PerRank``. ``zero``: the same layout, zeros (a restore target)."""
    import uckpt

    tree: Dict[str, Any] = {}
    for k, (path, shape, dtype) in enumerate(entries(spec)):
        node = tree
        for p in path[:-1]:
            node = node.setdefault(p, {})
        rng = np.random.default_rng([k, rank])
        if len(shape) == 0 or shape[0] < n:
            a = np.zeros(shape, dtype) if zero else rng.integers(0, 1 << 30, shape).astype(dtype)
            node[path[-1]] = uckpt.PerRank(a)
            continue
        lo, hi = rank * shape[0] // n, (rank + 1) * shape[0] // n
        local = (hi - lo, *shape[1:])
        a = np.zeros(local, dtype) if zero else rng.standard_normal(local, dtype=np.float32)
        node[path[-1]] = uckpt.Shard(a.astype(dtype, copy=False), shape,
                                     (lo,) + (0,) * (len(shape) - 1))
    return tree


def leaves(tree, prefix=""):
    for k, v in tree.items():
        if isinstance(v, dict):
            yield from leaves(v, f"{prefix}{k}/")
        else:
            yield f"{prefix}{k}", (v.array if hasattr(v, "array") else v.value)


def state_bytes(tree) -> int:
    return sum(a.nbytes for _, a in leaves(tree))


def same(a, b) -> bool:
    x, y = dict(leaves(a)), dict(leaves(b))
    return x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) and x[k].dtype == y[k].dtype
                                        for k in x)


def zero(tree) -> None:
    for _, a in leaves(tree):
        a[...] = 0


# --------------------------------------------------------------------------
# Worker: one rank under mpiexec
# --------------------------------------------------------------------------

class Rank:
    """This rank's view of the job: communicator, node, the state and a target."""

    def __init__(self, cfg: dict) -> None:
        from mpi4py import MPI  # noqa: F401  (detection: mpi4py imported -> MPI)
        from uckpt.comm import get_communicator
        from uckpt.runtime.nodes import Nodes

        self.cfg = cfg
        self.comm = get_communicator(None, timeout=600)
        self.rank, self.n = self.comm.rank, self.comm.size
        self.node = f"node{self.rank // (self.n // cfg['nodes'])}"
        os.environ["UCKPT_NODE"] = self.node
        self.nodes = Nodes.gather(self.comm, self.node)
        self.leader = self.nodes.leaders[self.nodes.index] == self.rank
        spec = SIZES[cfg["size"]]()
        self.state = build_state(spec, self.rank, self.n)
        self.target = build_state(spec, self.rank, self.n, zero=True)
        self.work = Path(cfg["work"])

    def timed(self, fn) -> float:
        """Seconds of ``fn()`` on this rank, started together (barrier before)."""
        self.comm.barrier()
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    def slowest(self, value: float) -> float:
        return max(self.comm.all_gather(value))


def tier_root(level: str, tag: str, work: Path, s3: Optional[dict]) -> str:
    """The root of a tier: ``shm://`` or a node-local directory (with ``{node}``), or a
    durable one (a shared directory, an S3 prefix)."""
    if level == "memory":
        return f"shm://{tag}-{{node}}"
    if level == "disk":
        return str(work / "local" / "{node}" / tag)
    if level == "durable disk":
        return str(work / "durable" / tag)
    assert s3 is not None
    return f"s3://{s3['bucket']}/{tag}"


def node_bytes(path: Path) -> int:
    """Bytes of every regular file under ``path`` (a node's memory area or directory)."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def share_files(step_dir: Path) -> List[str]:
    """A node's share in its copy of a checkpoint: every file but the manifest (which
    every node holds) and redundancy pieces, in name order."""
    return sorted(p.name for p in step_dir.iterdir()
                  if p.is_file() and p.name != MANIFEST and not p.name.startswith("redundancy-"))


def fsynced_writer(path: Path):
    """A file for a piece that is fsynced when closed (as any file a level commits)."""
    f = open(path, "wb")
    close = f.close

    def close_synced():
        f.flush()
        os.fsync(f.fileno())
        close()
    f.close = close_synced  # type: ignore[method-assign]
    return f


def one_config(R: Rank, rnd: int, level: str, scheme: Optional[str], s3: Optional[dict]) -> dict:
    """Save on one level (with ``scheme``), its redundancy, memory per node; then the
    restore that fits it: from the level itself, or after node 1's loss."""
    import uckpt
    from uckpt.levels.exchange import protect_across
    from uckpt.levels.scheme import parse_redundancy
    from uckpt.levels.share_io import directory_reader

    tag = R.comm.broadcast(f"lv{rnd}-{uuid.uuid4().hex[:8]}" if R.rank == 0 else None)
    root = tier_root(level, tag, R.work, s3)
    opts = (s3 or {}).get("options")
    tier = uckpt.Tier(root, keep=1, redundancy=scheme,
                      storage_options=opts if level == "S3" else None)
    out: Dict[str, Any] = {"level": level, "scheme": scheme or "none"}
    m = uckpt.CheckpointManager(tiers=[tier], comm=R.comm, async_save=True)
    handle: List[Any] = []
    R.comm.barrier()
    t0 = time.perf_counter()
    handle.append(m.save(STEP, R.state))
    t1 = time.perf_counter()
    if hasattr(handle[0], "wait"):
        handle[0].wait()
    t2 = time.perf_counter()
    out["stall"], out["background"] = R.slowest(t1 - t0), R.slowest(t2 - t1)
    local = level in ("memory", "disk")
    step_dir = Path(m.path(STEP)) if local else None
    m.close()
    out["wired"] = None
    records = None
    if scheme is not None:
        manifest = json.loads((step_dir / MANIFEST).read_text())
        wired = R.comm.all_gather("redundancy:scheme" in manifest)
        out["wired"] = all(wired)
        if not out["wired"]:
            reader = directory_reader(step_dir)
            files = share_files(step_dir) if R.leader else ()
            got: List[Any] = []
            dt = R.timed(lambda: got.append(protect_across(
                R.comm, R.nodes.of_rank, parse_redundancy(scheme), files, reader,
                lambda name: fsynced_writer(step_dir / name), step=STEP)))
            records = got[0]
            out["redundancy"] = R.slowest(dt)
    if local:
        node_root = step_dir.parent
        mine = node_bytes(node_root) if R.leader else None
        out["node_bytes"] = [b for b in R.comm.all_gather(mine) if b is not None]
    out["restore"] = restore(R, root, tier, step_dir, scheme, records, level)
    if local and R.leader:
        shutil.rmtree(step_dir.parent, ignore_errors=True)
    elif level == "durable disk" and R.rank == 0:
        shutil.rmtree(root, ignore_errors=True)
    R.comm.barrier()
    return out


def restore(R: Rank, root: str, tier, step_dir: Optional[Path], scheme: Optional[str],
            records, level: str) -> dict:
    """Restore from ``tier`` alone; with a scheme, after node 1 lost its whole area on
    this level (rebuilt by the manager where wired, else by ``repair_across`` first)."""
    import uckpt
    from uckpt.levels.rebuild_across import repair_across
    from uckpt.levels.share_io import directory_reader

    out: Dict[str, Any] = {}
    zero(R.target)
    lost = scheme is not None and R.nodes.index == 1
    if scheme is not None:
        manifest = (step_dir / MANIFEST).read_text("utf-8") if R.rank == 0 else None
        if lost and R.leader:
            shutil.rmtree(step_dir.parent)  # the node's whole memory area / directory
        R.comm.barrier()
    got: List[Any] = []

    def rebuild():
        text = R.comm.broadcast(manifest)  # what a survivor sends the new node
        if lost and R.leader:
            step_dir.mkdir(parents=True)
        repair_across(R.comm, R.nodes.of_rank, records, directory_reader(step_dir),
                      lambda name: fsynced_writer(step_dir / name))
        if lost and R.leader:
            tmp = step_dir / (MANIFEST + ".tmp")
            tmp.write_text(text, "utf-8")
            os.replace(tmp, step_dir / MANIFEST)

    def load():
        with uckpt.CheckpointManager(tiers=[uckpt.Tier(root, keep=1, redundancy=scheme,
                                                       storage_options=tier.storage_options)],
                                     comm=R.comm) as m:
            got.append(m.restore(R.target))

    if scheme is not None and records is not None:
        out["rebuild"] = R.slowest(R.timed(rebuild))
    out["load"] = R.slowest(R.timed(load))
    out["total"] = out["load"] + out.get("rebuild", 0.0)
    ok = got[0] == STEP and same(R.state, R.target)
    if not all(R.comm.all_gather(ok)):
        raise SystemExit(f"{level} {scheme}: restored step {got[0]}, not bit for bit")
    return out


def worker(cfg: dict) -> None:
    R = Rank(cfg)
    s3 = cfg.get("s3")
    levels = [("memory", None), ("disk", None)]
    levels += [(lv, s) for lv in cfg["scheme_levels"] for s in cfg["schemes"]]
    levels += [("durable disk", None)] + ([("S3", None)] if s3 else [])
    rows = []
    for rnd in range(cfg["warmup"] + cfg["repeat"]):  # warm-up: page cache, shm pages, S3
        for level, scheme in levels:
            load = os.getloadavg()[0]
            row = one_config(R, rnd, level, scheme, s3)
            row.update(round=rnd, load1=load)
            if R.rank == 0:
                print(f"  round {rnd} {level:<12} {row['scheme']:<8} stall {row['stall']:.3f} s, "
                      f"background {row['background']:.3f} s, redundancy "
                      f"{row.get('redundancy', 0):.3f} s, restore {row['restore']['total']:.3f} s "
                      f"(load avg {load:.2f})", file=sys.stderr, flush=True)
            if rnd >= cfg["warmup"]:
                rows.append(row)
    if R.rank == 0:
        print("BENCH " + json.dumps({"size": cfg["size"], "nodes": cfg["nodes"], "ranks": R.n,
                                     "state_bytes": R.comm.all_gather(state_bytes(R.state)),
                                     "rows": rows}), flush=True)
    else:
        R.comm.all_gather(state_bytes(R.state))


# --------------------------------------------------------------------------
# Summaries and report
# --------------------------------------------------------------------------

def predicted(scheme: str, nodes: int) -> float:
    """The issue's memory per node against none: partner 2x, xor 1 + 1/(g - 1)."""
    if scheme == "none":
        return 1.0
    if scheme == "partner":
        return 2.0
    from uckpt.levels.scheme import group_of, parse_redundancy
    g = len(group_of(parse_redundancy(scheme), nodes, 0))
    return 1 + 1 / (g - 1)


def summarize(run: dict) -> List[dict]:
    med = statistics.median
    keys = list(dict.fromkeys((r["level"], r["scheme"]) for r in run["rows"]))
    base_mem = {}
    out = []
    for level, scheme in keys:
        rows = [r for r in run["rows"] if (r["level"], r["scheme"]) == (level, scheme)]
        s = {"level": level, "scheme": scheme, "rounds": len(rows),
             "stall": med(r["stall"] for r in rows),
             "background": med(r["background"] for r in rows),
             "redundancy": med(r.get("redundancy", 0.0) for r in rows),
             "wired": rows[0]["wired"],
             "load": med(r["restore"]["load"] for r in rows),
             "rebuild": med(r["restore"].get("rebuild", 0.0) for r in rows),
             "restore": med(r["restore"]["total"] for r in rows),
             "load1": [r["load1"] for r in rows]}
        s["committed"] = s["background"] + s["redundancy"]
        if "node_bytes" in rows[0]:
            s["node_bytes"] = rows[0]["node_bytes"]
            if scheme == "none":
                base_mem[level] = s["node_bytes"]
            if level in base_mem:
                s["memory_ratio"] = max(b / a for a, b in zip(base_mem[level], s["node_bytes"]))
                s["memory_predicted"] = predicted(scheme, run["nodes"])
        out.append(s)
    return out


def how(s: dict) -> str:
    if s["scheme"] == "none":
        return ""
    return "manager (wired)" if s["wired"] else "protect_across / repair_across after the save"


def report(results: List[dict], env: dict, args, loads: List[float]) -> str:
    lines = [
        "# The levels: memory, node-local disk, redundancy across nodes, durable", "",
        f"Command: `.venv/bin/python benchmarks/bench_levels.py --sizes {args.sizes} --nodes "
        f"{args.nodes} --repeat {args.repeat} --warmup {args.warmup} --schemes {args.schemes} "
        f"--scheme-levels {args.scheme_levels}"
        f"{' --no-s3' if args.no_s3 else ''}`; `mpiexec -n {RANKS}` (MPICH) on one machine "
        f"as simulated nodes. {C.machine_line()} Memory level: tmpfs `/dev/shm`; node-local "
        f"and durable disk: {C.filesystem_of(args.dir)}; S3: SeaweedFS on loopback (same "
        f"machine). Median of {args.repeat} timed round(s) after {args.warmup} warm-up "
        "round(s); "
        "every time is "
        "the slowest rank's.", "",
        f"1-minute load average during the run: {min(loads):.2f} to {max(loads):.2f} on "
        f"{os.cpu_count()} CPUs (the benchmark itself accounts for up to {RANKS}).", "",
        "Columns: *stall*: inside `save` (async); *background*: from `save`'s return until "
        "the checkpoint is committed on the level; *redundancy*: the scheme's extra "
        "background time where the manager does not write it (see *path*); *committed*: "
        "background + redundancy; *restore*: a new manager's `restore` from this tier "
        "alone, for a scheme after node 1's whole area on the level is wiped (rebuild + "
        "load); *memory/node*: bytes in the node's memory area or directory (largest node), "
        "and its ratio to the same level without redundancy beside the issue's prediction.", ""]
    headers = ["state", "nodes", "level", "redundancy", "stall s", "background s",
               "redundancy s", "committed s", "committed ÷ none", "restore s", "(rebuild s)",
               "memory/node", "memory ÷ none (predicted)", "path"]
    rows = []
    for res in results:
        base = {s["level"]: s for s in res["summary"] if s["scheme"] == "none"}
        for s in res["summary"]:
            b = base.get(s["level"])
            mem = (f"{s['memory_ratio']:.3f} ({s['memory_predicted']:.3f})"
                   if "memory_ratio" in s else "")
            rows.append([f"{res['size']} ({sum(res['state_bytes']) / C.GB:.3f} GB)",
                         res["nodes"], s["level"], s["scheme"], C.fmt_s(s["stall"]),
                         C.fmt_s(s["background"]),
                         C.fmt_s(s["redundancy"]) if s["scheme"] != "none" and not s["wired"]
                         else "", C.fmt_s(s["committed"]),
                         C.fmt_ratio(s["committed"], b and b["committed"]),
                         C.fmt_s(s["restore"]),
                         C.fmt_s(s["rebuild"]) if s["rebuild"] else "",
                         C.fmt_bytes(max(s["node_bytes"])) if "node_bytes" in s else "",
                         mem, how(s)])
    lines += [C.markdown_table(headers, rows), "", f"Environment: `{json.dumps(env)}`"]
    return "\n".join(lines)


def plot(results: List[dict], path: Path) -> None:
    """Per run (``<stem>_<state>_<nodes>nodes.png``): stall, committed and restore
    seconds of each level and scheme."""
    for res in results:
        rows = res["summary"]
        labels = [f"{s['level']}\n{s['scheme']}" for s in rows]
        C.bar_plot_or_note(path.with_name(f"{path.stem}_{res['size']}_{res['nodes']}nodes.png"),
                           f"{res['size']}, {RANKS} ranks on {res['nodes']} nodes", labels,
                           {"stall": [s["stall"] for s in rows],
                            "committed (after save)": [s["committed"] for s in rows],
                            "restore (a scheme: node 1 lost)": [s["restore"] for s in rows]},
                           ylabel="seconds (median, slowest rank)")


# --------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------

def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="resnet50,vgg16", help="of: " + ",".join(SIZES))
    p.add_argument("--nodes", default="2,4", help="simulated nodes for the 4 ranks")
    p.add_argument("--schemes", default="partner,xor:2,xor:4",
                   help="redundancy schemes (xor:G with G > nodes is left out)")
    p.add_argument("--scheme-levels", default="memory,disk",
                   help="the node-local levels the schemes are measured on")
    p.add_argument("--repeat", type=int, default=3, help="timed rounds")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds before them")
    p.add_argument("--no-s3", action="store_true", help="leave out the S3 durable tier")
    p.add_argument("--dir", default=str(C.BENCH_DIR),
                   help="where the node-local and durable directories go (a temporary "
                        "levels-*.tmp inside, removed at the end)")
    p.add_argument("--shm-dir", default="/dev/shm",
                   help="where the fresh directory for UCKPT_SHM_DIR is made (a tmpfs)")
    p.add_argument("--results-dir", default=str(C.RESULTS_DIR))
    p.add_argument("--name", default="levels", help="results file stem")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        try:
            worker(json.loads(args.worker))
        except BaseException:  # one rank failing must not leave the others waiting
            import traceback

            from mpi4py import MPI
            traceback.print_exc()
            sys.stderr.flush()
            MPI.COMM_WORLD.Abort(1)
        return 0
    mpiexec = Path(sys.executable).with_name("mpiexec")
    if not mpiexec.exists():
        mpiexec = Path(shutil.which("mpiexec") or "mpiexec")
    work = Path(tempfile.mkdtemp(prefix="levels-", suffix=".tmp", dir=args.dir))
    shm = Path(tempfile.mkdtemp(prefix="uckpt-bench-levels-", dir=args.shm_dir))
    server, results, loads = None, [], [os.getloadavg()[0]]
    try:
        s3 = None
        if not args.no_s3:
            from bench_storage import start_server
            server = start_server(work)
            s3 = {"bucket": server.new_bucket("levels"), "options": server.storage_options}
        for size in args.sizes.split(","):
            for nodes in map(int, args.nodes.split(",")):
                if RANKS % nodes:
                    raise SystemExit(f"--nodes {nodes}: {RANKS} ranks do not split evenly")
                schemes = [s for s in args.schemes.split(",") if s and not (
                    s.startswith("xor:") and int(s[4:]) > nodes)]
                cfg = {"size": size, "nodes": nodes, "repeat": args.repeat,
                       "warmup": args.warmup, "work": str(work),
                       "schemes": schemes, "scheme_levels": args.scheme_levels.split(","),
                       "s3": s3}
                t0 = time.perf_counter()
                print(f"[{size}, {nodes} nodes]", file=sys.stderr, flush=True)
                out = subprocess.run([str(mpiexec), "-n", str(RANKS), sys.executable, __file__,
                                      "--worker", json.dumps(cfg)],
                                     stdout=subprocess.PIPE, text=True, timeout=3600,
                                     env={**os.environ, "UCKPT_SHM_DIR": str(shm)})
                loads.append(os.getloadavg()[0])
                line = next((x for x in out.stdout.splitlines() if x.startswith("BENCH ")), None)
                if out.returncode or line is None:
                    print(out.stdout[-3000:], file=sys.stderr)
                    raise SystemExit(f"{size}, {nodes} nodes: the ranks failed "
                                     f"(exit {out.returncode})")
                run = json.loads(line[6:])
                run["summary"] = summarize(run)
                run["seconds"] = time.perf_counter() - t0
                loads += [x for r in run["rows"] for x in [r["load1"]]]
                results.append(run)
    finally:
        if server is not None:
            server.kill()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)
    env = {**C.environment(), "load1": loads}
    text = report(results, env, args, loads)
    print("\n" + text)
    out_dir = Path(args.results_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{args.name}.md").write_text(text + "\n")
    C.write_json(out_dir / f"{args.name}.json",
                 {"env": env, "args": vars(args), "results": results})
    plot(results, out_dir / f"{args.name}.png")
    print(f"wrote {out_dir / args.name}.{{md,json}} and plots", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
