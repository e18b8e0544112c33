"""Synchronous save and load: uckpt against the formats and libraries people use today.

For each model-state size (ResNet50-, VGG16-sized: parameters, BatchNorm buffers
and SGD momentum) and each method, one warm-up round, then ``--repeat`` timed
rounds of: save to a new path (+ fsync of every file and directory written),
load back into a second model/optimizer pair, verify every byte, delete.

    .venv/bin/python benchmarks/bench_sync.py                      # both sizes, all methods
    .venv/bin/python benchmarks/bench_sync.py --sizes resnet50 --repeat 1
    .venv/bin/python benchmarks/bench_sync.py --methods uckpt,torch,raw

Results go to stdout and to ``benchmarks/results/sync_<size>.{md,json,png}``.
See benchmarks/README.md for what each column means.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402

REPO = C.BENCH_DIR.parent


# --------------------------------------------------------------------------
# The state under test and the target it is restored into
# --------------------------------------------------------------------------

SRC_LR, DST_LR = 0.1, 0.05  # differ, so a load that skips param_groups fails verify


@dataclass
class Ctx:
    spec: C.ModelSpec
    model: object
    opt: object
    model2: object
    opt2: object
    src: Dict[str, object]  # flat name -> tensor of (model, opt)
    nbytes: int
    loaded: object = None  # what an allocating load returned (checked, then dropped)

    def targets(self) -> Dict[str, object]:
        """Flat view of (model2, opt2), recomputed each time: some loads
        (torch's ``Optimizer.load_state_dict``) replace the optimizer's tensors."""
        return C.flat_tensors(self.model2, self.opt2)


def build_ctx(spec: C.ModelSpec) -> Ctx:
    model, opt = C.build_state(spec, seed=0, lr=SRC_LR)
    model2, opt2 = C.build_state(spec, seed=1, lr=DST_LR)
    src = C.flat_tensors(model, opt)
    return Ctx(spec, model, opt, model2, opt2, src, C.state_nbytes(src))


def _np(t):
    """Writable NumPy view (no copy) of a CPU tensor."""
    return t.detach().numpy()


def _bytes_view(t):
    return _np(t).reshape(-1).view("uint8")


# --------------------------------------------------------------------------
# Methods. save(out, ctx) writes a checkpoint at the new path ``out``;
# load(out, ctx) restores it into ctx.model2 / ctx.opt2. The harness fsyncs
# everything under ``out`` after save, inside the timed region.
# --------------------------------------------------------------------------

@dataclass
class Method:
    name: str
    save: Callable[[Path, Ctx], None]
    load: Callable[[Path, Ctx], None]
    note: str
    #: untimed, after an allocating load: put ``ctx.loaded`` into model2/opt2 for the check
    settle: Optional[Callable[[Ctx], None]] = None


_uckpt_mod = None


def _uckpt():
    global _uckpt_mod
    if _uckpt_mod is None:
        try:
            import uckpt  # installed (pip install -e .)
            if not hasattr(uckpt, "save"):
                raise ImportError("namespace package without save()")
        except ImportError:
            for p in (REPO / "src", REPO / "adapters"):
                if str(p) not in sys.path:
                    sys.path.insert(0, str(p))
            for name in [m for m in sys.modules if m == "uckpt" or m.startswith("uckpt.")]:
                del sys.modules[name]
            import uckpt
        if not hasattr(uckpt, "save") or not hasattr(uckpt, "load"):
            raise ImportError(f"uckpt at {getattr(uckpt, '__path__', '?')} has no save()/load() yet")
        _uckpt_mod = uckpt
    return _uckpt_mod


def uckpt_save(out: Path, ctx: Ctx) -> None:
    _uckpt().save(str(out), {"model": ctx.model, "optimizer": ctx.opt})


def uckpt_load(out: Path, ctx: Ctx) -> None:
    _uckpt().load(str(out), {"model": ctx.model2, "optimizer": ctx.opt2})


def _flat_names(tree, prefix=""):
    """``{"model": {"a.w": x}, "optimizer": {"state": {0: {...}}}}`` -> flat names of
    common.flat_tensors (``model/a.w``, ``optimizer/state/0/momentum_buffer``)."""
    out = {}
    for k, v in tree.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat_names(v, name + "/"))
        elif hasattr(v, "shape"):
            out[name] = v
    return out


def _settle_flat(ctx: Ctx) -> None:
    """Copy an allocating load's tensors (flat names) into model2/opt2; lr as saved."""
    import torch
    flat = _flat_names(ctx.loaded) if not any("/" in k for k in ctx.loaded) else ctx.loaded
    with torch.no_grad():
        for k, t in ctx.targets().items():
            t.copy_(torch.as_tensor(flat[k]))
    ctx.opt2.param_groups[0]["lr"] = ctx.opt.param_groups[0]["lr"]
    ctx.loaded = None


def uckpt_load_alloc(out: Path, ctx: Ctx) -> None:
    ctx.loaded = _uckpt().load(str(out))  # no target: NumPy arrays, allocated by the load


def torch_load_alloc(out: Path, ctx: Ctx) -> None:
    import torch
    ctx.loaded = torch.load(str(out / "ckpt.pt"), weights_only=True)


def safetensors_load_alloc(out: Path, ctx: Ctx) -> None:
    from safetensors.torch import load_file
    ctx.loaded = load_file(str(out / "ckpt.safetensors"))


def torch_save(out: Path, ctx: Ctx) -> None:
    import torch
    out.mkdir()
    torch.save({"model": ctx.model.state_dict(), "optimizer": ctx.opt.state_dict()}, str(out / "ckpt.pt"))


def torch_load(out: Path, ctx: Ctx) -> None:
    import torch
    sd = torch.load(str(out / "ckpt.pt"), weights_only=True)
    ctx.model2.load_state_dict(sd["model"])
    ctx.opt2.load_state_dict(sd["optimizer"])


def _npz_save(savez):
    def save(out: Path, ctx: Ctx) -> None:
        out.mkdir()
        arrays = {k: _np(t) for k, t in ctx.src.items()}
        arrays["__param_groups__"] = np.array(C.param_groups_json(ctx.opt))
        savez(str(out / "ckpt.npz"), **arrays)
    return save


def npz_load(out: Path, ctx: Ctx) -> None:
    import torch
    with np.load(str(out / "ckpt.npz")) as z:
        with torch.no_grad():
            for k, t in ctx.targets().items():
                t.copy_(torch.from_numpy(z[k]))
        C.restore_param_groups(ctx.opt2, str(z["__param_groups__"]))


def h5py_save(out: Path, ctx: Ctx) -> None:
    import h5py
    out.mkdir()
    with h5py.File(str(out / "ckpt.h5"), "w") as f:
        for k, t in ctx.src.items():
            f.create_dataset(k, data=_np(t))
        f.attrs["param_groups"] = C.param_groups_json(ctx.opt)


def h5py_load(out: Path, ctx: Ctx) -> None:
    import h5py
    with h5py.File(str(out / "ckpt.h5"), "r") as f:
        for k, t in ctx.targets().items():
            f[k].read_direct(_np(t))  # straight into the parameter: h5py's best case
        C.restore_param_groups(ctx.opt2, f.attrs["param_groups"])


def safetensors_save(out: Path, ctx: Ctx) -> None:
    from safetensors.torch import save_file
    out.mkdir()
    save_file(ctx.src, str(out / "ckpt.safetensors"),
              metadata={"param_groups": C.param_groups_json(ctx.opt)})


def safetensors_load(out: Path, ctx: Ctx) -> None:
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file
    path = str(out / "ckpt.safetensors")
    loaded = load_file(path)
    with torch.no_grad():
        for k, t in ctx.targets().items():
            t.copy_(loaded[k])
    del loaded
    with safe_open(path, framework="pt") as f:  # header only
        C.restore_param_groups(ctx.opt2, f.metadata()["param_groups"])


@contextlib.contextmanager
def _quiet():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*single process.*")
        yield


def dcp_save(out: Path, ctx: Ctx) -> None:
    import torch.distributed.checkpoint as dcp
    with _quiet():
        dcp.save({"model": ctx.model.state_dict(), "optimizer": ctx.opt.state_dict()},
                 checkpoint_id=str(out), no_dist=True)


def dcp_load(out: Path, ctx: Ctx) -> None:
    import torch.distributed.checkpoint as dcp
    sd = {"model": ctx.model2.state_dict(), "optimizer": ctx.opt2.state_dict()}
    with _quiet():
        dcp.load(sd, checkpoint_id=str(out), no_dist=True)  # in place into sd's tensors
    ctx.model2.load_state_dict(sd["model"])
    ctx.opt2.load_state_dict(sd["optimizer"])


def raw_save(out: Path, ctx: Ctx) -> None:
    out.mkdir()
    fd = os.open(str(out / "raw.bin"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        C.writev_all(fd, [_bytes_view(t) for t in ctx.src.values()])
    finally:
        os.close(fd)


def raw_load(out: Path, ctx: Ctx) -> None:
    fd = os.open(str(out / "raw.bin"), os.O_RDONLY)
    try:
        C.preadv_all(fd, [_bytes_view(t) for t in ctx.targets().values()])
    finally:
        os.close(fd)
    ctx.opt2.param_groups[0]["lr"] = ctx.opt.param_groups[0]["lr"]  # raw stores no metadata


METHODS: Dict[str, Method] = {m.name: m for m in [
    Method("uckpt", uckpt_save, uckpt_load,
           "uckpt.save(dir, {'model': m, 'optimizer': opt}) / uckpt.load(dir, {...}) in place"),
    Method("torch", torch_save, torch_load,
           "torch.save(state_dicts) / torch.load(weights_only=True) + load_state_dict"),
    Method("safetensors", safetensors_save, safetensors_load,
           "safetensors.torch.save_file / load_file + copy_ into model2 (one file, flat names)"),
    Method("dcp", dcp_save, dcp_load,
           "torch.distributed.checkpoint save/load, single process (no_dist=True) + load_state_dict"),
    Method("npz", _npz_save(np.savez), npz_load,
           "np.savez (zip, stored) / np.load + copy_ into model2"),
    Method("npz_compressed", _npz_save(np.savez_compressed), npz_load,
           "np.savez_compressed (zip, deflate: Chainer's default) / np.load + copy_"),
    Method("h5py", h5py_save, h5py_load,
           "h5py, one dataset per tensor (Keras's format) / read_direct into model2"),
    Method("raw", raw_save, raw_load,
           "limit: writev of all tensor buffers into one file / preadv straight into model2"),
    Method("uckpt_alloc", uckpt_save, uckpt_load_alloc,
           "uckpt.load(dir) with no target: new NumPy arrays (every chunk verified)",
           _settle_flat),
    Method("torch_alloc", torch_save, torch_load_alloc,
           "torch.load(weights_only=True) alone: new tensors", _settle_flat),
    Method("safetensors_alloc", safetensors_save, safetensors_load_alloc,
           "safetensors.torch.load_file alone: new tensors (mmap, then copies)", _settle_flat),
]}


# --------------------------------------------------------------------------
# Harness
# --------------------------------------------------------------------------

@dataclass
class Result:
    method: str
    note: str
    save: C.Timing = field(default_factory=C.Timing)
    load: C.Timing = field(default_factory=C.Timing)
    disk_bytes: Optional[int] = None
    n_files: Optional[int] = None
    error: Optional[str] = None
    error_trace: Optional[str] = None


def run_method(m: Method, ctx: Ctx, args, workdir: Path) -> Result:
    repeat, drop_cache = args.repeat, args.drop_cache
    prep = {"pretouch_bytes": args.pretouch_bytes, "settle_s": args.settle}
    none = {}  # the warm-up round's times are thrown away: no need to prepare memory for it
    res = Result(m.name, m.note)
    out = workdir / m.name
    try:
        for i in range(1 + repeat):
            warm = i == 0
            out = workdir / f"{m.name}-{i}"

            def save():
                m.save(out, ctx)
                C.fsync_tree(out)
            C.timed(save, None if warm else res.save, **(none if warm else prep))
            res.disk_bytes = C.tree_nbytes(out)
            res.n_files = sum(1 for p in out.rglob("*") if p.is_file()) if out.is_dir() else 1
            if drop_cache:
                C.drop_file_cache(out)

            C.zero_state(ctx.model2, ctx.opt2)
            for g in ctx.opt2.param_groups:
                g["lr"] = DST_LR
            C.timed(lambda: m.load(out, ctx), None if warm else res.load, **(none if warm else prep))
            if m.settle is not None:
                m.settle(ctx)

            bad = C.verify_same(ctx.src, ctx.targets())
            if bad is None and ctx.opt2.param_groups[0]["lr"] != SRC_LR:
                bad = f"param_groups not restored (lr {ctx.opt2.param_groups[0]['lr']})"
            if bad:
                raise AssertionError(f"loaded state differs from saved: {bad}")
            C.cleanup(out)
            gc.collect()
    except Exception as e:  # one method failing never stops the others
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        res.error = f"{type(e).__name__}: {msg}"[:160]
        res.error_trace = traceback.format_exc()
        res.save, res.load = C.Timing(), C.Timing()
    finally:
        C.cleanup(out)
        gc.collect()
    return res


# --------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------

HEADERS = ["method", "save s (med)", "save s (min)", "save GB/s", "load s (med)", "load s (min)",
           "load GB/s", "save ÷ uckpt", "load ÷ uckpt", "save ÷ raw", "load ÷ raw",
           "on disk", "files", "peak RSS + save", "peak RSS + load"]


def _med(r: Optional[Result], which: str) -> Optional[float]:
    if r is None or r.error:
        return None
    return getattr(r, which).median


def table_rows(results: List[Result], nbytes: int) -> List[List[str]]:
    by = {r.method: r for r in results}
    u, raw = by.get("uckpt"), by.get("raw")
    rows = []
    for r in results:
        if r.error:
            short = r.error if len(r.error) <= 60 else r.error[:57] + "..."
            rows.append([r.method, f"n/a ({short})"] + ["n/a"] * (len(HEADERS) - 2))
            continue
        s, l = r.save.median, r.load.median
        pk = lambda t: C.fmt_bytes(max(t.peak_rss_extra)) if t.peak_rss_extra else "n/a"
        rows.append([
            r.method, C.fmt_s(s), C.fmt_s(r.save.min), C.fmt_rate(nbytes, s),
            C.fmt_s(l), C.fmt_s(r.load.min), C.fmt_rate(nbytes, l),
            "—" if r is u else C.fmt_ratio(s, _med(u, "save")),
            "—" if r is u else C.fmt_ratio(l, _med(u, "load")),
            "—" if r is raw else C.fmt_ratio(s, _med(raw, "save")),
            "—" if r is raw else C.fmt_ratio(l, _med(raw, "load")),
            C.fmt_bytes(r.disk_bytes), str(r.n_files), pk(r.save), pk(r.load),
        ])
    return rows


def ratio_lines(results: List[Result]) -> List[str]:
    by = {r.method: r for r in results}
    u = by.get("uckpt")
    if u is None:
        return []
    if u.error:
        return [f"uckpt: n/a ({u.error}); ratios to uckpt unavailable."]
    lines = []
    for r in results:
        if r is u or r.error:
            continue
        lines.append(f"{r.method}/uckpt: save = {C.fmt_ratio(r.save.median, u.save.median)}, "
                     f"load = {C.fmt_ratio(r.load.median, u.load.median)}")
    return lines


def report(size: str, ctx: Ctx, results: List[Result], args, workdir: Path,
           env: Dict[str, object], load0: tuple) -> str:
    spec = ctx.spec
    n_tensors = len(ctx.src)
    head = [
        f"# Sync save/load: {size}",
        "",
        f"State: {spec.n_params:,} parameters ({len(spec.params)} tensors) + {len(spec.buffers)} buffers "
        f"+ SGD momentum (momentum=0.9, one step taken) = {n_tensors} tensors, "
        f"{ctx.nbytes:,} bytes ({ctx.nbytes / C.GB:.3f} GB).",
        f"Rounds: 1 warm-up + {args.repeat} timed per method; times are median and min of the timed rounds; "
        f"GB/s = state bytes / median time (1 GB = 1e9 bytes).",
        f"Output: {workdir} ({C.filesystem_of(workdir)}).",
        f"Machine: {env.get('cpu_count')} CPUs, {C.fmt_bytes(env.get('mem_total_bytes'))} RAM, "
        f"{env.get('platform')}; torch {env.get('torch')}, numpy {env.get('numpy')}, "
        f"safetensors {env.get('safetensors')}, h5py {env.get('h5py')}; uckpt {env.get('uckpt')}.",
        f"Run at {env.get('time')}; 1-min load average {load0[0]:.2f} at start, {os.getloadavg()[0]:.2f} "
        f"at end (this benchmark alone accounts for about 1; more means other work shared the CPUs).",
        f"Before every timed call: {args.pretouch_bytes / C.GB:.2f} GB of memory pre-touched "
        f"(--pretouch {args.pretouch}), {args.settle:g} s settle.",
        "",
    ]
    table = C.markdown_table(HEADERS, table_rows(results, ctx.nbytes))
    notes = [
        "",
        "Ratios are time(method) / time(uckpt) or time(method) / time(raw): above 1.00x, the other is faster.",
        "",
        "Notes:",
        "- Every save is durable: after the method returns, every file and directory it wrote, and the "
        "parent directory, is fsynced (inside the timed region). For uckpt and DCP, which fsync "
        "themselves, that adds only no-op fsyncs of clean files.",
        ("- Loads read from the page cache (files were just written; nothing is evicted), so they "
         "measure parsing, copying and memory allocation, not the disk."
         if not args.drop_cache else
         "- Before each load the checkpoint's files were evicted from the page cache with "
         "posix_fadvise(DONTNEED) (best effort), so loads include reading from the disk."),
        "- Every load writes into a second model/optimizer pair that was zeroed first, and is "
        "verified byte for byte (and the optimizer's lr) after timing.",
        "- peak RSS + save/load: the process's peak resident memory during the call above its RSS "
        "before it (max over timed rounds); page cache is not counted, except pages of files a "
        "method maps into memory (safetensors' load_file maps its file).",
        "",
        "Methods:",
        *[f"- `{r.method}`: {r.note}" for r in results],
    ]
    errs = [r for r in results if r.error]
    if errs:
        notes += ["", "Errors:", *[f"- `{r.method}`: {r.error}" for r in errs]]
    ratios = ratio_lines(results)
    if ratios:
        notes += ["", "Summary:", *[f"- {x}" for x in ratios]]
    return "\n".join(head) + table + "\n" + "\n".join(notes) + "\n"


def write_outputs(size: str, ctx: Ctx, results: List[Result], text: str, args, workdir: Path,
                  env: Dict[str, object], load0: tuple) -> None:
    rd = Path(args.results_dir)
    rd.mkdir(parents=True, exist_ok=True)
    (rd / f"sync_{size}.md").write_text(text)
    C.write_json(rd / f"sync_{size}.json", {
        "benchmark": "sync", "size": size,
        "state": {"n_params": ctx.spec.n_params, "n_tensors": len(ctx.src), "bytes": ctx.nbytes},
        "repeat": args.repeat, "warmup": 1, "drop_cache": args.drop_cache,
        "workdir": str(workdir), "filesystem": C.filesystem_of(workdir),
        "pretouch_bytes": args.pretouch_bytes, "settle_seconds": args.settle,
        "loadavg_start": list(load0), "loadavg_end": list(os.getloadavg()),
        "environment": env,
        "results": [{
            "method": r.method, "note": r.note, "error": r.error, "error_trace": r.error_trace,
            "save_seconds": r.save.seconds, "load_seconds": r.load.seconds,
            "save_median": None if r.error else r.save.median,
            "load_median": None if r.error else r.load.median,
            "save_peak_rss_extra_bytes": r.save.peak_rss_extra,
            "load_peak_rss_extra_bytes": r.load.peak_rss_extra,
            "disk_bytes": r.disk_bytes, "n_files": r.n_files,
        } for r in results],
    })
    C.bar_plot_or_note(
        rd / f"sync_{size}.png",
        f"sync save/load, {size} ({ctx.nbytes / C.GB:.2f} GB), fsync on save"
        + (", cold reads" if args.drop_cache else ", loads from page cache"),
        [r.method for r in results],
        {"save": [_med(r, "save") for r in results], "load": [_med(r, "load") for r in results]},
        mins={"save": [None if r.error else r.save.min for r in results],
              "load": [None if r.error else r.load.min for r in results]},
    )


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="resnet50,vgg16",
                   help=f"comma-separated, from {','.join(C.SPECS)} (default: both)")
    p.add_argument("--methods", default=",".join(METHODS),
                   help=f"comma-separated subset of {','.join(METHODS)} (default: all)")
    p.add_argument("--repeat", type=int, default=3, help="timed rounds per method, after 1 warm-up (default 3)")
    p.add_argument("--dir", default=str(C.RESULTS_DIR),
                   help="where a temporary working directory is made; it must be on the disk "
                        "you want to measure (default: benchmarks/results/, removed afterwards)")
    p.add_argument("--results-dir", default=str(C.RESULTS_DIR), help="where .md/.json/.png go")
    p.add_argument("--drop-cache", action="store_true",
                   help="evict each checkpoint's files from the page cache before loading "
                        "(posix_fadvise DONTNEED, best effort); default: loads hit the page cache")
    p.add_argument("--pretouch", type=float, default=1.5,
                   help="before every timed call, fault in and free this many times the state's "
                        "size of memory, so the call gets warm pages (default 1.5; 0: off). "
                        "See common.pretouch")
    p.add_argument("--settle", type=float, default=0.0,
                   help="sleep this many seconds before every timed call (default 0). With "
                        "--pretouch 0 --settle 8, every call on a VM that returns freed memory "
                        "to its host starts from cold memory: the worst case")
    args = p.parse_args(argv)
    args.size_list = [s.strip() for s in args.sizes.split(",") if s.strip()]
    args.method_list = [s.strip() for s in args.methods.split(",") if s.strip()]
    for s in args.size_list:
        if s not in C.SPECS:
            p.error(f"unknown size {s!r}; choose from {', '.join(C.SPECS)}")
    for m in args.method_list:
        if m not in METHODS:
            p.error(f"unknown method {m!r}; choose from {', '.join(METHODS)}")
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if "uckpt" in args.method_list:
        try:
            _uckpt()
        except Exception as e:
            print(f"uckpt unavailable, its rows will read n/a: {type(e).__name__}: {e}", file=sys.stderr)
    env = C.environment()
    if _uckpt_mod is not None:
        env["uckpt"] = f"{getattr(_uckpt_mod, '__version__', '?')} from {Path(_uckpt_mod.__file__).parent}"

    base = Path(args.dir)
    base.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="sync-", suffix=".tmp", dir=str(base)))
    print(f"working directory: {workdir} ({C.filesystem_of(workdir)})", flush=True)
    try:
        for size in args.size_list:
            spec = C.SPECS[size]()
            t0 = time.perf_counter()
            ctx = build_ctx(spec)
            print(f"\n[{size}] built model + SGD state: {len(ctx.src)} tensors, "
                  f"{ctx.nbytes / C.GB:.3f} GB, in {time.perf_counter() - t0:.1f} s", flush=True)
            args.pretouch_bytes = int(min(args.pretouch * ctx.nbytes, C.available_memory() / 2))
            load0 = os.getloadavg()

            results = []
            for name in args.method_list:
                print(f"[{size}] {name} ...", end=" ", flush=True)
                t0 = time.perf_counter()
                r = run_method(METHODS[name], ctx, args, workdir)
                results.append(r)
                if r.error:
                    print(f"n/a ({r.error}) [{time.perf_counter() - t0:.1f} s]", flush=True)
                else:
                    print(f"save {C.fmt_s(r.save.median)} s, load {C.fmt_s(r.load.median)} s "
                          f"[{time.perf_counter() - t0:.1f} s]", flush=True)
            text = report(size, ctx, results, args, workdir, env, load0)
            print()
            print(text, flush=True)
            write_outputs(size, ctx, results, text, args, workdir, env, load0)
            print(f"wrote {Path(args.results_dir) / f'sync_{size}'}.{{md,json,png}}", flush=True)
            del ctx, results
            gc.collect()
    finally:
        C.cleanup(workdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
