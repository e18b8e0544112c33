"""Where the time of an in-place, verified ``uckpt.load`` goes, beside what the machine allows.

For a ResNet50- or VGG16-sized training state (model + SGD momentum, as bench_sync), one
uckpt checkpoint and one raw file of the same bytes are written, then ``--repeat``
interleaved rounds time, from the page cache:

- ``raw preadv``: bench_sync's limit, one ``preadv`` of the raw file straight into the
  tensors (one thread, nothing verified): what issue 15's "0.9x raw" refers to;
- ``read, T threads`` and ``read + CRC-32C, T threads, one buffer``: the uckpt data file
  read in ``knobs.read_block_bytes`` blocks on ``knobs.io_threads`` threads into one
  (huge-page) buffer, without and with a checksum of each block while it is in cache (the
  CRC-32C implementation uckpt uses, ``uckpt.codecs.checksum.BACKEND``);
- ``read + CRC-32C, T threads, into the tensors``: the same bytes read the same way, but
  into the tensors' own memory, as an in-place load must (the tensors split over the
  threads by bytes, each read in blocks): the floor of a verified in-place load here, with
  no per-tensor work beyond the reads;
- ``uckpt.load``: the whole in-place load, and its phases run one after another as
  ``uckpt.loading.restore.restore_into`` runs them: manifest (read, JSON, validation), matching
  (the adapters' ``prepare``: what is checked before anything is written), reading with
  verification (``CheckpointReader.read_arrays``), and the adapters' ``restore``.

    .venv/bin/python benchmarks/bench_load_phases.py                  # ResNet50, 25 rounds
    .venv/bin/python benchmarks/bench_load_phases.py --size vgg16 --repeat 9

Results: stdout and ``results/load_phases_<size>.{md,json,png}``. The phases call
uckpt's internals (``restore._Matcher``), so this script moves with them.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import sys
import tempfile
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Dict, List

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402

REPO = C.BENCH_DIR.parent
for _p in (REPO / "src", REPO / "adapters"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import uckpt  # noqa: E402
from uckpt.codecs import checksum  # noqa: E402
from uckpt import knobs  # noqa: E402
from uckpt.format import strict_json  # noqa: E402
from uckpt.format import parse_manifest
from uckpt.format.manifest import MANIFEST_NAME, Manifest  # noqa: E402
from uckpt.loading.reader import CheckpointReader  # noqa: E402
from uckpt.loading.restore import _Matcher, paths_in  # noqa: E402
from uckpt.tree.flatten import array_leaf_value, decode  # noqa: E402


def _blocks(fd: int, buf: np.ndarray, threads: int, pool, crc: bool) -> None:
    """Read the file into ``buf`` in read blocks, split evenly over ``threads``."""
    block = knobs.read_block_bytes
    n = buf.nbytes
    view = memoryview(buf)

    def part(lo: int, hi: int) -> None:
        while lo < hi:
            m = min(block, hi - lo)
            os.preadv(fd, [view[lo:lo + m]], lo)
            if crc:
                checksum.crc32c(view[lo:lo + m])
            lo += m

    cut = [n * k // threads // 4096 * 4096 for k in range(threads)] + [n]
    futures = [pool.submit(part, cut[k], cut[k + 1]) for k in range(1, threads)]
    part(cut[0], cut[1])
    for f in futures:
        f.result()


def _into_tensors(fd: int, views: List[np.ndarray], threads: int, pool) -> None:
    """Read the raw file into ``views`` (the tensors' flat bytes, in file order) in read
    blocks with a CRC-32C of each, the tensors split over ``threads`` by bytes."""
    block = knobs.read_block_bytes
    offsets = np.cumsum([0] + [v.nbytes for v in views])
    cut = [int(np.searchsorted(offsets, offsets[-1] * k / threads)) for k in range(threads)]
    cut.append(len(views))

    def part(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            view, at = memoryview(views[i]), int(offsets[i])
            for s in range(0, len(view), block):
                os.preadv(fd, [view[s:s + block]], at + s)
                checksum.crc32c(view[s:s + block])

    futures = [pool.submit(part, cut[k], cut[k + 1]) for k in range(1, threads)]
    part(cut[0], cut[1])
    for f in futures:
        f.result()


def python_floor(path: Path, data_file: Path, model, opt, threads: int, pool,
                 validate: bool) -> None:
    """The least a verified in-place load written in Python does: the manifest parsed
    (``json.loads``, or uckpt's validating ``parse_manifest``), one entry looked up and one
    shape check per tensor, then the tensors' chunks read into their memory on ``threads``
    threads, each chunk's CRC-32C compared. No tree, no adapters, no hyperparameters: what
    the per-tensor work of any Python loader adds to the read, without uckpt's checks and
    framework semantics. ``data_file``: the checkpoint's one data file."""
    data = (path / MANIFEST_NAME).read_bytes()
    if validate:
        arrays = parse_manifest(data).arrays

        def where(name: str):
            e = arrays[name]
            c = e.chunks[0]
            return e.shape, c.offset, c.length, c.checksum
    else:
        doc = json.loads(data)
        listed = {**doc["arrays"], **_rows(doc.get("table"))}

        def where(name: str):
            e = listed[name]
            c = e["chunks"][0]
            return tuple(e["shape"]), c["offset"], c["length"], c["checksum"]
    jobs = []
    for name, t in C.flat_tensors(model, opt).items():
        shape, offset, length, crc = where(name)
        view = t.detach().numpy()
        if view.shape != shape or view.nbytes != length:
            raise SystemExit(f"{name}: the floor rows need one chunk per array, of its shape")
        jobs.append((memoryview(view.reshape(-1).view(np.uint8)), offset, int(crc[7:], 16)))
    fd = os.open(data_file, os.O_RDONLY)
    block = knobs.read_block_bytes
    total = sum(len(j[0]) for j in jobs)
    cut = [0]
    done = 0
    for i, job in enumerate(jobs):
        done += len(job[0])
        if len(cut) < threads and done >= total * len(cut) / threads:
            cut.append(i + 1)
    cut.append(len(jobs))

    def part(lo: int, hi: int) -> None:
        for view, offset, want in jobs[lo:hi]:
            crc = 0
            for s in range(0, len(view), block):
                piece = view[s:s + block]
                if os.preadv(fd, [piece], offset + s) != len(piece):
                    raise SystemExit("short read")
                crc = checksum.crc32c(piece, crc)
            if crc != want:
                raise SystemExit(f"checksum mismatch at offset {offset}")

    try:
        futures = [pool.submit(part, cut[k], cut[k + 1]) for k in range(1, len(cut) - 1)]
        part(cut[0], cut[1])
        for f in futures:
            f.result()
    finally:
        os.close(fd)


def _rows(table) -> Dict[str, dict]:
    """A version-6 table's rows as ``{path: {"shape", "chunks": [{"offset", "length",
    "checksum"}]}}``, its columns decoded with nothing checked (docs/format.md 15.2, 16)."""
    if table is None:
        return {}
    n = len(table["paths"])
    layout = np.frombuffer(zlib.decompress(base64.b64decode(table["layout"])), np.uint8)
    offsets, lengths = (layout[8 * n * k:8 * n * (k + 1)].reshape(8, n).T.copy().view("<u8")
                        .reshape(n).tolist() for k in (0, 1))
    crcs = np.frombuffer(base64.b64decode(table["digests"]), "<u4", n).tolist()
    return {p: {"shape": s, "chunks": [{"offset": o, "length": ln, "checksum": f"crc32c:{c:08x}"}]}
            for p, s, o, ln, c in zip(table["paths"], table["shapes"], offsets, lengths, crcs)}


def phased_load(path: Path, state: Dict[str, object], times: Dict[str, List[float]]) -> None:
    """``uckpt.load(path, state)``, phase by phase (as ``restore_into`` does them)."""
    t0 = time.perf_counter()
    data = (path / MANIFEST_NAME).read_bytes()
    t1 = time.perf_counter()
    strict_json.loads(data)
    t2 = time.perf_counter()
    manifest = parse_manifest(data)
    t3 = time.perf_counter()
    with CheckpointReader(path, manifest) as reader:
        t4 = time.perf_counter()
        matcher = _Matcher(manifest)
        matcher.mapping(state, manifest.tree, [], True)
        wanted: set = set()
        for node in matcher.needed:
            paths_in(node, wanted)
        t5 = time.perf_counter()
        arrays = reader.read_arrays({p: matcher.targets.get(p) for p in manifest.arrays
                                     if p in wanted})
        t6 = time.perf_counter()
        for adapter, obj, sub, _ in sorted(matcher.actions, key=lambda a: a[0].restore_last):
            adapter.restore(obj, decode(sub, lambda n: array_leaf_value(n, arrays[n["path"]])))
        t7 = time.perf_counter()
    for name, dt in (("manifest: read file", t1 - t0), ("manifest: JSON", t2 - t1),
                     ("manifest: JSON + validation", t3 - t2), ("open data files", t4 - t3),
                     ("match + prepare", t5 - t4), ("read + verify", t6 - t5),
                     ("restore", t7 - t6), ("phases, total", t7 - t0 - (t2 - t1))):
        times.setdefault(name, []).append(dt)


def run(args) -> str:
    spec = C.SPECS[args.size]()
    model, opt = C.build_state(spec, seed=0, lr=0.1)
    model2, opt2 = C.build_state(spec, seed=1, lr=0.05)
    src = C.flat_tensors(model, opt)
    nbytes = C.state_nbytes(src)
    work = Path(tempfile.mkdtemp(prefix="load-phases-", dir=args.dir))
    try:
        ck = work / "ck"
        uckpt.save(ck, {"model": model, "optimizer": opt})
        raw = work / "raw.bin"
        with open(raw, "wb") as f:
            C.writev_all(f.fileno(), [t.detach().numpy().reshape(-1).view(np.uint8)
                                      for t in src.values()])
        data_file = next(p for p in ck.iterdir() if p.name.startswith("data-"))
        scratch = np.empty(data_file.stat().st_size, np.uint8)
        threads = knobs.io_threads
        pool = ThreadPoolExecutor(max(1, threads - 1))
        state = {"model": model2, "optimizer": opt2}
        raw_fd, data_fd = os.open(raw, os.O_RDONLY), os.open(data_file, os.O_RDONLY)

        def views() -> List[np.ndarray]:
            return [t.detach().numpy().reshape(-1).view(np.uint8)
                    for t in C.flat_tensors(model2, opt2).values()]

        def raw_load() -> None:
            C.preadv_all(raw_fd, views())

        rows: Dict[str, Callable[[], None]] = {
            "raw preadv, 1 thread (no check)": raw_load,
            f"read, {threads} threads (no check)":
                lambda: _blocks(data_fd, scratch, threads, pool, False),
            f"read + CRC-32C, {threads} threads, one buffer":
                lambda: _blocks(data_fd, scratch, threads, pool, True),
            f"read + CRC-32C, {threads} threads, into the tensors":
                lambda: _into_tensors(raw_fd, views(), threads, pool),
            "Python floor: JSON, reads + CRC-32C (nothing else checked)":
                lambda: python_floor(ck, data_file, model2, opt2, threads, pool, False),
            "Python floor + manifest validation":
                lambda: python_floor(ck, data_file, model2, opt2, threads, pool, True),
            "uckpt.load in place": lambda: uckpt.load(ck, state),
        }
        times: Dict[str, List[float]] = {}
        try:
            for fn in rows.values():  # warm-up: page cache, allocator, first-call costs
                fn()
            phased_load(ck, state, {})
            for _ in range(args.repeat):
                for name, fn in rows.items():
                    t = time.perf_counter()
                    fn()
                    times.setdefault(name, []).append(time.perf_counter() - t)
                phased_load(ck, state, times)
            problem = C.verify_same(src, C.flat_tensors(model2, opt2))
            if problem:
                raise SystemExit(f"the loaded state differs: {problem}")
        finally:
            os.close(raw_fd), os.close(data_fd)
            pool.shutdown()
        return report(args, spec, len(src), nbytes, times)
    finally:
        C.cleanup(work)


def report(args, spec, n_tensors: int, nbytes: int, times: Dict[str, List[float]]) -> str:
    med = {k: statistics.median(v) for k, v in times.items()}
    raw = med["raw preadv, 1 thread (no check)"]
    head = ["what", "ms (median)", "ms (min)", "x raw preadv speed"]
    rows = [[k, f"{med[k] * 1e3:.2f}", f"{min(v) * 1e3:.2f}",
             f"{raw / med[k]:.2f}x" if not k.startswith(("manifest", "open", "match", "restore",
                                                        "read + verify"))
             else ""] for k, v in times.items()]
    budget = raw / 0.9
    floor = med[next(k for k in med if k.startswith("read + CRC") and k.endswith("tensors"))]
    text = "\n".join([
        f"# In-place verified load of the {args.size} state: phases and floor",
        "",
        f"{n_tensors} tensors, {nbytes / C.GB:.3f} GB; {args.repeat} interleaved rounds from the "
        f"page cache; {knobs.io_threads} read threads; CRC-32C by {checksum.BACKEND}.",
        C.machine_line(),
        "",
        C.markdown_table(head, rows),
        "",
        f"- 0.9x the raw preadv speed means a load within {budget * 1e3:.1f} ms; reading into the "
        f"tensors and checksumming alone take {floor * 1e3:.1f} ms here, leaving {(budget - floor) * 1e3:.1f} "
        f"ms for everything else ({(budget - floor) * 1e6 / n_tensors:.1f} us per tensor).",
        "- The phase rows run the load's steps one after another, as `restore_into` does; "
        "`phases, total` is their sum without the duplicate JSON-only row.",
        "",
    ])
    rd = Path(args.results_dir)
    rd.mkdir(parents=True, exist_ok=True)
    (rd / f"load_phases_{args.size}.md").write_text(text)
    C.write_json(rd / f"load_phases_{args.size}.json", {
        "benchmark": "load_phases", "size": args.size, "tensors": n_tensors, "bytes": nbytes,
        "repeat": args.repeat, "io_threads": knobs.io_threads,
        "read_block_bytes": knobs.read_block_bytes, "crc32c_backend": checksum.BACKEND,
        "environment": C.environment(),
        "seconds": times})
    names = list(times)
    C.bar_plot_or_note(rd / f"load_phases_{args.size}.png",
                       f"in-place verified load, {args.size}: phases and floor",
                       names, {"time": [med[k] for k in names]},
                       mins={"time": [min(times[k]) for k in names]})
    return text


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="resnet50", choices=sorted(C.SPECS))
    p.add_argument("--repeat", type=int, default=25, help="interleaved rounds (default 25)")
    p.add_argument("--dir", default=str(C.RESULTS_DIR),
                   help="where the temporary checkpoint goes (removed afterwards)")
    p.add_argument("--results-dir", default=str(C.RESULTS_DIR))
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    print(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
