"""``uckpt ls ROOT [ROOT ...]``: the checkpoints under a root (or one checkpoint), with their
status; with several roots (storage tiers), one row per step saying which tiers hold it."""
from __future__ import annotations

import argparse
from typing import Any, Callable, Dict, List, Sequence, Tuple

from ..errors import CheckpointNotFoundError
from ..storage import open_store
from .common import first_line, human_bytes, human_time, print_json, table
from .scan import Found, scan
from .storage_args import add_storage_arguments, options_for, storage_options
from .tiers import Row, Tier, default_labels, scan_tiers

HELP = "list the checkpoints under a directory (or several storage tiers)"
DESCRIPTION = """\
List the checkpoints under ROOT (a CheckpointManager root, or any directory
holding checkpoint directories; or an s3://bucket/prefix URL of an object store),
or ROOT itself if it is a checkpoint.

Status: "committed" (the manifest is valid and every data file is present),
"damaged" (the manifest is missing or invalid, or a data file is missing,
short or longer than recorded, or one of them is not a regular file; also a symlink named like a
checkpoint, which is not followed), "incomplete" (the temporary directory of a save or copy
in progress or interrupted; in an object store: the objects of a step_N prefix without a
manifest), "stale" (left by an interrupted delete or overwrite).
Only manifests are read, and nothing is changed; run "uckpt verify" to check
the data itself. Steps a CheckpointManager rollback took off the live line
are not listed: they are in ROOT/rollback_NNNN, a root of its own ("uckpt ls
ROOT/rollback_0001"); --archived lists every archive of ROOT (with --json:
{"root", "archives": {name: [checkpoint, ...]}}).

Storage tiers: given several ROOTs (e.g. a node-local /dev/shm/job and a
shared /lustre/job), each is a tier, labelled tier0, tier1, ... or by
--tier-names. The table starts with one line per tier (label, root and what it
holds), then has one row per step: TIERS lists the tiers holding a committed
copy ("-" if none), and STATUS is a single word when every tier holds the step
with that status, otherwise each status with its tiers ("committed on fast;
incomplete on durable"). A ROOT that does not exist is a missing tier, listed
as empty; it is an error only when every ROOT is missing. With --json:
{"tiers": [{tier, root, path, missing}], "steps": [{step, committed_on,
entries: [{tier, path, name, status, size, leaves, nbytes, created, reason}]}]}.

Exit status: 0 listed (whatever the statuses), 1 error, 2 usage error."""

# (header, right-aligned, cell): one root, one row per directory found.
COLUMNS: List[Tuple[str, bool, Callable[[Found], Any]]] = [
    ("STEP", True, lambda f: "-" if f.step is None else f.step),
    ("STATUS", False, lambda f: f.status),
    ("SIZE", True, lambda f: human_bytes(f.size)),
    ("LEAVES", True, lambda f: len(f.manifest.arrays) if f.manifest else "-"),
    ("CREATED", False, lambda f: human_time(f.manifest.created) if f.manifest else "-"),
    ("NAME", False, lambda f: f.name),
    ("NOTE", False, lambda f: first_line(f.reason, 72)),
]


# Several roots (tiers), one row per step; the cells of a Row and the labels of present tiers.
# SIZE, LEAVES and CREATED are those of a committed copy when there is one.
TIER_COLUMNS: List[Tuple[str, bool, Callable[[Row, Sequence[str]], Any]]] = [
    ("STEP", True, lambda r, _: "-" if r.step is None else r.step),
    ("TIERS", False, lambda r, _: ",".join(r.committed_on) or "-"),
    ("STATUS", False, lambda r, present: r.status(present)),
    ("SIZE", True, lambda r, _: human_bytes(r.best.size)),
    ("LEAVES", True, lambda r, _: len(r.best.manifest.arrays) if r.best.manifest else "-"),
    ("CREATED", False,
     lambda r, _: human_time(r.best.manifest.created) if r.best.manifest else "-"),
    ("NAME", False, lambda r, _: ",".join(dict.fromkeys(f.name for f in r.entries))),
    ("NOTE", False, lambda r, _: "; ".join(f"{f.tier}: {first_line(f.reason, 60)}"
                                         for f in r.entries if f.reason)),
]


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("ls", help=HELP, description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("roots", nargs="+", metavar="ROOT",
                   help="a root directory of checkpoints, or one checkpoint; "
                        "several: one storage tier each, fastest first")
    p.add_argument("--tier-names", metavar="NAMES", type=_names,
                   help="comma-separated labels of the tiers, one per ROOT "
                        "(e.g. fast,durable; default tier0,tier1,...); "
                        "lists even a single ROOT as a tier")
    p.add_argument("--json", action="store_true", help="print a JSON document instead of a table")
    p.add_argument("--archived", action="store_true",
                   help="list the steps CheckpointManager rollbacks took off the live line "
                        "(ROOT/rollback_NNNN), by archive, instead of the live line")
    add_storage_arguments(p)
    p.set_defaults(run=run, usage_error=p.error)
    return p


def _names(text: str) -> List[str]:
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"empty tier name in {text!r}")
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"a tier name is repeated in {text!r}")
    return names


def to_json(f: Found) -> Dict[str, Any]:
    m = f.manifest
    return {
        "path": f.where,
        "name": f.name,
        "step": f.step,
        "status": f.status,
        "size": f.size,
        "leaves": len(m.arrays) if m else None,
        "nbytes": m.nbytes if m else None,
        "created": m.created if m else None,
        "reason": f.reason or None,
    }


def run(args) -> int:
    if args.archived and (len(args.roots) > 1 or args.tier_names is not None):
        args.usage_error("--archived lists the archives of one ROOT; name each tier in turn")
    if len(args.roots) > 1 or args.tier_names is not None:
        return run_tiers(args)
    (root,) = args.roots
    if args.archived:
        return run_archived(root, args)
    found = scan(root, options_for(root, args))
    if args.json:
        print_json({"root": root, "checkpoints": [to_json(f) for f in found]})
        return 0
    print_found(root, found)
    return 0


def run_archived(root: str, args) -> int:
    store = open_store(root, options_for(root, args))
    if not store.exists():
        raise CheckpointNotFoundError(f"{root!r} is not a directory", path=root)
    archives = {name: scan(str(store.within(name).where), options_for(root, args))
                for name in store.archives()}
    if args.json:
        print_json({"root": root, "archives": {name: [to_json(f) for f in found]
                                               for name, found in archives.items()}})
        return 0
    if not archives:
        print(f"no archives of rolled-back steps under {root}")
    for name, found in archives.items():
        print(f"{name}:")
        print_found(store.within(name).where, found)
    return 0


def print_found(root, found: List[Found]) -> None:
    if not found:
        print(f"no checkpoints under {root}")
        return
    columns = [c for c in COLUMNS if c[0] != "NOTE" or any(f.reason for f in found)]
    rows = [[cell(f) for _, _, cell in columns] for f in found]
    print(table([c[0] for c in columns], rows,
                right=[i for i, c in enumerate(columns) if c[1]]))


def run_tiers(args) -> int:
    labels = args.tier_names or default_labels(len(args.roots))
    if len(labels) != len(args.roots):
        n = len(labels)
        args.usage_error(f"--tier-names gives {n} name{'s' * (n != 1)} "
                         f"for {len(args.roots)} roots")
    seen: Dict[Any, str] = {}
    for label, root in zip(labels, args.roots):
        key = open_store(root, options_for(root, args)).identity()
        if key in seen:
            args.usage_error(f"tiers {seen[key]} and {label} are the same directory: {root}")
        seen[key] = label
    tiers, rows = scan_tiers(args.roots, labels, storage_options(args))
    if args.json:
        print_json(tiers_json(tiers, rows))
        return 0
    for t in tiers:
        print(f"{t.label} ({t.root}): {t.summary()}")
    print()
    if not rows:
        print("no checkpoints in any tier")
        return 0
    present = [t.label for t in tiers if not t.missing]
    columns = [c for c in TIER_COLUMNS
               if c[0] != "NOTE" or any(f.reason for r in rows for f in r.entries)]
    print(table([c[0] for c in columns], [[cell(r, present) for _, _, cell in columns]
                                          for r in rows],
                right=[i for i, c in enumerate(columns) if c[1]]))
    return 0


def tiers_json(tiers: Sequence[Tier], rows: Sequence[Row]) -> Dict[str, Any]:
    return {
        "tiers": [{"tier": t.label, "root": t.root, "path": str(t.path), "missing": t.missing}
                  for t in tiers],
        "steps": [{"step": r.step, "committed_on": r.committed_on,
                   "entries": [{"tier": f.tier, **to_json(f)} for f in r.entries]}
                  for r in rows],
    }
