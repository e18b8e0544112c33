"""``uckpt verify CKPT...``: re-check every chunk's checksum of one or more checkpoints."""
from __future__ import annotations

import argparse
import sys
import time
from typing import List, NamedTuple, Optional

from ..errors import CheckpointNotFoundError, UckptError
from ..loading.reader import CheckpointReader
from .common import bytes_text, human_bytes, print_error
from . import foreign
from .inspect import add_from_argument
from .scan import COMMITTED, DAMAGED, Found, scan
from .storage_args import add_storage_arguments, options_for

HELP = "re-check every checksum of checkpoints"
DESCRIPTION = """\
Read every byte of each checkpoint CKPT and check it against the checksums in
its manifest, and the manifest against its own checksum. Prints "OK: ..." per
checkpoint and exits 0 when all are intact; otherwise names the file (and the
leaf and byte offset) of the first damage in each damaged checkpoint and exits
1. A checkpoint of format version 1 has no manifest checksum: it is verified
as far as it can be, with a note saying so. With --all, each argument is a
root directory (e.g. a CheckpointManager's) and every checkpoint under it is
verified; temporary directories of interrupted saves are skipped, and so is a
checkpoint that the root's writer deletes (retention) while it is verified. A CKPT or
ROOT may be an s3://bucket/prefix URL. A CKPT in another format (NPZ,
torch.save, HDF5, safetensors, .keras, Hugging Face, DCP) is parsed fully and
every array read, with the checks and limits of uckpt convert; the OK line says
what could be checked."""


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("verify", help=HELP, description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", metavar="CKPT",
                   help="checkpoint directories (with --all: root directories)")
    p.add_argument("--all", action="store_true",
                   help="verify every checkpoint under each ROOT given")
    add_from_argument(p)
    add_storage_arguments(p)
    p.set_defaults(run=run)
    return p


class Target(NamedTuple):
    """A checkpoint to verify: its path or URL; with --all, how it was listed."""

    where: str
    found: Optional[Found] = None


def targets(args) -> List[Target]:
    """Checkpoints to verify; with --all, every committed or damaged one listed under each
    root (an entry that is a symlink is not followed: it is reported instead)."""
    if not args.all:
        return [Target(str(p)) for p in args.paths]
    out: List[Target] = []
    for root in args.paths:
        found = [f for f in scan(root, options_for(root, args))
                 if f.status in (COMMITTED, DAMAGED)]
        if not found:
            raise CheckpointNotFoundError(f"no checkpoints under {root!r}", path=root)
        out += [Target(f.where, f) for f in found]
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


def verify_one(path, storage_options=None) -> str:
    """Verify one checkpoint; returns the OK line (and a note for an unchecked manifest)
    or raises."""
    start = time.perf_counter()
    with CheckpointReader(path, storage_options=storage_options) as reader:
        manifest = reader.manifest  # a version-2 manifest's checksum was checked reading it
        chunks = sum(len(a.chunks) for a in manifest.arrays.values())
        progress = Progress(str(path), manifest.nbytes)
        try:
            nbytes = reader.verify(progress=progress)
        finally:
            progress.clear()
    took = time.perf_counter() - start
    line = f"OK: {chunks} chunks, {bytes_text(nbytes)} verified in {took:.3f} s: {path}"
    if manifest.checksum is None:
        line += (f"\n  note: format version {manifest.format_version} has no manifest "
                 "checksum, so the manifest itself could not be checked (only the data); "
                 "saving the state again writes the current version")
    return line


def run(args) -> int:
    paths = targets(args)
    failed = 0
    for target in paths:
        path, found = target.where, target.found
        if found is not None and not found.followed:
            failed += 1
            print_error(f"{path}: {found.reason}")
            continue
        try:
            if not args.all and foreign.is_foreign(path):
                print(foreign.verify(path, args.src_format), flush=True)
            else:
                print(verify_one(path, options_for(path, args)), flush=True)
        except (UckptError, OSError) as e:
            if found is not None and found.gone():
                print(f"skipped: {path}: deleted while it was verified (the root's writer "
                      "removed it)", flush=True)
                continue
            failed += 1
            print_error(e)
    if failed and len(paths) > 1:
        print_error(f"{failed} of {len(paths)} checkpoints failed verification")
    return 1 if failed else 0
