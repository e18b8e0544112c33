"""uckpt against Orbax on JAX states: sync save, load, async stall and time to durable.

One process builds a state of ``jax.Array``s (parameters, batch statistics and an
SGD-momentum trace shaped like Optax's, plus a step counter), on one device or
sharded over ``--devices N`` CPU devices (``XLA_FLAGS`` is set before JAX is
imported), and measures, in the same run, every method on four rows:

  sync save      save until the checkpoint is committed, then fsync of every file
                 and directory it wrote (inside the timed region)
  load           restore into a target tree of ``jax.ShapeDtypeStruct``s carrying
                 the source's shardings; the result is compared bit for bit
  async stall    the time the training thread is blocked in the async save call
  async durable  from the async save call until its write is committed and fsynced

Methods:

  uckpt       uckpt.save / uckpt.load(path, target); async: uckpt.save(blocking=False)
  uckpt_mgr   uckpt.CheckpointManager(async_save=True): save(step) / restore
  orbax_std   orbax.checkpoint.StandardCheckpointer: save + wait_until_finished / restore
  orbax_mgr   orbax.checkpoint.CheckpointManager(enable_async_checkpointing=True)

uckpt checksums every chunk it writes and verifies it on load; Orbax does not
checksum its data chunks, so its rows do less work.

    .venv/bin/python benchmarks/bench_jax.py --sizes resnet50,1gb --repeat 3
    .venv/bin/python benchmarks/bench_jax.py --quick               # resnet50, 1 round
    .venv/bin/python benchmarks/bench_jax.py --devices 8 --quick   # sharded over 8 CPU devices
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402

ROWS = ("sync save", "load", "async stall", "async durable")


# --------------------------------------------------------------------------
# States
# --------------------------------------------------------------------------

def host_state(size: str, seed: int = 0) -> Dict[str, Dict[str, np.ndarray]]:
    """The state as NumPy arrays: ``params``, ``batch_stats``, ``opt_state`` (a
    momentum trace the shape of ``params``) and ``step``.

    resnet50: torchvision's ResNet-50 shapes (common.resnet50_spec), 25.6 M parameters.
    1gb: 8 float32 matrices of 4096 x 4096 and their momentum, 1.07 GB.
    tiny: a few small arrays, for the smoke test.
    """
    rng = np.random.default_rng(seed)
    if size == "resnet50":
        spec = C.resnet50_spec()
        shapes = {n: s for n, s, _ in spec.params}
        stats = {n: s for n, s, d in spec.buffers if d == "float32"}
    elif size == "1gb":
        shapes = {f"dense{i}.weight": (4096, 4096) for i in range(8)}
        stats = {}
    elif size == "tiny":
        shapes = {"conv.weight": (16, 3, 3, 3), "fc.weight": (10, 64), "fc.bias": (10,)}
        stats = {"bn.running_mean": (16,), "bn.running_var": (16,)}
    else:
        raise ValueError(f"unknown size {size!r}; choose from {', '.join(SIZES)}")

    def rand(shape, scale):
        return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(np.float32)

    return {
        "params": {n: rand(s, 0.02) for n, s in shapes.items()},
        "batch_stats": {n: rand(s, 0.1) for n, s in stats.items()},
        "opt_state": {n: rand(s, 0.01) for n, s in shapes.items()},
        "step": {"count": np.asarray(1000 + seed, np.int32)},
    }


SIZES = ("resnet50", "1gb", "tiny")


def sharding_for(shape, mesh):
    """Split the first axis over the mesh where it divides evenly; else replicate."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    n = mesh.devices.size
    if shape and n > 1 and shape[0] % n == 0:
        return NamedSharding(mesh, P("d"))
    return NamedSharding(mesh, P())


@dataclass
class Ctx:
    host: Dict[str, Dict[str, np.ndarray]]
    state: Dict[str, Dict[str, object]]      # jax.Arrays
    abstract: Dict[str, Dict[str, object]]   # jax.ShapeDtypeStructs with the same shardings
    nbytes: int
    n_arrays: int


def build_ctx(size: str, devices: int) -> Ctx:
    import jax
    from jax.sharding import Mesh

    if len(jax.devices()) < devices:
        raise SystemExit(f"asked for {devices} devices, JAX has {len(jax.devices())}")
    mesh = Mesh(np.array(jax.devices()[:devices]), ("d",))
    host = host_state(size)
    state: Dict[str, Dict[str, object]] = {}
    abstract: Dict[str, Dict[str, object]] = {}
    for group, leaves in host.items():
        state[group], abstract[group] = {}, {}
        for k, a in leaves.items():
            sh = sharding_for(a.shape, mesh)
            state[group][k] = jax.device_put(a, sh)
            abstract[group][k] = jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh)
    jax.block_until_ready(state)
    nbytes = sum(a.nbytes for g in host.values() for a in g.values())
    return Ctx(host, state, abstract, nbytes, sum(len(g) for g in host.values()))


def verify(ctx: Ctx, restored) -> int:
    """Raise AssertionError unless ``restored`` holds every array of the source, bit for
    bit, with the target's dtype and sharding; return the number of arrays compared."""
    for group, leaves in ctx.host.items():
        got = restored[group]
        if set(got) != set(leaves):
            raise AssertionError(f"{group}: names differ: {sorted(set(got) ^ set(leaves))[:3]}")
        for k, want in leaves.items():
            a = got[k]
            if a.dtype != want.dtype or tuple(a.shape) != want.shape:
                raise AssertionError(
                    f"{group}/{k}: {a.shape}/{a.dtype} != {want.shape}/{want.dtype}")
            if not a.sharding.is_equivalent_to(ctx.abstract[group][k].sharding, a.ndim):
                raise AssertionError(f"{group}/{k}: sharding {a.sharding} is not the target's")
            if np.asarray(a).tobytes() != want.tobytes():
                raise AssertionError(f"{group}/{k}: values differ")
    return sum(len(g) for g in ctx.host.values())


# --------------------------------------------------------------------------
# Methods: each saves step ``s`` of a root it owns, and loads it back
# --------------------------------------------------------------------------

@dataclass
class Method:
    name: str
    note: str
    sync_save: Callable[[Path, int, Ctx], None]     # returns once committed
    load: Callable[[Path, int, Ctx], object]        # returns the restored tree
    async_save: Callable[[Path, int, Ctx], Callable[[], None]]  # returns a wait()
    path: Callable[[Path, int], Path] = lambda root, s: root / f"step-{s}"  # what it wrote
    close: Callable[[], None] = lambda: None


def _uckpt():
    """uckpt as installed, else this checkout's ``src/`` and ``adapters/``."""
    try:
        import uckpt
    except ImportError:
        repo = Path(__file__).resolve().parent.parent
        sys.path[:0] = [str(repo / "src"), str(repo / "adapters")]
        import uckpt
    return uckpt


def _close_all(managers: Dict[Path, object]) -> None:
    """Close every manager of a method (one per root) and forget them."""
    for m in managers.values():
        m.close()  # type: ignore[attr-defined]
    managers.clear()


def uckpt_method() -> Method:
    def sync_save(root, s, ctx):
        _uckpt().save(root / f"step-{s}", ctx.state)

    def load(root, s, ctx):
        return _uckpt().load(root / f"step-{s}", ctx.abstract)

    def async_save(root, s, ctx):
        h = _uckpt().save(root / f"step-{s}", ctx.state, blocking=False)
        return h.wait

    return Method("uckpt", "uckpt.save / uckpt.load(path, abstract); async: "
                  "uckpt.save(blocking=False), handle.wait()", sync_save, load, async_save)


def uckpt_mgr_method() -> Method:
    mgrs: Dict[Path, object] = {}

    def mgr(root: Path):
        if root not in mgrs:
            mgrs[root] = _uckpt().CheckpointManager(root, async_save=True)
        return mgrs[root]

    def sync_save(root, s, ctx):
        mgr(root).save(s, ctx.state)
        mgr(root).wait()

    def load(root, s, ctx):
        target = {g: dict(v) for g, v in ctx.abstract.items()}
        mgr(root).restore(target, step=s)  # leaves the restored arrays in target
        return target

    def async_save(root, s, ctx):
        mgr(root).save(s, ctx.state)
        return mgr(root).wait

    def path(root, s):
        from uckpt.storage.base import step_dir_name
        return root / step_dir_name(s)

    return Method("uckpt_mgr", "uckpt.CheckpointManager(async_save=True): save(step) returns "
                  "after the snapshot, wait(); restore(target, step)", sync_save, load,
                  async_save, path, lambda: _close_all(mgrs))


def orbax_std_method() -> Method:
    ck: Dict[str, object] = {}

    def cp():
        if "c" not in ck:
            import orbax.checkpoint as ocp
            ck["c"] = ocp.StandardCheckpointer()
        return ck["c"]

    def sync_save(root, s, ctx):
        cp().save(root / f"step-{s}", ctx.state)
        cp().wait_until_finished()

    def load(root, s, ctx):
        return cp().restore(root / f"step-{s}", ctx.abstract)

    def async_save(root, s, ctx):
        cp().save(root / f"step-{s}", ctx.state)
        return cp().wait_until_finished

    def close():
        if "c" in ck:
            ck.pop("c").close()

    return Method("orbax_std", "orbax StandardCheckpointer (async under the hood): save, "
                  "wait_until_finished / restore(path, abstract)", sync_save, load,
                  async_save, close=close)


def orbax_mgr_method() -> Method:
    mgrs: Dict[Path, object] = {}

    def mgr(root: Path):
        if root not in mgrs:
            import orbax.checkpoint as ocp
            mgrs[root] = ocp.CheckpointManager(root, options=ocp.CheckpointManagerOptions(
                enable_async_checkpointing=True, max_to_keep=None))
        return mgrs[root]

    def sync_save(root, s, ctx):
        import orbax.checkpoint as ocp
        mgr(root).save(s, args=ocp.args.StandardSave(ctx.state))
        mgr(root).wait_until_finished()

    def load(root, s, ctx):
        import orbax.checkpoint as ocp
        return mgr(root).restore(s, args=ocp.args.StandardRestore(ctx.abstract))

    def async_save(root, s, ctx):
        import orbax.checkpoint as ocp
        mgr(root).save(s, args=ocp.args.StandardSave(ctx.state))
        return mgr(root).wait_until_finished

    return Method("orbax_mgr", "orbax CheckpointManager(enable_async_checkpointing=True): "
                  "save(step, StandardSave), wait_until_finished / restore(step, StandardRestore)",
                  sync_save, load, async_save, lambda root, s: root / str(s),
                  lambda: _close_all(mgrs))


METHODS: Dict[str, Callable[[], Method]] = {
    "uckpt": uckpt_method, "uckpt_mgr": uckpt_mgr_method,
    "orbax_std": orbax_std_method, "orbax_mgr": orbax_mgr_method,
}


# --------------------------------------------------------------------------
# Harness
# --------------------------------------------------------------------------

@dataclass
class Result:
    method: str
    note: str
    rows: Dict[str, C.Timing] = field(default_factory=lambda: {r: C.Timing() for r in ROWS})
    disk_bytes: Optional[int] = None
    verified: int = 0  # arrays loaded back and found equal, bit for bit, over all rounds
    error: Optional[str] = None
    error_trace: Optional[str] = None


def run_method(m: Method, ctx: Ctx, args, workdir: Path) -> Result:
    """1 warm-up + ``args.repeat`` timed rounds; each round: sync save, load (verified),
    async save (stall, then durable; loaded back and verified untimed)."""
    prep = {"pretouch_bytes": args.pretouch_bytes, "settle_s": args.settle}
    res = Result(m.name, m.note)
    root = workdir / m.name
    root.mkdir()
    try:
        for i in range(1 + args.repeat):
            warm = i == 0
            kw = {} if warm else prep
            rows = {r: None for r in ROWS} if warm else res.rows
            s_sync, s_async = 2 * i + 1, 2 * i + 2
            sync_p, async_p = m.path(root, s_sync), m.path(root, s_async)

            def sync_save(s=s_sync, p=sync_p):
                m.sync_save(root, s, ctx)
                C.fsync_tree(p)
            C.timed(sync_save, rows["sync save"], **kw)
            if not sync_p.is_dir():
                raise AssertionError(f"{m.name} did not write {sync_p}")
            res.disk_bytes = C.tree_nbytes(sync_p)
            _, restored = C.timed(lambda s=s_sync: m.load(root, s, ctx), rows["load"], **kw)
            res.verified += verify(ctx, restored)
            del restored

            def async_save(s=s_async, p=async_p):
                t0 = time.perf_counter()
                wait = m.async_save(root, s, ctx)
                stall = time.perf_counter() - t0
                wait()
                C.fsync_tree(p)
                return stall
            _, stall = C.timed(async_save, rows["async durable"], **kw)
            if not warm:
                rows["async stall"].seconds.append(stall)
            if not async_p.is_dir():
                raise AssertionError(f"{m.name} did not write {async_p}")
            res.verified += verify(ctx, m.load(root, s_async, ctx))
            C.cleanup(sync_p)
            C.cleanup(async_p)
    except Exception as e:  # one method failing never stops the others
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        res.error = f"{type(e).__name__}: {msg}"[:160]
        res.error_trace = traceback.format_exc()
        res.rows = {r: C.Timing() for r in ROWS}
    finally:
        try:
            m.close()
        except Exception as e:  # closing must not hide the result
            print(f"({m.name}: close failed: {type(e).__name__}: {e})", file=sys.stderr)
        C.cleanup(root)
    return res


# --------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------

def _med(r: Result, row: str) -> Optional[float]:
    return None if r.error else r.rows[row].median


def table(results: List[Result]) -> str:
    by = {r.method: r for r in results}
    u = by.get("uckpt")
    headers = ["row"] + [r.method for r in results] + [f"{r.method} ÷ uckpt" for r in results
                                                          if r.method != "uckpt"]
    rows = []
    for row in ROWS:
        cells = [row] + [f"n/a ({r.error[:40]})" if r.error else
                         f"{C.fmt_s(r.rows[row].median)} (min {C.fmt_s(r.rows[row].min)})"
                         for r in results]
        cells += [C.fmt_ratio(_med(r, row), _med(u, row) if u else None)
                  for r in results if r.method != "uckpt"]
        rows.append(cells)
    return C.markdown_table(headers, rows)


def report(size: str, ctx: Ctx, results: List[Result], args, workdir: Path,
           env: Dict[str, object], load0: tuple) -> str:
    head = [
        f"# uckpt vs Orbax on JAX: {size}, {args.devices} device(s)",
        "",
        f"State: {ctx.n_arrays} jax.Arrays (params, batch_stats, momentum, step), "
        f"{ctx.nbytes:,} bytes ({ctx.nbytes / C.GB:.3f} GB)"
        + (f", the first axis sharded over {args.devices} CPU devices where it divides"
           if args.devices > 1 else ", on one device") + ".",
        f"Rounds: 1 warm-up + {args.repeat} timed per method; median (min) seconds.",
        f"Output: {workdir} ({C.filesystem_of(workdir)}).",
        f"Machine: {env.get('cpu_count')} CPUs, {C.fmt_bytes(env.get('mem_total_bytes'))} RAM, "
        f"{env.get('platform')}; jax {env.get('jax')}, orbax-checkpoint {env.get('orbax')}, "
        f"numpy {env.get('numpy')}; uckpt {env.get('uckpt')}.",
        f"Run at {env.get('time')}; 1-min load average {load0[0]:.2f} at start, "
        f"{os.getloadavg()[0]:.2f} at end.",
        "",
    ]
    notes = [
        "",
        "Ratios are time(method) / time(uckpt): above 1.00x, uckpt is faster.",
        "",
        "Rows:",
        "- sync save: until committed, then fsync of every file and directory written (timed).",
        "- load: into ShapeDtypeStructs carrying the source's shardings; verified bit for bit "
        "(values, dtype, sharding) after timing.",
        "- async stall: time inside the async save call (the training thread is blocked).",
        "- async durable: from that call until the write is committed and fsynced; the "
        "checkpoint is then loaded back and verified (untimed).",
        "- uckpt checksums every chunk on save and verifies it on load; Orbax does not "
        "checksum its data chunks.",
        "",
        "Methods (bytes of one checkpoint on disk):",
        *[f"- `{r.method}` ({C.fmt_bytes(r.disk_bytes)}): {r.note}" for r in results],
    ]
    errs = [r for r in results if r.error]
    if errs:
        notes += ["", "Errors:", *[f"- `{r.method}`: {r.error}" for r in errs]]
    return "\n".join(head) + table(results) + "\n" + "\n".join(notes) + "\n"


def write_outputs(size: str, ctx: Ctx, results: List[Result], text: str, args,
                  workdir: Path, env: Dict[str, object], load0: tuple) -> Path:
    rd = Path(args.results_dir)
    rd.mkdir(parents=True, exist_ok=True)
    stem = rd / f"jax_{size}_{args.devices}dev"
    stem.with_suffix(".md").write_text(text)
    C.write_json(stem.with_suffix(".json"), {
        "benchmark": "jax", "size": size, "devices": args.devices,
        "state": {"n_arrays": ctx.n_arrays, "bytes": ctx.nbytes},
        "repeat": args.repeat, "warmup": 1, "workdir": str(workdir),
        "filesystem": C.filesystem_of(workdir), "pretouch_bytes": args.pretouch_bytes,
        "settle_seconds": args.settle, "loadavg_start": list(load0),
        "loadavg_end": list(os.getloadavg()), "environment": env,
        "results": [{
            "method": r.method, "note": r.note, "error": r.error, "error_trace": r.error_trace,
            "disk_bytes": r.disk_bytes, "verified_arrays": r.verified,
            "rows": {row: {"seconds": t.seconds, "median": None if r.error else t.median,
                           "peak_rss_extra_bytes": t.peak_rss_extra}
                     for row, t in r.rows.items()},
        } for r in results],
    })
    C.bar_plot_or_note(
        stem.with_suffix(".png"), f"uckpt vs Orbax, {size} ({ctx.nbytes / C.GB:.2f} GB), "
        f"{args.devices} device(s)", [r.method for r in results],
        {row: [_med(r, row) for r in results] for row in ROWS})
    return stem


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="resnet50,1gb",
                   help=f"comma-separated, from {','.join(SIZES)} (default: resnet50,1gb)")
    p.add_argument("--methods", default=",".join(METHODS),
                   help=f"comma-separated subset of {','.join(METHODS)} (default: all)")
    p.add_argument("--repeat", type=int, default=3, help="timed rounds per method after 1 warm-up")
    p.add_argument("--quick", action="store_true",
                   help="resnet50 only (unless --sizes is given), 1 timed round, no pre-touch")
    p.add_argument("--devices", type=int, default=1,
                   help="shard over this many CPU devices (sets XLA_FLAGS before JAX starts)")
    p.add_argument("--dir", default=str(C.RESULTS_DIR),
                   help="where a temporary working directory is made (on the disk to measure)")
    p.add_argument("--results-dir", default=str(C.RESULTS_DIR), help="where .md/.json/.png go")
    p.add_argument("--pretouch", type=float, default=1.5,
                   help="before every timed call, fault in and free this many times the state's "
                        "size of memory (see common.pretouch; 0: off)")
    p.add_argument("--settle", type=float, default=0.0, help="sleep before every timed call")
    args = p.parse_args(argv)
    if args.quick:
        if "--sizes" not in (argv if argv is not None else sys.argv[1:]):
            args.sizes = "resnet50"
        args.repeat, args.pretouch = 1, 0.0
    args.size_list = [s.strip() for s in args.sizes.split(",") if s.strip()]
    args.method_list = [s.strip() for s in args.methods.split(",") if s.strip()]
    for s in args.size_list:
        if s not in SIZES:
            p.error(f"unknown size {s!r}; choose from {', '.join(SIZES)}")
    for m in args.method_list:
        if m not in METHODS:
            p.error(f"unknown method {m!r}; choose from {', '.join(METHODS)}")
    if args.repeat < 1 or args.devices < 1:
        p.error("--repeat and --devices must be at least 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.devices > 1:  # before JAX is imported: CPU devices are fixed when it starts
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + f" --xla_force_host_platform_device_count={args.devices}")
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    env = C.environment()
    env["jax"] = jax.__version__
    uckpt = _uckpt()
    env["uckpt"] = f"{getattr(uckpt, '__version__', '?')} from {Path(uckpt.__file__).parent}"
    try:
        import orbax.checkpoint as ocp
        env["orbax"] = getattr(ocp, "__version__", "?")
    except ImportError as e:
        env["orbax"] = f"import failed: {e}"

    base = Path(args.dir)
    base.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="jax-", suffix=".tmp", dir=str(base)))
    print(f"working directory: {workdir} ({C.filesystem_of(workdir)})", flush=True)
    try:
        for size in args.size_list:
            ctx = build_ctx(size, args.devices)
            print(f"\n[{size}] {ctx.n_arrays} arrays, {ctx.nbytes / C.GB:.3f} GB, "
                  f"{args.devices} device(s)", flush=True)
            args.pretouch_bytes = int(min(args.pretouch * ctx.nbytes, C.available_memory() / 2))
            load0 = os.getloadavg()
            results = []
            for name in args.method_list:
                print(f"[{size}] {name} ...", end=" ", flush=True)
                r = run_method(METHODS[name](), ctx, args, workdir)
                results.append(r)
                print(r.error or ", ".join(f"{row} {C.fmt_s(_med(r, row))} s" for row in ROWS),
                      flush=True)
            text = report(size, ctx, results, args, workdir, env, load0)
            print("\n" + text, flush=True)
            stem = write_outputs(size, ctx, results, text, args, workdir, env, load0)
            print(f"wrote {stem}.{{md,json,png}}", flush=True)
    finally:
        C.cleanup(workdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
