"""Formatting shared by the commands: sizes, times, tables, JSON and error messages."""
from __future__ import annotations

import datetime as _dt
import json
import os
import sys
from typing import Any, Iterable, List, Optional, Sequence, TextIO

from ..errors import UckptError

PROG = "uckpt"
_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def human_bytes(n: Optional[int]) -> str:
    """``1536`` -> ``"1.5 KiB"``; ``None`` -> ``"-"``."""
    if n is None:
        return "-"
    value = float(n)
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def human_time(created: Optional[str]) -> str:
    """A manifest's ISO-8601 UTC ``created`` stamp, to the second: ``2024-05-01 12:00:00Z``."""
    if not created:
        return "-"
    try:
        t = _dt.datetime.strptime(created, "%Y-%m-%dT%H:%M:%S.%fZ")
    except ValueError:
        return created
    return t.strftime("%Y-%m-%d %H:%M:%SZ")


def bytes_text(n: int) -> str:
    """Exact and readable: ``"126 bytes"``, ``"1048576 bytes (1.0 MiB)"``."""
    return f"{n} bytes" if n < 1024 else f"{n} bytes ({human_bytes(n)})"


def shape_str(shape: Sequence[int]) -> str:
    """NumPy's spelling: ``(3, 4)``, ``(5,)``, ``()``."""
    return str(tuple(shape))


def first_line(text: str, limit: int = 0) -> str:
    line = text.splitlines()[0] if text else ""
    if limit and len(line) > limit:
        line = line[:limit - 3] + "..."
    return line


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]],
          right: Iterable[int] = ()) -> str:
    """Columns separated by two spaces; columns numbered in ``right`` are right-aligned."""
    right = set(right)
    cells: List[List[str]] = [list(map(str, headers))] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for r in cells:
        parts = [c.rjust(w) if i in right else c.ljust(w)
                 for i, (c, w) in enumerate(zip(r, widths))]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def escape_unencodable() -> None:
    """Make stdout and stderr write what their encoding cannot represent (a name with
    undecodable bytes, a non-ASCII value on an ASCII terminal) as backslash escapes
    instead of failing with UnicodeEncodeError."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):  # not a text stream that can
            pass


def print_json(doc: Any, out: Optional[TextIO] = None) -> None:
    """``doc`` as indented JSON; non-ASCII text as is when ``out`` can encode it, otherwise
    as JSON escapes (``\\u00e9``), so the output is always valid JSON."""
    out = out or sys.stdout
    text = json.dumps(doc, indent=2, ensure_ascii=False, allow_nan=False)
    if not text.isascii():
        try:
            text.encode(getattr(out, "encoding", None) or "utf-8")
        except (UnicodeEncodeError, LookupError):
            text = json.dumps(doc, indent=2, ensure_ascii=True, allow_nan=False)
    out.write(text + "\n")


def error_message(exc: BaseException) -> str:
    """The text after ``uckpt: error:``; uckpt errors already say where and how to fix."""
    if isinstance(exc, UckptError):
        return str(exc)
    if isinstance(exc, OSError) and exc.strerror:
        where = exc.filename if exc.filename is not None else ""
        return f"{exc.strerror}: {os.fsdecode(where)}" if where != "" else exc.strerror
    return str(exc) or type(exc).__name__


def print_error(exc_or_text, err: Optional[TextIO] = None) -> None:
    err = err or sys.stderr
    text = exc_or_text if isinstance(exc_or_text, str) else error_message(exc_or_text)
    err.write(f"{PROG}: error: {text}\n")
    err.flush()
