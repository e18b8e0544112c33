"""``uckpt convert SRC DST``: move a checkpoint between NPZ, Pickle (torch.save), HDF5,
safetensors and uckpt (and from PyTorch DCP), bit for bit, without running foreign code."""
from __future__ import annotations

import argparse
import sys
import warnings

from ..conversion import detect
from ..conversion.errors import ConvertWarning
from ..conversion.options import OptionError
from .common import human_bytes, print_json, shape_str, table
from .storage_args import add_storage_arguments, storage_options

HELP = ("convert a checkpoint between NPZ, Pickle, HDF5, safetensors, .keras, Hugging Face, "
        "TensorFlow checkpoints, DeepSpeed ZeRO and uckpt")
DESCRIPTION = """\
Convert the checkpoint SRC to DST. Formats: npz (np.savez, Chainer save_npz and
trainer snapshots), pickle (torch.save files), hdf5 (Keras .weights.h5 and
legacy .h5, any h5py tree), safetensors, keras (.keras archives), hf (Hugging
Face save_pretrained and Trainer checkpoint-N directories, sharded weights and
their *.index.json), tf (TensorFlow checkpoints: tf.train.Checkpoint,
CheckpointManager, tf_keras save_weights; named by their prefix, their .index file,
or a directory with a 'checkpoint' file for its latest; needs TensorFlow), deepspeed
(ZeRO checkpoints, stages 1-3: the root with latest or a global_stepN directory;
--ranks W partitions DST for W ranks), orbax (Orbax checkpoints, OCDBT or not, and
CheckpointManager directories: their latest step; needs orbax-checkpoint; written
with --to orbax), uckpt
(checkpoint directories) and, as a source only, dcp (PyTorch Distributed
Checkpoint directories).

SRC's format is detected from its content and DST's from its name (.npz, .pt,
.pth, .bin, .pkl, .h5, .hdf5, .safetensors, .keras, .index (a TensorFlow
checkpoint's prefix; or --to tf with the prefix); a name without an
extension, an existing directory or a name ending in / is a uckpt directory;
any other extension is an error); --from and --to override them.
--max-shard-size writes a Hugging Face directory of shards and an index.
--select (glob patterns of leaf paths, or one node path), --strip-prefix and
--add-prefix convert a part of SRC under new names; --cast PATTERN=DTYPE
converts the leaves it matches to DTYPE (as uckpt.load's cast=).

Arrays are copied bit for bit with
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

DST is written under a temporary name and renamed into place (a uckpt DST may
also be an s3://bucket/prefix URL: written as a save writes, its manifest
last): a failure or Ctrl-C leaves no partial output. An existing DST is replaced only with --force.
Memory stays about the largest array. A progress bar is drawn on standard
error for large inputs when it is a terminal (not with --quiet).

Exit status: 0 converted (or listed, with --dry-run), 1 error, 2 usage error,
130 interrupted (Ctrl-C; nothing is left behind)."""


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("convert", help=HELP, description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", metavar="SRC", help="the checkpoint to read (a file or directory)")
    p.add_argument("dst", metavar="DST", help="where to write the converted checkpoint (a "
                                              "uckpt one may be an s3://bucket/prefix URL)")
    p.add_argument("--from", dest="src_format", metavar="FORMAT",
                   choices=sorted(detect.FORMATS + tuple(detect.ALIASES)),
                   help="format of SRC: npz, pickle, hdf5, safetensors, keras, hf, tf, orbax, "
                        "uckpt, dcp (default: detected from its content)")
    p.add_argument("--to", dest="dst_format", metavar="FORMAT",
                   choices=sorted(detect.TARGETS + tuple(detect.ALIASES)),
                   help="format of DST: npz, pickle, hdf5, safetensors, keras, hf, tf, orbax, "
                        "uckpt (default: from its name)")
    p.add_argument("--select", metavar="PATTERN", action="append",
                   help="convert only the leaves whose paths match this glob (* matches "
                        "across /; repeat for more); one PATH without wildcards converts "
                        "the node there as the root (e.g. model; see `uckpt inspect`)")
    p.add_argument("--cast", metavar="PATTERN=DTYPE", action="append",
                   help="convert the leaves whose paths match the glob PATTERN to DTYPE "
                        "(e.g. 'model/*=bfloat16'; the first match decides; repeat for "
                        "more), as uckpt.load's cast=; a rule (safe, same_kind) alone "
                        "keeps every dtype: nothing is narrowed unless its dtype is named")
    p.add_argument("--strip-prefix", metavar="P",
                   help="remove P from the keys of the (selected) root that start with it")
    p.add_argument("--add-prefix", metavar="P",
                   help="put P before every key of the (selected) root; a P ending in / "
                        "nests the root under that path instead (model/: predictor/W -> "
                        "model/predictor/W)")
    p.add_argument("--compress", action="store_true",
                   help="compress DST: npz deflate (as savez_compressed, Chainer's default), "
                        "hdf5 and keras gzip, uckpt zstd")
    p.add_argument("--codec", metavar="CODEC",
                   help="the codec of --compress: lzf for hdf5 and keras, zstd or zstd+bytegroup "
                        "for uckpt (default: the target's first)")
    p.add_argument("--max-shard-size", metavar="SIZE",
                   help="cut Hugging Face weights into shards of at most SIZE (5GB, 500MB, "
                        "200MiB, bytes) with an index; DST is then a directory")
    p.add_argument("--hf-weights", choices=("safetensors", "pickle"), default="safetensors",
                   help="weight files of a Hugging Face DST: model*.safetensors (default) or "
                        "pytorch_model*.bin (pickle)")
    p.add_argument("--ranks", type=int, metavar="W",
                   help="the data-parallel ranks a DeepSpeed ZeRO DST (--to deepspeed) is "
                        "partitioned for (default: the source's)")
    p.add_argument("-f", "--force", action="store_true", help="replace DST if it exists")
    p.add_argument("-n", "--dry-run", action="store_true",
                   help="list what would be converted; write nothing")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    add_limit_options(p)
    add_storage_arguments(p)
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
                   help="most bytes made per byte stored by a compressed HDF5 dataset, a "
                        "tensor whose strides repeat elements, a deflated zip member (1032 at "
                        "most), or a uckpt source's largest array per byte of its data files "
                        "(default 1032; env UCKPT_CONVERT_MAX_RATIO)")


def limits_of(args):
    from ..conversion.limits import Limits

    return Limits(max_nodes=args.max_nodes, max_ratio=args.max_ratio)


def _codec(args):
    if args.codec and not args.compress:
        raise OptionError("--codec names the codec of --compress; add --compress")
    return (args.codec or "default") if args.compress else None


def cast_of(items):
    """``--cast`` values as ``cast=`` takes them: ``PATTERN=DTYPE`` entries in order (a
    bare rule, ``same_kind``, is the pattern ``*``); one bare rule alone is that rule."""
    if not items:
        return None
    if len(items) == 1 and "=" not in items[0]:
        return items[0]
    out = {}
    for item in items:
        pattern, _, value = item.rpartition("=") if "=" in item else ("*", "", item)
        if not pattern or not value:
            raise OptionError(f"--cast {item!r} is not PATTERN=DTYPE",
                              hint="write e.g. --cast 'model/*=bfloat16' or --cast safe")
        out.setdefault(pattern, value)
    return out


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
                             select=args.select, cast=cast_of(args.cast),
                             strip_prefix=args.strip_prefix,
                             add_prefix=args.add_prefix, compress=_codec(args),
                             max_shard_size=args.max_shard_size, hf_weights=args.hf_weights,
                             ranks=args.ranks,
                             storage_options=storage_options(args))
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
