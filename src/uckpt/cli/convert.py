"""``uckpt convert SRC DST``: move a checkpoint between NPZ, Pickle (torch.save), HDF5,
safetensors and uckpt (and from PyTorch DCP), bit for bit, without running foreign code."""
from __future__ import annotations

import argparse
import sys
import warnings

from ..conversion import detect
from ..conversion.errors import ConvertWarning
from .common import human_bytes, print_json, shape_str, table

HELP = "convert a checkpoint between NPZ, Pickle, HDF5, safetensors and uckpt"
DESCRIPTION = """\
Convert the checkpoint SRC to DST. Formats: npz (np.savez, Chainer save_npz and
trainer snapshots), pickle (torch.save files), hdf5 (Keras .weights.h5 and
legacy .h5, any h5py tree), safetensors, uckpt (checkpoint directories) and,
as a source only, dcp (PyTorch Distributed Checkpoint directories).

SRC's format is detected from its content and DST's from its name (.npz, .pt,
.pth, .bin, .pkl, .h5, .hdf5, .safetensors; anything else is a uckpt
directory); --from and --to override them. Arrays are copied bit for bit with
their dtypes (bfloat16 and float8 where the target has none: stored as raw bits
and marked), names and nesting; plain values (learning rates, step counts,
strings) are kept. What the target cannot hold, or holds differently, is
listed as a warning on standard error.

Safety: Pickle input is read by a restricted unpickler that admits only
tensors, storages, OrderedDict and plain containers, and refuses anything else
by name without running it; NPZ object arrays, HDF5 external links, external
storage and virtual datasets into other files are refused; sizes an input
declares are checked against the file before anything is allocated; names
that would be unsafe as zip member names or HDF5 paths (.., absolute, NUL,
backslash) are refused. Trees that shared references would expand past
--max-nodes, and data that would grow past --max-ratio bytes per stored byte,
are refused before the work is done.

DST is written under a temporary name and renamed into place: a failure or
Ctrl-C leaves no partial output. An existing DST is replaced only with --force.
Memory stays about the largest array. A progress bar is drawn on standard
error for large inputs when it is a terminal (not with --quiet).

Exit status: 0 converted (or listed, with --dry-run), 1 error, 2 usage error,
130 interrupted (Ctrl-C; nothing is left behind)."""


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("convert", help=HELP, description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", metavar="SRC", help="the checkpoint to read (a file or directory)")
    p.add_argument("dst", metavar="DST", help="where to write the converted checkpoint")
    p.add_argument("--from", dest="src_format", metavar="FORMAT",
                   choices=sorted(detect.FORMATS + tuple(detect.ALIASES)),
                   help="format of SRC: npz, pickle, hdf5, safetensors, uckpt, dcp "
                        "(default: detected from its content)")
    p.add_argument("--to", dest="dst_format", metavar="FORMAT",
                   choices=sorted(detect.TARGETS + tuple(detect.ALIASES)),
                   help="format of DST: npz, pickle, hdf5, safetensors, uckpt "
                        "(default: from its name)")
    p.add_argument("-f", "--force", action="store_true", help="replace DST if it exists")
    p.add_argument("-n", "--dry-run", action="store_true",
                   help="list what would be converted; write nothing")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--compress", nargs="?", const="zstd", metavar="CODEC",
                   help="compress the target: a uckpt target's chunks with Zstandard "
                        "(CODEC: zstd, the default, or zstd+bytegroup)")
    add_limit_options(p)
    p.set_defaults(run=run)
    return p


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def add_limit_options(p: argparse.ArgumentParser) -> None:
    """``--max-nodes`` and ``--max-ratio``: the limits on hostile input (docs/convert.md)."""
    g = p.add_argument_group("limits on hostile input (raise them for a legitimate input "
                             "that exceeds them)")
    g.add_argument("--max-nodes", type=_positive, metavar="N",
                   help="most nodes a tree may have once shared references are expanded "
                        "(default: 100000 or 4 per byte of the pickle or HDF5 file, whichever "
                        "is more; env UCKPT_CONVERT_MAX_NODES)")
    g.add_argument("--max-ratio", type=_positive, metavar="R",
                   help="most bytes made per byte stored by a compressed HDF5 dataset or a "
                        "tensor whose strides repeat elements (default 1032; env "
                        "UCKPT_CONVERT_MAX_RATIO)")


def limits_of(args):
    from ..conversion.limits import Limits

    return Limits(max_nodes=args.max_nodes, max_ratio=args.max_ratio)


def run(args) -> int:
    from ..conversion.api import convert
    from ..conversion.progress import Bar, wanted

    bar = Bar("converting") if wanted(args.quiet) else None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvertWarning)  # printed below, once each
            report = convert(args.src, args.dst, src_format=args.src_format,
                             dst_format=args.dst_format, force=args.force,
                             dry_run=args.dry_run, progress=bar, limits=limits_of(args),
                             compress=args.compress)
    finally:
        if bar:
            bar.finish()
    for text in report.warnings:
        sys.stderr.write(f"uckpt: warning: {text}\n")
    if args.json:
        print_json(report.to_json())
        return 0
    if args.dry_run:
        print(f"would convert {report.src} ({report.src_format}) -> {report.dst} "
              f"({report.dst_format}); nothing written")
        if report.arrays:
            rows = [[n, d, shape_str(s), human_bytes(b)] for n, d, s, b in report.arrays]
            print(table(["ARRAY", "DTYPE", "SHAPE", "SIZE"], rows, right=[3]))
        if report.values:
            shown = ", ".join(report.values[:12]) + (", ..." if len(report.values) > 12 else "")
            print(f"{len(report.values)} plain value(s): {shown}")
    summary = (f"{len(report.arrays)} arrays ({human_bytes(report.nbytes)}), "
               f"{len(report.values)} values")
    if not args.dry_run:
        print(f"converted {report.src} ({report.src_format}) -> {report.dst} "
              f"({report.dst_format}): {summary} in {report.seconds:.2f} s")
    else:
        print(f"total: {summary}")
    return 0
