"""How much memory a read may allocate: the limit ``uckpt.load`` checks before allocating.

A load allocates the arrays its manifest declares. Before it does, the declared total is
compared with ``max_bytes`` when the caller gives one, else with :func:`available_bytes`:
the least of

* ``RLIMIT_AS`` (``ulimit -v``) less the process's address space now (``VmSize``),
* the cgroup's limit less its usage (v2: ``memory.max`` - ``memory.current``; v1:
  ``memory.limit_in_bytes`` - ``memory.usage_in_bytes``), and
* ``MemAvailable`` of ``/proc/meminfo`` (what the kernel says can be allocated without
  swapping).

Where none of them can be read (not Linux), there is no default limit. :func:`mapped`
turns a ``MemoryError`` raised while reading into a
:class:`~uckpt.errors.MemoryLimitError` (a UckptError and a MemoryError).
"""
from __future__ import annotations

import contextlib
import logging
import os
import resource
from typing import Callable, Iterator, Optional

from ..errors import MemoryLimitError, UckptError

log = logging.getLogger("uckpt.runtime.memory")

_MAX_HINT = ("pass max_bytes= a larger number of bytes to allow it (e.g. uckpt.load(path, "
             "max_bytes=N), CheckpointManager.restore(state, max_bytes=N)), load into existing "
             "arrays (state=...; that allocates nothing new), or free memory")


def _read_int(path: str) -> Optional[int]:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _proc_field(path: str, field: str) -> Optional[int]:
    """A ``kB`` field of a /proc file (``VmSize`` of status, ``MemAvailable`` of meminfo),
    in bytes."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _address_space_left() -> Optional[int]:
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    used = _proc_field("/proc/self/status", "VmSize")
    return max(0, soft - used) if used is not None else None


def _cgroup_left() -> Optional[int]:
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2
            files, root = ("memory.max", "memory.current"), "/sys/fs/cgroup"
        elif "memory" in controllers.split(","):  # v1
            files, root = ("memory.limit_in_bytes", "memory.usage_in_bytes"), \
                "/sys/fs/cgroup/memory"
        else:
            continue
        for d in (root + path, root):  # (in a cgroup namespace the path is not mounted)
            limit, usage = (_read_int(os.path.join(d, name)) for name in files)
            if limit is not None and usage is not None and limit < 1 << 60:
                return max(0, limit - usage)
    return None


def available_bytes() -> Optional[int]:
    """The bytes this process may still allocate (see the module docstring), or None where
    no limit can be read."""
    known = [n for n in (_address_space_left(), _cgroup_left(),
                         _proc_field("/proc/meminfo", "MemAvailable")) if n is not None]
    return min(known) if known else None


#: without ``max_bytes``, allocations up to this size are not checked (reading the limits
#: takes longer than a small load); one that fails is still a MemoryLimitError (:func:`mapped`)
UNCHECKED_BYTES = 64 << 20


def check(need: int, max_bytes: Optional[int], what: str, where: str, leaf=None) -> None:
    """Refuse (MemoryLimitError) allocating ``need`` bytes of new arrays (``what``: their
    paths) read from ``where``: more than ``max_bytes``, or, when it is None, than
    :func:`available_bytes` (for more than ``UNCHECKED_BYTES``)."""
    if max_bytes is None and need <= UNCHECKED_BYTES:
        return
    limit = max_bytes if max_bytes is not None else available_bytes()
    if limit is None or need <= limit:
        return
    source = "max_bytes" if max_bytes is not None else "the memory available to this process"
    raise MemoryLimitError(f"{where}: the manifest declares {need} bytes of new arrays "
                           f"({what}), more than {source} ({limit} bytes); refused before "
                           "allocating", path=where,
                           leaf=leaf, need=need, limit=limit, hint=_MAX_HINT)


#: the most resident memory parsing a manifest takes: this many bytes per byte of it, plus
#: the two below per JSON container ('[' or '{' byte) and per '"' byte in it (each a Python
#: object however short its text; the bytes counted in strings too, so never less). Measured
#: on every kind of manifest (tables, grids, chunk lists, metadata of empty or nested lists,
#: short strings, small objects), each bound at least 20% above the most seen: see
#: docs/benchmarks.md
PARSE_PER_BYTE = 6
PARSE_PER_CONTAINER = 150
PARSE_PER_QUOTE = 40


def parse_bytes(data: bytes) -> int:
    """The most memory parsing manifest ``data`` may take (see ``PARSE_PER_BYTE``)."""
    return (PARSE_PER_BYTE * len(data) + PARSE_PER_QUOTE * data.count(b'"') +
            PARSE_PER_CONTAINER * (data.count(b"[") + data.count(b"{")))


def check_manifest(data: bytes, where: str) -> None:
    """Refuse (MemoryLimitError) parsing manifest ``data`` at ``where`` when it may need
    (:func:`parse_bytes`) more than the memory available (for manifests that may need
    more than ``UNCHECKED_BYTES``): a process under a cgroup limit would be killed, not
    given a MemoryError."""
    if (PARSE_PER_BYTE + PARSE_PER_CONTAINER) * len(data) <= UNCHECKED_BYTES:
        return
    _refuse_above(lambda: parse_bytes(data), where,
                  f"parsing this manifest of {len(data)} bytes", "parsing")


def _refuse_above(estimate: Callable[[], int], where: str, what: str, verb: str) -> None:
    """Raise MemoryLimitError when ``estimate()`` bytes (for ``what``; not counted where
    no limit can be read) are more than :func:`available_bytes`."""
    limit = available_bytes()
    need = estimate() if limit is not None else 0
    if limit is not None and need > limit:
        raise MemoryLimitError(
            f"{where}: {what} may take up to {need} bytes, more than the memory available "
            f"to this process ({limit} bytes); refused before {verb}", path=where, need=need,
            limit=limit, hint="read it in a process allowed more memory (ulimit -v, the "
                              "cgroup's memory.max, free memory)")


#: the most memory decoding a 1.0 chunk table takes beyond the parsed JSON (its columns,
#: their checks, the rows grouped by array, an array entry for an array of one row): this
#: many bytes per row, plus this many per value of the rows' boxes (2 per dimension). Its
#: layout is deflated, so this is counted from the table's row count and its arrays'
#: dimensions, not from its bytes; at least 20% above the most measured: see
#: docs/benchmarks.md
TABLE_PER_ROW = 210
TABLE_PER_BOX_VALUE = 40


def table_bytes(rows: int, box_values: int) -> int:
    """The most memory decoding a chunk table of ``rows`` rows and ``box_values`` box
    values may take (see ``TABLE_PER_ROW``)."""
    return TABLE_PER_ROW * rows + TABLE_PER_BOX_VALUE * box_values


def check_table(rows: int, box_values: int, where: str, member: str) -> None:
    """Refuse (MemoryLimitError) decoding chunk table ``member`` of ``where`` when it may
    need (:func:`table_bytes`) more than the memory available (for tables that may need
    more than ``UNCHECKED_BYTES``); called before its columns are inflated."""
    need = table_bytes(rows, box_values)
    if need <= UNCHECKED_BYTES:
        return
    _refuse_above(lambda: need, where, f"{member}: decoding this chunk table of {rows} rows",
                  "decoding")


@contextlib.contextmanager
def mapped(what: str, where: str) -> Iterator[None]:
    """Raise a MemoryError of the block as a MemoryLimitError naming ``what`` and ``where``."""
    try:
        yield
    except MemoryError as e:
        if isinstance(e, UckptError):
            raise
        log.warning("out of memory while %s %s", what, where)
        raise MemoryLimitError(f"{where}: out of memory while {what}", path=where,
                               hint=_MAX_HINT) from None
