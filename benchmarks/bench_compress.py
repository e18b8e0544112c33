"""Compression (issue 12): size and speed of compressed uckpt checkpoints against the usual
ways of writing a compressed checkpoint, and the async training stall with a compressed
durable tier.

States: bench_sync's ResNet50 and VGG16 (+ SGD momentum, float32) and a bf16
transformer-sized state (GPT-2-small-like weights, N(0, 0.02)). Methods, in the same run:

  uckpt raw            uckpt.save(dir, state)
  uckpt zstd           uckpt.save(dir, state, compression="zstd", compression_level=LEVEL)
  np.savez_compressed  deflate, Chainer's default serializer (bf16 saved as its uint16 bits)
  torch.save           (uncompressed, for reference)
  h5py gzip            every array a dataset with compression="gzip" (level 4)

Each save includes fsync of what it wrote; sizes are of the files on disk. Loads read
back the uckpt checkpoints (raw and zstd) into new NumPy arrays, from the page cache
(read once, untimed, first: a save may write with O_DIRECT) unless --cold. The async part runs bench_async's training
loop with tiers=[fast, durable] where the durable tier is raw or compressed
(Tier(compression="zstd")), and reports the median training stall per save.

    .venv/bin/python benchmarks/bench_compress.py                     # full run
    .venv/bin/python benchmarks/bench_compress.py --states resnet50 --repeat 1 \\
        --tf-layers 2 --async-width 1024 --async-steps 12             # quick check

Writes benchmarks/results/compress.json, compress.md and compress.png.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict, List

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402

MiB = 1 << 20


# --- states ---------------------------------------------------------------------------------------
def model_state(spec: C.ModelSpec) -> Dict[str, np.ndarray]:
    model, opt = C.build_state(spec)
    return {k: t.detach().numpy() for k, t in C.flat_tensors(model, opt).items()}


def transformer_state(layers: int, width: int, vocab: int = 50257) -> Dict[str, np.ndarray]:
    """GPT-2-like weights in bfloat16 (12 layers of width 768: 124M parameters, 249 MB)."""
    import ml_dtypes

    rng = np.random.default_rng(0)

    def w(*shape, std=0.02):
        return (rng.standard_normal(shape, dtype=np.float32) * std).astype(ml_dtypes.bfloat16)

    out = {"wte": w(vocab, width), "wpe": w(1024, width)}
    for i in range(layers):
        p = f"h.{i}."
        out.update({p + "ln_1.weight": (1 + w(width, std=0.05)), p + "attn.c_attn.weight": w(width, 3 * width),
                    p + "attn.c_attn.bias": w(3 * width, std=0.01), p + "attn.c_proj.weight": w(width, width),
                    p + "ln_2.weight": (1 + w(width, std=0.05)), p + "mlp.c_fc.weight": w(width, 4 * width),
                    p + "mlp.c_fc.bias": w(4 * width, std=0.01), p + "mlp.c_proj.weight": w(4 * width, width)})
    return out


def plain(state: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Arrays NumPy's and h5py's writers take: bfloat16 as its uint16 bits."""
    return {k: (a.view(np.uint16) if a.dtype.name == "bfloat16" else a) for k, a in state.items()}


# --- methods --------------------------------------------------------------------------------------
def uckpt_save(compression=None, level=None):
    def save(out: Path, state) -> None:
        import uckpt
        kw = {"compression": compression, "compression_level": level} if compression else {}
        uckpt.save(out, state, **kw)
    return save


def savez_compressed(out: Path, state) -> None:
    out.mkdir()
    with open(out / "ckpt.npz", "wb") as f:
        np.savez_compressed(f, **plain(state))
        f.flush()
        os.fsync(f.fileno())


def torch_save(out: Path, state) -> None:
    import torch
    out.mkdir()
    tensors = {k: (torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
                   if a.dtype.name == "bfloat16" else torch.from_numpy(a)) for k, a in state.items()}
    with open(out / "ckpt.pt", "wb") as f:
        torch.save(tensors, f)
        f.flush()
        os.fsync(f.fileno())


def h5py_gzip(out: Path, state) -> None:
    import h5py
    out.mkdir()
    with h5py.File(out / "ckpt.h5", "w") as f:
        for k, a in plain(state).items():
            f.create_dataset(k, data=a, compression="gzip" if a.size > 1 else None)
    C.fsync_path(out / "ckpt.h5")


def methods(level: int) -> Dict[str, Callable]:
    return {"uckpt raw": uckpt_save(), "uckpt zstd": uckpt_save("zstd", level),
            "np.savez_compressed": savez_compressed, "torch.save": torch_save,
            "h5py gzip": h5py_gzip}


def load_uckpt(out: Path, cold: bool) -> float:
    import uckpt
    if cold:
        C.drop_file_cache(out)
    else:  # saves may bypass the page cache (O_DIRECT): warm means read once before
        uckpt.load(out)
    seconds, _ = C.timed(lambda: uckpt.load(out))
    return seconds


# --- the async stall ------------------------------------------------------------------------------
def async_stalls(args, work: Path) -> Dict[str, Dict[str, float]]:
    import bench_async as A
    import uckpt

    class Tiered(A.Method):
        def make_manager(self, uckpt_, name):
            durable = uckpt.Tier(self.dir / "durable",
                                 compression="zstd" if name.endswith("zstd") else None)
            return uckpt.CheckpointManager(tiers=[self.dir / "fast", durable], keep_last=2,
                                           async_save=True)

    out: Dict[str, Dict[str, float]] = {}
    runs: Dict[str, list] = {}
    for _ in range(args.repeat):
        for name in ("uckpt-tiers-raw", "uckpt-tiers-zstd"):
            r = A.train(name, args.async_k, args.async_steps, args.async_width, args.async_depth,
                        args.async_batch, work, method_factory=Tiered)
            runs.setdefault(name, []).append(r)
    for name, rs in runs.items():
        r = sorted(rs, key=lambda r: r["total_s"])[len(rs) // 2]
        out[name] = {"stall_median_s": statistics.median(r["stalls_s"]), "total_s": r["total_s"],
                     "drain_s": r["drain_s"], "state_bytes": r["state_bytes"], "saves": len(r["stalls_s"])}
    return out


# --- report ---------------------------------------------------------------------------------------
def run_state(name: str, state, args, work: Path) -> Dict:
    nbytes = sum(a.nbytes for a in state.values())
    res: Dict = {"state": name, "nbytes": nbytes, "methods": {}}
    for mname, save in methods(args.level).items():
        if mname not in args.methods:
            continue
        times, size, loads = [], 0, []
        for i in range(args.repeat):
            out = work / f"{name}-{mname.replace(' ', '_')}-{i}"
            seconds, _ = C.timed(lambda: save(out, state))
            times.append(seconds)
            size = C.tree_nbytes(out)
            if mname.startswith("uckpt"):
                loads.append(load_uckpt(out, args.cold))
            C.cleanup(out)
        entry = {"save_s": statistics.median(times), "save_min_s": min(times), "size": size,
                 "ratio": size / nbytes}
        if loads:
            entry["load_s"] = statistics.median(loads)
        res["methods"][mname] = entry
        print(f"  {name:<12} {mname:<20} save {entry['save_s']:7.2f} s  size {size / MiB:8.1f} MiB "
              f"({entry['ratio']:.3f}x)" + (f"  load {entry['load_s']:.2f} s" if loads else ""),
              flush=True)
    return res


def table(results: List[Dict]) -> str:
    rows = []
    for r in results:
        ms = r["methods"]
        zsave = ms.get("uckpt zstd", {}).get("save_s")
        for mname, e in ms.items():
            rows.append([r["state"], mname, C.fmt_bytes(e["size"]), f"{e['ratio']:.3f}",
                         f"{e['save_s']:.2f}", C.fmt_rate(r["nbytes"], e["save_s"]),
                         f"{e['save_s'] / zsave:.1f}x" if zsave else "-",
                         f"{e['load_s']:.2f}" if "load_s" in e else "-"])
    return C.markdown_table(["state", "method", "size", "size / raw", "save s", "save GB/s",
                             "save / uckpt zstd", "load s"], rows)


def targets(results: List[Dict], stalls: Dict) -> List[str]:
    lines = []
    for r in results:
        ms = r["methods"]
        z, raw, npz = ms.get("uckpt zstd"), ms.get("uckpt raw"), ms.get("np.savez_compressed")
        if not z:
            continue
        if raw:
            goal = 0.70 if r["state"].startswith("bf16") else 0.86
            lines.append(f"- {r['state']}: size {z['size'] / raw['size']:.3f}x raw (target "
                         f"<= {goal}); load {z['load_s'] / raw['load_s']:.2f}x uncompressed "
                         "(target <= 1.5)")
        lines.append(f"- {r['state']}: save {C.fmt_rate(r['nbytes'], z['save_s'])} GB/s "
                     "(target >= 0.5)" + (f", {npz['save_s'] / z['save_s']:.1f}x faster than "
                                          "np.savez_compressed (target >= 20)" if npz else ""))
    if len(stalls) == 2:
        a, b = stalls["uckpt-tiers-raw"], stalls["uckpt-tiers-zstd"]
        lines.append(f"- async stall per save: {b['stall_median_s'] * 1e3:.1f} ms with a "
                     f"compressed durable tier, {a['stall_median_s'] * 1e3:.1f} ms uncompressed "
                     f"({b['stall_median_s'] / a['stall_median_s']:.2f}x; target <= 1.10)")
    return lines


def plot(results: List[Dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [m for m in methods(1) if any(m in r["methods"] for r in results)]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    x = np.arange(len(names))
    width = 0.8 / max(1, len(results))
    for i, r in enumerate(results):
        pos = x + (i - (len(results) - 1) / 2) * width
        ratio = [r["methods"].get(m, {}).get("ratio", np.nan) for m in names]
        rate = [r["nbytes"] / r["methods"][m]["save_s"] / C.GB if m in r["methods"] else np.nan
                for m in names]
        axes[0].bar(pos, ratio, width, label=r["state"])
        axes[1].bar(pos, rate, width, label=r["state"])
    for ax, label in zip(axes, ["size / raw state (lower is better)",
                                "save GB/s, fsync included (higher is better)"]):
        ax.set_xticks(x)
        ax.set_xticklabels(names, rotation=20, ha="right")
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    axes[1].set_yscale("log")
    fig.suptitle("compressed checkpoints (bench_compress.py)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--states", default="resnet50,vgg16,bf16-transformer")
    ap.add_argument("--methods", default=",".join(methods(1)))
    ap.add_argument("--level", type=int, default=1, help="uckpt's Zstandard level")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tf-layers", type=int, default=12)
    ap.add_argument("--tf-width", type=int, default=768)
    ap.add_argument("--cold", action="store_true", help="drop the page cache before loads")
    ap.add_argument("--async-steps", type=int, default=40)
    ap.add_argument("--async-k", type=int, default=5)
    ap.add_argument("--async-width", type=int, default=4096)
    ap.add_argument("--async-depth", type=int, default=3)
    ap.add_argument("--async-batch", type=int, default=256)
    ap.add_argument("--no-async", action="store_true")
    ap.add_argument("--dir", default=str(C.RESULTS_DIR), help="where checkpoints go")
    ap.add_argument("--out", default=str(C.RESULTS_DIR / "compress"), help="results prefix")
    args = ap.parse_args(argv)
    args.methods = args.methods.split(",")
    work = Path(tempfile.mkdtemp(prefix="compress-", suffix=".tmp", dir=args.dir))
    results, stalls = [], {}
    try:
        for name in args.states.split(","):
            if name == "bf16-transformer":
                state = transformer_state(args.tf_layers, args.tf_width)
            else:
                state = model_state({"resnet50": C.resnet50_spec, "vgg16": C.vgg16_spec}[name]())
            print(f"{name}: {len(state)} arrays, {C.fmt_bytes(sum(a.nbytes for a in state.values()))}",
                  flush=True)
            results.append(run_state(name, state, args, work))
            del state
        if not args.no_async:
            stalls = async_stalls(args, work)
    finally:
        C.cleanup(work)
    text = "\n".join(["# Compressed checkpoints", "", table(results), "",
                      *targets(results, stalls), "",
                      f"uckpt zstd level {args.level}; loads {'cold' if args.cold else 'warm'}; "
                      f"{args.repeat} repeat(s), medians", ""])
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    C.write_json(out.with_suffix(".json"), {"environment": C.environment(), "args": vars(args),
                                            "results": results, "async": stalls})
    out.with_suffix(".md").write_text(text)
    plot(results, out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
