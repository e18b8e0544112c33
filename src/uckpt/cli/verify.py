"""``uckpt verify CKPT...``: re-check every chunk's checksum of one or more checkpoints."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import List

from ..errors import CheckpointNotFoundError, UckptError
from ..reader import CheckpointReader
from .common import bytes_text, human_bytes, print_error
from .scan import COMMITTED, DAMAGED, scan

HELP = "re-check every checksum of checkpoints"
DESCRIPTION = """\
Read every byte of each checkpoint CKPT and check it against the checksums in
its manifest. Prints "OK: ..." per checkpoint and exits 0 when all are intact;
otherwise names the file, leaf and byte offset of the first damage in each
damaged checkpoint and exits 1. With --all, each argument is a root directory
(e.g. a CheckpointManager's) and every checkpoint under it is verified;
temporary directories of interrupted saves are skipped."""


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("verify", help=HELP, description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", metavar="CKPT",
                   help="checkpoint directories (with --all: root directories)")
    p.add_argument("--all", action="store_true",
                   help="verify every checkpoint under each ROOT given")
    p.set_defaults(run=run)
    return p


def targets(args) -> List[Path]:
    if not args.all:
        return [Path(p) for p in args.paths]
    out: List[Path] = []
    for root in args.paths:
        found = [f.path for f in scan(root) if f.status in (COMMITTED, DAMAGED)]
        if not found:
            raise CheckpointNotFoundError(f"no checkpoints under {root!r}", path=root)
        out += found
    return out


class Progress:
    """A one-line progress meter on stderr, drawn only when stderr is a terminal."""

    def __init__(self, label: str, total: int) -> None:
        self.label, self.total, self.last = label, total, 0.0
        self.on = sys.stderr.isatty()

    def __call__(self, done: int) -> None:
        now = time.monotonic()
        if not self.on or now - self.last < 0.2:
            return
        self.last = now
        pct = 100.0 * done / self.total if self.total else 100.0
        sys.stderr.write(f"\rverifying {self.label}: {pct:5.1f}% of {human_bytes(self.total)}")
        sys.stderr.flush()

    def clear(self) -> None:
        if self.on and self.last:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def verify_one(path: Path) -> str:
    """Verify one checkpoint; returns the OK line or raises."""
    start = time.perf_counter()
    with CheckpointReader(path) as reader:
        chunks = sum(len(a.chunks) for a in reader.manifest.arrays.values())
        progress = Progress(str(path), reader.manifest.nbytes)
        try:
            nbytes = reader.verify(progress=progress)
        finally:
            progress.clear()
    took = time.perf_counter() - start
    return (f"OK: {chunks} chunks, {bytes_text(nbytes)} verified in "
            f"{took:.3f} s: {path}")


def run(args) -> int:
    paths = targets(args)
    failed = 0
    for path in paths:
        try:
            print(verify_one(path), flush=True)
        except (UckptError, OSError) as e:
            failed += 1
            print_error(e)
    if failed and len(paths) > 1:
        print_error(f"{failed} of {len(paths)} checkpoints failed verification")
    return 1 if failed else 0
