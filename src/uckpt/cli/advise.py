"""``uckpt advise ROOT --mtbf 6h``: the measured save costs of a root and the optimal
checkpoint interval for a mean time between failures (Young/Daly, :mod:`uckpt.manager.interval`)."""
from __future__ import annotations

import argparse

from ..manager.costs import COSTS_NAME, RECENT, read_costs, summarize
from ..errors import CheckpointNotFoundError, DurationError, StorageConfigError
from ..manager.interval import advise, format_duration, parse_duration
from ..storage import local_path
from .common import print_json

HELP = "advise a checkpoint interval from a root's measured save costs and an MTBF"
DESCRIPTION = f"""\
Print what saves into ROOT cost, as measured by the CheckpointManager that
wrote it (the medians of the newest {RECENT} saves recorded in ROOT/{COSTS_NAME}:
the stall, how long save() blocked training, and the time until a save was
committed and durable), and the optimal interval between saves for a mean time
between failures MTBF: Young's sqrt(2 C M) and Daly's higher-order form, with C
the stall. The advice is Daly's interval (never shorter than the time to
durable, or asynchronous saves would queue), with the expected fraction of time
lost to saves and to work redone after failures.

Durations: a number with a unit s, m, h or d ("90s", "30m", "6h", "2d") or a
number of seconds. --cost SECONDS replaces the measured stall (e.g. for a root
written before costs were recorded).

Exit status: 0 advised, 1 error (no measurements, no such root), 2 usage error."""


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except DurationError as e:
        raise argparse.ArgumentTypeError(str(e)) from None  # the hint on a line of its own


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("advise", help=HELP, description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("root", metavar="ROOT", help="a CheckpointManager root (local directory)")
    p.add_argument("--mtbf", type=_duration, required=True,
                   help="mean time between failures of the job, e.g. 6h")
    p.add_argument("--restart", type=_duration, default=None,
                   help="time to restart after a failure (adds to the expected loss)")
    p.add_argument("--cost", type=_duration, default=None,
                   help="use this stall per save instead of the measured one")
    p.add_argument("--json", action="store_true", help="print the numbers as JSON")
    p.set_defaults(run=run)
    return p


def run(args) -> int:
    root = local_path(args.root)
    if root is None:
        raise StorageConfigError(f"{args.root}: uckpt advise reads the save costs of a local "
                                 "root only (an object store tier holds none)",
                                 hint="give the local first tier the manager saved to")
    if not root.is_dir():
        raise CheckpointNotFoundError(f"{root}: no such directory", path=str(root))
    summary = summarize(read_costs(root))
    if summary is None and args.cost is None:
        raise CheckpointNotFoundError(
            f"{root}: no save costs recorded ({root / COSTS_NAME} does not exist or holds "
            "no measurement). A root written before uckpt recorded save costs, or by "
            "uckpt.save() rather than a CheckpointManager, has none.", path=str(root),
            hint="save a few checkpoints with uckpt.CheckpointManager(ROOT), or give "
                 "--cost SECONDS")
    if args.cost is not None:
        stall = args.cost
    else:
        assert summary is not None  # refused above
        stall = summary.stall
    durable = summary.durable if summary is not None else None
    advice = advise(stall, args.mtbf, durable, args.restart or 0.0)
    if args.json:
        print_json({"root": str(root), "saves_measured": summary.saves if summary else 0,
                    "async_saves": summary.async_saves if summary else 0,
                    "stall_s": summary.stall if summary else None,
                    "commit_s": summary.commit if summary else None,
                    "durable_s": durable, "cost_s": stall, "mtbf_s": advice.mtbf,
                    "restart_s": advice.restart, "young_s": advice.young,
                    "daly_s": advice.daly, "interval_s": advice.interval,
                    "overhead": advice.overhead})
        return 0
    if summary is not None:
        print(f"measured: {summary.saves} recent saves of {root} "
              f"({summary.async_saves} asynchronous), medians:")
        print(f"  stall (save blocks training)  {_seconds(summary.stall)}")
        print(f"  time to commit                {_seconds(summary.commit)}")
        print(f"  time to durable               {_seconds(summary.durable)}")
    if args.cost is not None:
        print(f"cost per save (--cost)          {_seconds(stall)}")
    print(f"MTBF {format_duration(advice.mtbf)}"
          + (f", restart {format_duration(advice.restart)}" if advice.restart else "") + ":")
    print(f"  Young  sqrt(2 C M)            {_seconds(advice.young)}")
    print(f"  Daly   (higher order)         {_seconds(advice.daly)}")
    note = " (raised to the time to durable)" if advice.interval > advice.daly else ""
    print(f"advice: save every {format_duration(advice.interval)} of training{note}; "
          f"expected loss {100 * advice.overhead:.2f}% of the run time "
          f"(saves and work redone after failures)")
    return 0


def _seconds(value) -> str:
    return "-" if value is None else f"{value:.3f} s ({format_duration(value)})"
