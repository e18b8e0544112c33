"""``uckpt diff A B``: compare two checkpoints of any supported formats, leaf by leaf."""
from __future__ import annotations

import argparse
import textwrap

from ..conversion import detect
from ..errors import UckptError
from .common import print_error, print_json
from .convert import add_limit_options, limits_of

HELP = "compare two checkpoints (any supported formats) leaf by leaf"
DESCRIPTION = textwrap.fill(
    "Compare the checkpoints A and B, which may be of different formats "
    f"({', '.join(detect.FORMATS)}; detected from their content, or named with --format-a "
    "/ --format-b). Lists the entries only in A or only in B, the arrays whose dtype or "
    "shape differ, the arrays whose values differ (with the largest absolute difference "
    "and how many elements differ) and the plain values that differ. Arrays equal bit for "
    "bit are not listed. Arrays are compared one pair at a time, block by block: arrays of "
    "uckpt checkpoints stream (memory bounded by a constant, whatever sizes their "
    "manifests declare), others are read whole.", 79) + """

Exit status (as diff(1)): 0 identical, 1 different, 2 trouble (an unreadable
checkpoint, a usage error)."""


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("diff", help=HELP, description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("a", metavar="A", help="a checkpoint (file or directory)")
    p.add_argument("b", metavar="B", help="another checkpoint")
    choices = sorted(detect.FORMATS + tuple(detect.ALIASES))
    p.add_argument("--format-a", metavar="FORMAT", choices=choices,
                   help="format of A (default: detected)")
    p.add_argument("--format-b", metavar="FORMAT", choices=choices,
                   help="format of B (default: detected)")
    p.add_argument("--json", action="store_true", help="print a JSON document")
    add_limit_options(p)
    p.set_defaults(run=run)
    return p


def run(args) -> int:
    from ..conversion.diff import diff

    try:
        report = diff(args.a, args.b, a_format=args.format_a, b_format=args.format_b,
                      limits=limits_of(args))
    except (UckptError, OSError) as e:
        print_error(e)
        return 2
    if args.json:
        print_json(report.to_json())
    else:
        for d in report.differences:
            print(d.text())
        if report.identical:
            print(f"identical: {report.compared} entries compared")
        else:
            print(f"{len(report.differences)} difference(s); {report.compared} entries in both")
    return 0 if report.identical else 1
