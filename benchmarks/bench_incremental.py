"""Incremental checkpoints: bytes written and time per save against plain saves.

Scenarios (each: a ``CheckpointManager`` on a fresh directory, ``--steps`` training
steps, a blocking save after each; the first save of an incremental manager is full):

``finetune``   ResNet50 (torchvision shapes) fine-tuned with a frozen backbone: only
               ``fc`` is trained (torch SGD, momentum 0.9; the backbone in eval mode
               does not change, so its forward pass is skipped and ``fc`` gets random
               gradients). Reported: bytes written per incremental save against the
               bytes of the chunks that changed plus the manifest (target <= 1.05x),
               and the save time against a plain save.
``embedding``  an embedding table (``--rows`` x 256 float32; the default about 1 GB)
               trained with torch's SparseAdam on 1% of its rows per step (uniform
               random rows): bytes per incremental save against a full save (target
               <= 5%), for several ``incremental_chunk_bytes``.
``full``       ResNet50 where every parameter changes (SGD momentum on all): the time
               of an incremental save against a plain one (target <= 1.05x).
``hash``       XXH3-128 throughput of uckpt.codecs.hashing over 64 MiB pieces, 1 and 2 threads
               (target >= 2 GB/s on 2 cores).
``verify``     the cost of reading back what incremental saves refer to (uckpt.saving.reverify):
               a ``--rows`` x 256 float32 table, 1% of its rows changed per step (NumPy),
               saved after each step, synchronously and asynchronously, with the
               verification as shipped and with it disabled (saves refer to unverified
               chunks, as before issue 25): the save's time (async: the stall, and the
               time to commit), the seconds saves waited for a read-back, and the bytes
               read back per save; ``--gap`` seconds of training between saves (default:
               none, back to back, the worst case).

    .venv/bin/python benchmarks/bench_incremental.py                    # everything, full size
    .venv/bin/python benchmarks/bench_incremental.py --small            # a quick run
    .venv/bin/python benchmarks/bench_incremental.py --only verify --name incremental_verify

Results go to stdout and ``benchmarks/results/incremental.{md,json}``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402


def step_bytes(path: Path) -> Dict[str, int]:
    """What one checkpoint wrote, and the chunks of it that are its own."""
    import uckpt

    m = uckpt.manifest(path)
    data = sum(f.size for f in m.files.values())
    own = sum(c.length for a in m.arrays.values() for c in a.chunks if c.base is None)
    return {"data": data, "own_chunks": own, "manifest": (path / "manifest.json").stat().st_size,
            "bases": len(m.bases)}


def run_saves(root: Path, make_step, state, steps: int, incremental: bool,
              piece: int = 1 << 20) -> List[dict]:
    """Save after each of ``steps`` steps (incremental ones cut into ``piece``-byte chunks);
    returns per-save seconds and bytes."""
    import uckpt

    out = []
    with uckpt.CheckpointManager(root, incremental=incremental, full_every=steps + 1,
                                 keep_last=2, save_options=uckpt.SaveOptions(
                                     incremental_chunk_bytes=piece)) as mgr:
        for s in range(1, steps + 1):
            make_step()
            start = time.perf_counter()
            path = mgr.save(s, state)
            seconds = time.perf_counter() - start
            out.append(dict(step=s, seconds=seconds, **step_bytes(path)))
    return out


def finetune(tmp: Path, steps: int) -> dict:
    import torch

    model = C.build_module(C.resnet50_spec())
    for p in model.parameters():
        p.requires_grad_(False)
    fc = model._modules["fc"]
    for p in fc.parameters():
        p.requires_grad_(True)
    opt = torch.optim.SGD(fc.parameters(), lr=0.01, momentum=0.9)
    gen = torch.Generator().manual_seed(0)

    def train_step():
        feats = torch.randn(32, 2048, generator=gen)
        loss = (feats @ fc.weight.T + fc.bias).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    state = {"model": model, "optimizer": opt}
    inc = run_saves(tmp / "inc", train_step, state, steps, True)
    plain = run_saves(tmp / "plain", train_step, state, steps, False)
    later = inc[1:]
    ratio = max((r["data"] + r["manifest"]) / (r["own_chunks"] + r["manifest"]) for r in later)
    return {
        "full_bytes": inc[0]["data"], "incremental_bytes": [r["data"] for r in later],
        "changed_chunk_bytes": [r["own_chunks"] for r in later],
        "manifest_bytes": [r["manifest"] for r in later],
        "written_over_changed_plus_manifest_max": ratio,
        "incremental_s_median": statistics.median(r["seconds"] for r in later),
        "plain_s_median": statistics.median(r["seconds"] for r in plain[1:]),
    }


def embedding(tmp: Path, steps: int, rows: int, pieces: List[int]) -> dict:
    import torch

    out = {"rows": rows, "dim": 256, "table_bytes": rows * 256 * 4, "by_chunk_bytes": {}}
    for piece in pieces:
        emb = torch.nn.Embedding(rows, 256, sparse=True)
        opt = torch.optim.SparseAdam(emb.parameters(), lr=1e-3)
        gen = torch.Generator().manual_seed(1)

        def train_step():
            ids = torch.randperm(rows, generator=gen)[:max(1, rows // 100)]
            emb(ids).square().sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        train_step()  # the Adam state exists from the first save on
        records = run_saves(tmp / f"emb{piece}", train_step, {"emb": emb, "optimizer": opt},
                            steps, True, piece)
        full = records[0]["data"]
        later = records[1:]
        out["by_chunk_bytes"][piece] = {
            "full_bytes": full,
            "incremental_bytes_median": statistics.median(r["data"] for r in later),
            "manifest_bytes_median": statistics.median(r["manifest"] for r in later),
            "fraction_of_full_max": max((r["data"] + r["manifest"]) / full for r in later),
            "incremental_s_median": statistics.median(r["seconds"] for r in later),
            "full_s": records[0]["seconds"],
        }
        shutil.rmtree(tmp / f"emb{piece}")
    return out


def full_training(tmp: Path, steps: int, repeat: int) -> dict:
    import torch

    model, opt = C.build_state(C.resnet50_spec())
    gen = torch.Generator().manual_seed(2)

    def train_step():
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=gen).mul_(0.01)
        opt.step()

    import uckpt

    state = {"model": model, "optimizer": opt}
    times: Dict[str, List[float]] = {"plain": [], "incremental": []}
    managers = {mode: uckpt.CheckpointManager(tmp / mode, incremental=mode == "incremental",
                                              full_every=10 ** 9, keep_last=2)
                for mode in times}
    # one training step, then a save by each manager in turn, which goes first alternating:
    # the second save of a pair pays for the first's writeback (measured: up to 2x on a
    # virtual disk), and drift on a shared machine hits both alike
    for s in range(1, steps * repeat + 2):
        train_step()
        for mode, mgr in sorted(managers.items(), reverse=bool(s % 2)):
            start = time.perf_counter()
            mgr.save(s, state)
            if s > 1:  # the first incremental save is a full one
                times[mode].append(time.perf_counter() - start)
    for mgr in managers.values():
        mgr.close()
    plain, inc = statistics.median(times["plain"]), statistics.median(times["incremental"])
    return {"bytes": C.state_nbytes(C.flat_tensors(model, opt)), "plain_s_median": plain,
            "incremental_s_median": inc, "ratio": inc / plain}


class _Unverified:
    """A stand-in for uckpt.saving.reverify.Verifier that verifies nothing (for the baseline)."""

    def __init__(self, *args) -> None:
        self.bytes_read, self.read_seconds, self.waited_seconds = 0, 0.0, 0.0

    def committed(self, manifest, name) -> None:
        pass

    def usable(self, baseline):
        from uckpt.saving.incremental import Baseline

        return baseline if baseline is not None else Baseline("")

    def join(self) -> None:
        pass

    def close(self) -> None:
        pass


def verification(tmp: Path, steps: int, rows: int, repeat: int, gap: float) -> dict:
    """Save times with and without the read-back verification, sync and async; ``gap``
    seconds of (simulated) training between the end of a save and the next."""
    import uckpt
    import uckpt.manager.checkpoint_manager as manager
    from uckpt.saving.reverify import Verifier

    layout = uckpt.SaveOptions(incremental_chunk_bytes=64 << 10)
    rng = np.random.default_rng(4)
    table = rng.standard_normal((rows, 256), dtype=np.float32)
    out: Dict[str, dict] = {}
    for r in range(repeat):  # the modes interleaved, so drift hits them alike
        for mode in ("sync", "async"):
            for verified in (True, False) if r % 2 == 0 else (False, True):
                manager.Verifier = Verifier if verified else _Unverified
                key = f"{mode}, {'verified' if verified else 'unverified'}"
                rec = out.setdefault(key, {"stall": [], "commit": [], "read": 0, "waited": 0.0,
                                           "read_s": 0.0, "saves": 0, "first_read": 0})
                root = tmp / f"v{r}{mode}{verified}"
                with uckpt.CheckpointManager(root, incremental=True, full_every=10 ** 9,
                                             keep_last=2, async_save=mode == "async",
                                             save_options=layout) as mgr:
                    for s in range(1, steps + 2):
                        time.sleep(gap if s > 1 else 0)
                        ids = rng.integers(0, rows, max(1, rows // 100))
                        table[ids] += 1.0
                        start = time.perf_counter()
                        mgr.save(s, {"table": table})
                        stall = time.perf_counter() - start
                        mgr.wait()
                        if s == 1:  # a full save; its read-back runs during the next step
                            mgr._verifier.join()
                            rec["first_read"] = mgr._verifier.bytes_read
                            continue
                        rec["stall"].append(stall)
                        rec["commit"].append(time.perf_counter() - start)
                    mgr._verifier.join()
                    v = mgr._verifier
                    rec["read"] += v.bytes_read - rec["first_read"]
                    rec["waited"] += v.waited_seconds
                    rec["read_s"] += v.read_seconds
                    rec["saves"] += steps
                shutil.rmtree(root)
    manager.Verifier = Verifier
    return {"rows": rows, "table_bytes": rows * 256 * 4, "steps": steps, "repeat": repeat,
            "gap_s": gap,
            "modes": {k: {"stall_s_median": statistics.median(v["stall"]),
                          "commit_s_median": statistics.median(v["commit"]),
                          "waited_s_per_save": v["waited"] / v["saves"],
                          "read_bytes_per_save": v["read"] / v["saves"],
                          "read_s_per_save": v["read_s"] / v["saves"],
                          "first_save_read_bytes": v["first_read"]}
                      for k, v in out.items()}}


def hash_throughput(total: int) -> dict:
    from uckpt.codecs import hashing

    data = np.random.default_rng(3).integers(0, 255, size=total, dtype=np.uint8)
    pieces = [data[i:i + (64 << 20)] for i in range(0, total, 64 << 20)]
    out = {"bytes": total}
    for threads in (1, 2):
        best = min(_time(lambda: hashing.digests(pieces, threads=threads)) for _ in range(3))
        out[f"GB/s_{threads}_threads"] = total / best / C.GB
    return out


def _time(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def report(results: dict) -> str:
    lines = ["# Incremental checkpoints (bench_incremental.py)", ""]
    if "finetune" in results:
        f = results["finetune"]
        lines += ["## ResNet50, frozen backbone, fc trained (SGD momentum)", "",
                  C.markdown_table(["full save", "incremental save (median)", "changed chunks",
                                    "manifest", "written / (changed + manifest)",
                                    "time incremental / plain"],
                                   [[C.fmt_bytes(f["full_bytes"]),
                                     C.fmt_bytes(statistics.median(f["incremental_bytes"])),
                                     C.fmt_bytes(statistics.median(f["changed_chunk_bytes"])),
                                     C.fmt_bytes(statistics.median(f["manifest_bytes"])),
                                     f"{f['written_over_changed_plus_manifest_max']:.3f}x (max)",
                                     C.fmt_ratio(f["incremental_s_median"], f["plain_s_median"])]]),
                  ""]
    if "embedding" in results:
        e = results["embedding"]
        size = C.fmt_bytes(e["table_bytes"])
        lines += [f"## Embedding {e['rows']} x {e['dim']} float32 ({size}), SparseAdam, 1% "
                  "random rows per step", "",
                  C.markdown_table(["incremental_chunk_bytes", "full save", "incremental (median)",
                                    "manifest (median)", "(written + manifest) / full, max",
                                    "time incremental / full"],
                                   [[C.fmt_bytes(int(k)), C.fmt_bytes(v["full_bytes"]),
                                     C.fmt_bytes(v["incremental_bytes_median"]),
                                     C.fmt_bytes(v["manifest_bytes_median"]),
                                     f"{100 * v['fraction_of_full_max']:.1f}%",
                                     C.fmt_ratio(v["incremental_s_median"], v["full_s"])]
                                    for k, v in e["by_chunk_bytes"].items()]), ""]
    if "full" in results:
        f = results["full"]
        lines += ["## ResNet50, every parameter changes", "",
                  C.markdown_table(["state", "plain save (median)", "incremental save (median)",
                                    "ratio"],
                                   [[C.fmt_bytes(f["bytes"]), C.fmt_s(f["plain_s_median"]),
                                     C.fmt_s(f["incremental_s_median"]), f"{f['ratio']:.3f}x"]]),
                  ""]
    if "verify" in results:
        v = results["verify"]
        lines += [f"## Read-back verification: {v['rows']} x 256 float32 "
                  f"({C.fmt_bytes(v['table_bytes'])}), 1% random rows per step, "
                  f"{v['steps']} saves x {v['repeat']}, {v['gap_s']} s between saves", "",
                  C.markdown_table(["mode", "save() (median)", "save() + wait() (median)",
                                    "waited for read-back / save", "read back / save",
                                    "reading / save (background)", "read back after 1st save"],
                                   [[k, C.fmt_s(m["stall_s_median"]), C.fmt_s(m["commit_s_median"]),
                                     C.fmt_s(m["waited_s_per_save"]),
                                     C.fmt_bytes(m["read_bytes_per_save"]),
                                     C.fmt_s(m["read_s_per_save"]),
                                     C.fmt_bytes(m["first_save_read_bytes"])]
                                    for k, m in v["modes"].items()]), ""]
    if "hash" in results:
        h = results["hash"]
        lines += ["## XXH3-128 throughput (uckpt.codecs.hashing.digests, 64 MiB pieces)", "",
                  C.markdown_table(["bytes", "1 thread", "2 threads"],
                                   [[C.fmt_bytes(h["bytes"]), f"{h['GB/s_1_threads']:.1f} GB/s",
                                     f"{h['GB/s_2_threads']:.1f} GB/s"]]), ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", help="a quick run (small table, few steps)")
    ap.add_argument("--only", default="finetune,embedding,full,hash,verify")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--rows", type=int, default=None)
    ap.add_argument("--dir", default=None, help="where to save (default: a temporary directory)")
    ap.add_argument("--gap", type=float, default=0.0,
                    help="verify: seconds of simulated training between saves")
    ap.add_argument("--name", default=None, help="results/NAME.{md,json} (default: "
                    "incremental, or incremental_small with --small)")
    args = ap.parse_args(argv)
    steps = args.steps or (3 if args.small else 10)
    rows = args.rows or (1 << 16 if args.small else 1 << 20)
    only = set(args.only.split(","))
    results: dict = {"environment": C.environment(), "steps": steps}
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="uckpt-bench-inc-") as d:
        tmp = Path(d)
        if "finetune" in only:
            results["finetune"] = finetune(tmp / "ft", steps)
        if "embedding" in only:
            results["embedding"] = embedding(tmp / "emb", steps, rows, [4 << 10, 64 << 10, 1 << 20])
        if "full" in only:
            results["full"] = full_training(tmp / "full", steps, 1 if args.small else 3)
        if "hash" in only:
            results["hash"] = hash_throughput((256 if args.small else 1024) << 20)
        if "verify" in only:
            results["verify"] = verification(tmp / "verify", steps, rows,
                                             2 if args.small else 4, args.gap)
    text = report(results)
    print(text)
    name = args.name or ("incremental_small" if args.small else "incremental")
    (C.RESULTS_DIR / f"{name}.md").write_text(text + "\n")
    C.write_json(C.RESULTS_DIR / f"{name}.json", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
