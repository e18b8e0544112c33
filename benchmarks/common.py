"""Shared pieces of the uckpt benchmarks: model states, timing, durable I/O, reports.

Nothing here imports uckpt, so a broken or half-written uckpt never stops the
peers from being measured. torch is imported lazily by the state builders.
"""
from __future__ import annotations

import gc
import json
import os
import platform
import re
import shutil
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"
GB = 1e9  # throughput is reported in decimal GB/s (1e9 bytes)

# --------------------------------------------------------------------------
# Model shapes (torchvision names and shapes; torchvision itself is not needed)
# --------------------------------------------------------------------------

#: (name, shape, dtype); dtype is "float32" for parameters and float buffers,
#: "int64" for BatchNorm's ``num_batches_tracked``.
Entry = Tuple[str, Tuple[int, ...], str]


@dataclass(frozen=True)
class ModelSpec:
    name: str
    params: Tuple[Entry, ...]   # trainable: get SGD momentum buffers
    buffers: Tuple[Entry, ...]  # BatchNorm running stats etc.: no momentum

    @property
    def n_params(self) -> int:
        return sum(int(np.prod(s)) for _, s, _ in self.params)


def _bn(prefix: str, c: int, params: list, buffers: list) -> None:
    params += [(f"{prefix}.weight", (c,), "float32"), (f"{prefix}.bias", (c,), "float32")]
    buffers += [(f"{prefix}.running_mean", (c,), "float32"),
                (f"{prefix}.running_var", (c,), "float32"),
                (f"{prefix}.num_batches_tracked", (), "int64")]


def resnet50_spec() -> ModelSpec:
    """torchvision ``resnet50()``: 161 parameter tensors, 25,557,032 parameters."""
    params: list = []
    buffers: list = []
    params.append(("conv1.weight", (64, 3, 7, 7), "float32"))
    _bn("bn1", 64, params, buffers)
    inplanes = 64
    for li, (planes, blocks) in enumerate([(64, 3), (128, 4), (256, 6), (512, 3)], start=1):
        for b in range(blocks):
            p = f"layer{li}.{b}"
            width, out = planes, planes * 4
            params.append((f"{p}.conv1.weight", (width, inplanes, 1, 1), "float32"))
            _bn(f"{p}.bn1", width, params, buffers)
            params.append((f"{p}.conv2.weight", (width, width, 3, 3), "float32"))
            _bn(f"{p}.bn2", width, params, buffers)
            params.append((f"{p}.conv3.weight", (out, width, 1, 1), "float32"))
            _bn(f"{p}.bn3", out, params, buffers)
            if b == 0:
                params.append((f"{p}.downsample.0.weight", (out, inplanes, 1, 1), "float32"))
                _bn(f"{p}.downsample.1", out, params, buffers)
            inplanes = out
    params += [("fc.weight", (1000, 2048), "float32"), ("fc.bias", (1000,), "float32")]
    return ModelSpec("resnet50", tuple(params), tuple(buffers))


def vgg16_spec() -> ModelSpec:
    """torchvision ``vgg16()`` (no BatchNorm): 32 parameter tensors, 138,357,544 parameters."""
    cfg = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]
    params: list = []
    idx, cin = 0, 3
    for v in cfg:
        if v == "M":
            idx += 1  # MaxPool2d
            continue
        params += [(f"features.{idx}.weight", (v, cin, 3, 3), "float32"),
                   (f"features.{idx}.bias", (v,), "float32")]
        idx += 2  # Conv2d + ReLU
        cin = v
    for idx, (fin, fout) in zip((0, 3, 6), [(512 * 7 * 7, 4096), (4096, 4096), (4096, 1000)]):
        params += [(f"classifier.{idx}.weight", (fout, fin), "float32"),
                   (f"classifier.{idx}.bias", (fout,), "float32")]
    return ModelSpec("vgg16", tuple(params), ())


SPECS: Dict[str, Callable[[], ModelSpec]] = {"resnet50": resnet50_spec, "vgg16": vgg16_spec}


# --------------------------------------------------------------------------
# Real torch objects built from a spec
# --------------------------------------------------------------------------

def _child(root, dotted: str):
    import torch.nn as nn
    mod = root
    for part in dotted.split("."):
        sub = mod._modules.get(part)
        if sub is None:
            sub = nn.Module()
            mod.add_module(part, sub)
        mod = sub
    return mod


def build_module(spec: ModelSpec, seed: int = 0):
    """An ``nn.Module`` tree whose ``state_dict()`` has exactly the spec's names and shapes.

    Values are random (not zeros), so compression sees realistic, hard-to-compress
    float data instead of flattering runs of zeros.
    """
    import torch
    import torch.nn as nn

    gen = torch.Generator().manual_seed(seed)
    root = nn.Module()
    for name, shape, _ in spec.params:
        parent, _, leaf = name.rpartition(".")
        t = torch.randn(shape, generator=gen, dtype=torch.float32).mul_(0.02)
        _child(root, parent).register_parameter(leaf, nn.Parameter(t))
    for name, shape, dtype in spec.buffers:
        parent, _, leaf = name.rpartition(".")
        if dtype == "int64":
            t = torch.tensor(1000 + seed, dtype=torch.int64)
        elif leaf == "running_var":
            t = torch.rand(shape, generator=gen, dtype=torch.float32).add_(0.5)
        else:
            t = torch.randn(shape, generator=gen, dtype=torch.float32).mul_(0.1)
        _child(root, parent).register_buffer(leaf, t)
    return root


def build_state(spec: ModelSpec, seed: int = 0, lr: float = 0.1):
    """``(model, SGD(momentum=0.9))`` after one optimizer step, so every
    parameter has a ``momentum_buffer`` the size of the parameter."""
    import torch

    model = build_module(spec, seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    gen = torch.Generator().manual_seed(seed + 12345)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=gen, dtype=p.dtype).mul_(0.01)
    opt.step()
    opt.zero_grad(set_to_none=True)
    gc.collect()
    return model, opt


def flat_tensors(model, opt) -> Dict[str, "object"]:
    """Flat ``name -> tensor`` view (no copies) of ``{"model": ..., "optimizer": ...}``.

    ``model/<state_dict key>`` and ``optimizer/state/<i>/<key>``; the optimizer's
    param_groups (plain numbers) go separately, see :func:`param_groups_json`.
    The same names in the same order for a model and its twin built from the same spec.
    """
    import torch

    out: Dict[str, object] = {}
    for k, v in model.state_dict().items():
        out[f"model/{k}"] = v
    for k, st in opt.state_dict()["state"].items():
        for sk, sv in st.items():
            if isinstance(sv, torch.Tensor):
                out[f"optimizer/state/{k}/{sk}"] = sv
    return out


def param_groups_json(opt) -> str:
    return json.dumps(opt.state_dict()["param_groups"])


def restore_param_groups(opt, text: str) -> None:
    groups = json.loads(text)
    for g, saved in zip(opt.param_groups, groups):
        for k, v in saved.items():
            if k != "params":
                g[k] = v


def state_nbytes(flat: Dict[str, object]) -> int:
    return sum(t.numel() * t.element_size() for t in flat.values())


def zero_state(model, opt) -> None:
    """Overwrite every tensor of the target with zeros, so a load that does nothing fails verify."""
    import torch

    with torch.no_grad():
        for t in flat_tensors(model, opt).values():
            t.zero_()


def verify_same(a: Dict[str, object], b: Dict[str, object]) -> Optional[str]:
    """None if equal, else a short description of the first difference."""
    import torch

    if list(a) != list(b):
        missing = sorted(set(a) ^ set(b))[:3]
        return f"names differ: {missing}"
    for k in a:
        if a[k].shape != b[k].shape or a[k].dtype != b[k].dtype:
            return f"{k}: {tuple(b[k].shape)}/{b[k].dtype} != {tuple(a[k].shape)}/{a[k].dtype}"
        if not torch.equal(a[k], b[k]):
            return f"{k}: values differ"
    return None


# --------------------------------------------------------------------------
# Durable file I/O
# --------------------------------------------------------------------------

def fsync_path(path: os.PathLike) -> None:
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if os.path.isdir(path) else 0)
    fd = os.open(os.fspath(path), flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: os.PathLike) -> None:
    """fsync every file and directory under ``path`` (and ``path``'s parent,
    which holds its new directory entry). fsync of a clean file is cheap."""
    path = Path(path)
    if path.is_file():
        fsync_path(path)
    else:
        for dirpath, _dirnames, filenames in os.walk(path, topdown=False):
            for f in filenames:
                fsync_path(os.path.join(dirpath, f))
            fsync_path(dirpath)
    fsync_path(path.parent)


def tree_nbytes(path: os.PathLike) -> int:
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def drop_file_cache(path: os.PathLike) -> None:
    """Ask the kernel to evict the (clean, fsynced) pages of every file under
    ``path`` from the page cache (``posix_fadvise(DONTNEED)``; no root needed).
    Best effort: the kernel may keep pages that are mapped or in use."""
    path = Path(path)
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


_IOV_MAX = min(1024, os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024)


def writev_all(fd: int, buffers: Sequence) -> int:
    """Write every buffer, in order, with as few ``writev`` calls as the kernel allows."""
    views = [memoryview(b).cast("B") for b in buffers]
    views = [v for v in views if len(v)]
    total = 0
    i = 0
    while i < len(views):
        n = os.writev(fd, views[i:i + _IOV_MAX])
        total += n
        i = _advance(views, i, n)  # the kernel caps one call at ~2 GiB
    return total


def preadv_all(fd: int, buffers: Sequence, offset: int = 0) -> int:
    """Fill every buffer, in order, from ``fd`` starting at ``offset``."""
    views = [memoryview(b).cast("B") for b in buffers]
    views = [v for v in views if len(v)]
    total = 0
    i = 0
    while i < len(views):
        n = os.preadv(fd, views[i:i + _IOV_MAX], offset + total)
        if n == 0:
            raise EOFError(f"file ended after {total} bytes")
        total += n
        i = _advance(views, i, n)
    return total


def _advance(views: list, i: int, n: int) -> int:
    """After a vectored call moved ``n`` bytes from ``views[i:]``: the first view not
    done (a partly done one is trimmed in place)."""
    while n and i < len(views):
        if n >= len(views[i]):
            n -= len(views[i])
            i += 1
        else:
            views[i] = views[i][n:]
            n = 0
    return i


# --------------------------------------------------------------------------
# Memory
# --------------------------------------------------------------------------

def _status_kb(field_name: str) -> int:
    try:
        with open("/proc/self/status") as f:
            m = re.search(rf"^{field_name}:\s+(\d+) kB", f.read(), re.M)
        return int(m.group(1)) * 1024 if m else 0
    except OSError:
        return 0


_libc = None


def malloc_trim() -> None:
    """Give memory that the C heap holds but no longer uses back to the kernel
    (glibc ``malloc_trim(0)``; a no-op elsewhere). Called before each timed
    call so a method never reuses pages freed by the previous one: every method
    pays for the memory it allocates, and peak RSS counts it."""
    global _libc
    if _libc is None:
        try:
            import ctypes
            _libc = ctypes.CDLL("libc.so.6")
            _libc.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            _libc = False
    if _libc:
        _libc.malloc_trim(0)


def rss_bytes() -> int:
    return _status_kb("VmRSS")


def reset_peak_rss() -> bool:
    """Reset VmHWM (Linux >= 4.0). False if this kernel or container does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    return _status_kb("VmHWM")


def available_memory() -> int:
    try:
        import psutil
        return int(psutil.virtual_memory().available)
    except Exception:  # psutil missing: fall back to /proc/meminfo
        with open("/proc/meminfo") as f:
            m = re.search(r"^MemAvailable:\s+(\d+) kB", f.read(), re.M)
        return int(m.group(1)) * 1024 if m else 0


def pretouch(nbytes: int, chunk: int = 256 << 20) -> float:
    """Fault in ``nbytes`` of fresh memory, free it, and return the seconds taken.

    Why: on VMs that hand freed guest memory back to the host (virtio free page
    reporting, as on the machine these benchmarks were written on), the first
    touch of a page the guest freed more than ~2 s ago costs ~2 s/GB (0.5 GB/s),
    ten times a warm one. Whichever call allocates first would pay for it, at
    random. Touching memory just before a timed call leaves warm pages on the
    kernel's free lists, which the call's own allocations (heap and page cache)
    then get. All chunks are held until the end, so they are distinct pages.
    """
    t0 = time.perf_counter()
    held = []
    left = int(nbytes)
    while left > 0:
        n = min(chunk, left)
        a = np.empty(n, np.uint8)
        a[::4096] = 1  # one write per page faults it in
        held.append(a)
        left -= n
    del held
    malloc_trim()
    return time.perf_counter() - t0


# --------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------

@dataclass
class Timing:
    seconds: List[float] = field(default_factory=list)
    peak_rss_extra: List[int] = field(default_factory=list)  # bytes above RSS before the call

    @property
    def median(self) -> float:
        return statistics.median(self.seconds) if self.seconds else float("nan")

    @property
    def min(self) -> float:
        return min(self.seconds) if self.seconds else float("nan")


def timed(fn: Callable[[], object], into: Optional[Timing] = None,
          pretouch_bytes: int = 0, settle_s: float = 0.0):
    """Run ``fn`` once; return (seconds, result). Appends to ``into`` if given.

    Before the call, untimed: gc is collected (and disabled during the call, so
    a collection of someone else's garbage is not billed to ``fn``), the C heap
    is trimmed (:func:`malloc_trim`), then the process sleeps ``settle_s``
    (lets a VM reclaim freed memory: the cold case) and touches
    ``pretouch_bytes`` of memory (:func:`pretouch`: the warm case).
    """
    gc.collect()
    malloc_trim()
    if settle_s > 0:
        time.sleep(settle_s)
    if pretouch_bytes > 0:
        pretouch(pretouch_bytes)
    rss0 = rss_bytes()
    can_peak = reset_peak_rss()
    was = gc.isenabled()
    gc.disable()
    try:
        t0 = time.perf_counter()
        result = fn()
        dt = time.perf_counter() - t0
    finally:
        if was:
            gc.enable()
    if into is not None:
        into.seconds.append(dt)
        if can_peak:
            into.peak_rss_extra.append(max(0, peak_rss_bytes() - rss0))
    return dt, result


def cleanup(path: os.PathLike) -> None:
    p = Path(path)
    if p.is_dir():
        shutil.rmtree(p, ignore_errors=True)
    elif p.exists():
        p.unlink()


# --------------------------------------------------------------------------
# Reports
# --------------------------------------------------------------------------

def fmt_s(x: Optional[float]) -> str:
    if x is None or x != x:
        return "n/a"
    return f"{x:.3f}" if x < 10 else f"{x:.1f}"


def fmt_rate(nbytes: int, seconds: Optional[float]) -> str:
    if not seconds or seconds != seconds:
        return "n/a"
    return f"{nbytes / seconds / GB:.2f}"


def fmt_ratio(num: Optional[float], den: Optional[float]) -> str:
    if not num or not den or num != num or den != den:
        return "n/a"
    return f"{num / den:.2f}x"


def fmt_bytes(n: Optional[float]) -> str:
    if n is None or n != n:
        return "n/a"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    rows = [list(map(str, r)) for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    def line(cells):
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(headers), sep, *(line(r) for r in rows)])


def environment() -> Dict[str, object]:
    info: Dict[str, object] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "numpy": np.__version__,
        "time": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    }
    try:
        import psutil
        info["mem_total_bytes"] = int(psutil.virtual_memory().total)
    except Exception:
        pass
    for mod in ("torch", "safetensors", "h5py", "matplotlib"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:
            info[mod] = None
    try:
        import uckpt
        info["uckpt"] = getattr(uckpt, "__version__", "unknown")
    except Exception as e:  # reported, not fatal
        info["uckpt"] = f"import failed: {e!r}"
    return info


def filesystem_of(path: os.PathLike) -> str:
    """'<device> <fstype> on <mountpoint>' for the mount holding ``path`` (Linux)."""
    path = os.path.realpath(path)
    best = ("", "?", "?")
    try:
        with open("/proc/mounts") as f:
            for line in f:
                dev, mnt, fstype = line.split()[:3]
                if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best[0]):
                    best = (mnt, dev, fstype)
    except OSError:
        pass
    return f"{best[1]} {best[2]} on {best[0] or '?'}"


def bar_plot(path: os.PathLike, title: str, methods: Sequence[str],
             series: Dict[str, Sequence[Optional[float]]],
             mins: Optional[Dict[str, Sequence[Optional[float]]]] = None,
             ylabel: str = "seconds (median; tick = min)") -> None:
    """Grouped bars: one group per method, one bar per series (e.g. save, load).

    The y axis turns logarithmic when values span more than 20x (so one slow
    method does not flatten the rest); missing values are labelled n/a."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(series)
    x = np.arange(len(methods))
    width = 0.8 / max(1, len(names))
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(methods) + 2), 4.5))
    for i, name in enumerate(names):
        vals = [v if v is not None and v == v else np.nan for v in series[name]]
        pos = x + (i - (len(names) - 1) / 2) * width
        bars = ax.bar(pos, vals, width, label=name)
        for b, v in zip(bars, series[name]):
            xc = b.get_x() + b.get_width() / 2
            if v is None or v != v:  # on the axis, whatever its scale
                ax.annotate("n/a", (xc, 0), xycoords=("data", "axes fraction"), ha="center",
                            va="bottom", fontsize=7, xytext=(0, 2), textcoords="offset points")
            else:
                ax.annotate(fmt_s(v), (xc, b.get_height()), ha="center", va="bottom", fontsize=7,
                            xytext=(0, 2), textcoords="offset points")
        if mins and name in mins:
            ax.scatter(pos, [m if m is not None and m == m else np.nan for m in mins[name]],
                       marker="_", color="black", s=80, zorder=3)
    present = [v for vs in series.values() for v in vs if v is not None and v == v and v > 0]
    if present and max(present) / min(present) > 20:
        ax.set_yscale("log")
        ylabel += ", log scale"
    ax.set_xticks(x)
    ax.set_xticklabels(methods, rotation=20, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def machine_line() -> str:
    """One line naming the machine and the versions that matter, for a report's header."""
    return ("Machine: {cpu_count} CPUs, {platform}; torch {torch}, numpy {numpy}; "
            "uckpt {uckpt}.".format(**environment()))


def bar_plot_or_note(path: os.PathLike, *args, **kwargs) -> None:
    """:func:`bar_plot`, or a note on stderr where it cannot be drawn (a plot is nice to
    have; the numbers are never lost over it)."""
    try:
        bar_plot(path, *args, **kwargs)
    except Exception as e:
        print(f"(plot not written: {type(e).__name__}: {e})", file=sys.stderr)


def write_json(path: os.PathLike, obj) -> None:
    def default(o):
        if hasattr(o, "__dataclass_fields__"):
            return asdict(o)
        if isinstance(o, (np.integer, np.floating)):
            return o.item()
        if isinstance(o, Path):
            return str(o)
        raise TypeError(type(o))
    Path(path).write_text(json.dumps(obj, indent=2, default=default) + "\n")
