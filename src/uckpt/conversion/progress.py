"""Progress of a conversion in bytes of array data, and a bar on standard error."""
from __future__ import annotations

import os
import sys
import time
from typing import Callable, Optional, TextIO

#: inputs with at least this many bytes of arrays get a progress bar (on a terminal)
BAR_BYTES = int(os.environ.get("UCKPT_PROGRESS_BYTES", str(256 << 20)))


class Progress:
    """Counts bytes written and calls ``callback(done, total)`` as they grow."""

    def __init__(self, total: int, callback: Optional[Callable[[int, int], None]]) -> None:
        self.total, self.done, self.callback = total, 0, callback

    def advance(self, n: int) -> None:
        self.done += n
        if self.callback is not None:
            self.callback(self.done, self.total)


class Bar:
    """``converting  42% |#########           | 232.1 MiB / 553.0 MiB  1.2 s``, redrawn in
    place at most ten times a second, for totals of at least ``BAR_BYTES``; ``finish()``
    ends the line."""

    def __init__(self, label: str, out: Optional[TextIO] = None, width: int = 30) -> None:
        self.label, self.out, self.width = label, out or sys.stderr, width
        self.start = time.monotonic()
        self.last = 0.0
        self.shown = False

    def __call__(self, done: int, total: int) -> None:
        if total < BAR_BYTES:
            return
        now = time.monotonic()
        if now - self.last < 0.1 and done < total:
            return
        self.last = now
        frac = done / total if total else 1.0
        filled = int(frac * self.width)
        mib = 1 << 20
        self.out.write(f"\r{self.label} {frac * 100:3.0f}% |{'#' * filled}"
                       f"{' ' * (self.width - filled)}| {done / mib:.1f} MiB / "
                       f"{total / mib:.1f} MiB  {now - self.start:.1f} s")
        self.out.flush()
        self.shown = True

    def finish(self) -> None:
        if self.shown:
            self.out.write("\n")
            self.out.flush()


def wanted(quiet: bool, stream: Optional[TextIO] = None) -> bool:
    """A bar is drawn on a terminal, unless asked to be quiet."""
    stream = stream or sys.stderr
    try:
        return not quiet and stream.isatty()
    except (AttributeError, ValueError):
        return False
