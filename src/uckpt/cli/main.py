"""The ``uckpt`` command: argument parsing and dispatch to one module per subcommand.

Exit status: 0 success, 1 failure (a uckpt error or an I/O error, reported as
``uckpt: error: <message>`` on stderr, without a traceback), 2 usage error.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

from .._version import __version__
from ..errors import UckptError
from . import advise, convert, diff, inspect, ls, verify
from .common import PROG, escape_unencodable, print_error

COMMANDS = (ls, inspect, verify, convert, diff, advise)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Inspect, check, convert and compare checkpoints.",
        epilog='Run "uckpt COMMAND --help" for the options of a command.')
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    escape_unencodable()
    args = build_parser().parse_args(argv)  # exits 2 on a usage error, 0 on --help
    try:
        return args.run(args)
    except (UckptError, OSError) as e:
        if isinstance(e, BrokenPipeError):  # e.g. `uckpt ls ROOT | head`
            _silence_stdout()
            return 1
        print_error(e)
        return 1
    except KeyboardInterrupt:
        return 130


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
