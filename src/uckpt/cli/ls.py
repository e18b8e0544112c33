"""``uckpt ls ROOT``: the checkpoints under a root (or one checkpoint), with their status."""
from __future__ import annotations

import argparse
from typing import Any, Callable, Dict, List, Tuple

from .common import first_line, human_bytes, human_time, print_json, table
from .scan import Found, scan

HELP = "list the checkpoints under a directory"
DESCRIPTION = """\
List the checkpoints under ROOT (a CheckpointManager root, or any directory
holding checkpoint directories), or ROOT itself if it is a checkpoint.

Status: "committed" (the manifest is valid and every data file is present),
"damaged" (the manifest is missing or invalid, or a data file is missing or
short), "incomplete" (the temporary directory of a save in progress or
interrupted), "stale" (left by an interrupted delete or overwrite).
Only manifests are read, and nothing is changed; run "uckpt verify" to check
the data itself."""

# (header, right-aligned, cell). A "tiers" column (multi-level storage) goes here.
COLUMNS: List[Tuple[str, bool, Callable[[Found], Any]]] = [
    ("STEP", True, lambda f: "-" if f.step is None else f.step),
    ("STATUS", False, lambda f: f.status),
    ("SIZE", True, lambda f: human_bytes(f.size)),
    ("LEAVES", True, lambda f: len(f.manifest.arrays) if f.manifest else "-"),
    ("CREATED", False, lambda f: human_time(f.manifest.created) if f.manifest else "-"),
    ("NAME", False, lambda f: f.name),
    ("NOTE", False, lambda f: first_line(f.reason, 72)),
]


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("ls", help=HELP, description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("root", metavar="ROOT", help="a root directory of checkpoints, or one checkpoint")
    p.add_argument("--json", action="store_true", help="print a JSON document instead of a table")
    p.set_defaults(run=run)
    return p


def to_json(f: Found) -> Dict[str, Any]:
    m = f.manifest
    return {
        "path": str(f.path.absolute()),
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
    found = scan(args.root)
    if args.json:
        print_json({"root": args.root, "checkpoints": [to_json(f) for f in found]})
        return 0
    if not found:
        print(f"no checkpoints under {args.root}")
        return 0
    columns = [c for c in COLUMNS if c[0] != "NOTE" or any(f.reason for f in found)]
    rows = [[cell(f) for _, _, cell in columns] for f in found]
    print(table([c[0] for c in columns], rows,
                right=[i for i, c in enumerate(columns) if c[1]]))
    return 0
