"""Per-array chunk counts, stored bytes and codecs of a checkpoint, its manifest parts
read one at a time (``uckpt inspect``).

:func:`stored_sizes` takes a root manifest whose parts are pending (format 1.0,
docs/format.md section 7) and reads only the parts whose runs hold a selected array,
each checked (size, checksum, chunk table: :meth:`Manifest.check_part`), counted and
dropped before the next is read: it holds the root and one part at a time. The tiling of
an array across parts is not checked here (``uckpt verify`` checks it). A manifest read
whole (one without parts, or a pre-release version) is counted from its arrays' chunks.
"""
from __future__ import annotations

import logging
from typing import Any, Collection, Dict, List, NamedTuple, Optional

import numpy as np

from ..codecs import pipeline as codecs
from ..errors import UckptError
from ..format import ArrayEntry, Manifest
from ..format.cover import part_mask
from . import manifest_io

log = logging.getLogger("uckpt.loading.stored_sizes")


class Stored(NamedTuple):
    """An array's chunks as stored: how many, their bytes, their codec pipelines (the
    labels, sorted and joined by ``,``; ``-`` for none) and how many are in a base."""

    chunks: int
    stored: int
    codec: str
    referring: int


class Sizes(NamedTuple):
    """What :func:`stored_sizes` found: ``by_path`` (None for an array of a part that
    could not be read), the part files read, and the error of each part that failed."""

    by_path: Dict[str, Optional[Stored]]
    parts_read: List[str]
    errors: List[BaseException]


def of_entry(entry: ArrayEntry) -> Stored:
    """The :class:`Stored` of an array whose chunks are all at hand."""
    names = sorted({codecs.label(c.codec) for c in entry.chunks})
    return Stored(len(entry.chunks), sum(c.length for c in entry.chunks),
                  ",".join(names) or "-", sum(1 for c in entry.chunks if c.base))


def stored_sizes(source: Any, m: Manifest, paths: Optional[Collection[str]] = None) -> Sizes:
    """The :class:`Stored` of each array of ``m`` named in ``paths`` (None: all), reading
    from ``source`` only the pending parts that hold one of them, one at a time. A part
    that cannot be read (missing, damaged, of another save) is recorded in ``errors`` and
    its arrays get None; the other parts are still read."""
    wanted = list(m.arrays) if paths is None else [p for p in m.arrays if p in set(paths)]
    tables = m.rows_read()
    if not tables:  # (every chunk is at hand)
        return Sizes({p: of_entry(m.arrays[p]) for p in wanted}, [], [])
    index = {p: i for i, p in enumerate(m.arrays)}
    selected = np.zeros(len(index), bool)
    selected[[index[p] for p in wanted]] = True
    count = _Count(len(index), tables[0][1].codecs)
    for ai, table in tables:
        count.add(ai, table)
    unknown = np.zeros(len(index), bool)
    read: List[str] = []
    nbytes = 0
    errors: List[BaseException] = []
    for k in list(m.parts_pending):
        entry = m.parts[k]
        holds = part_mask(entry, len(index))
        if not (holds & selected).any():
            continue
        try:
            count.add(*m.check_part(k, manifest_io.part_bytes(source, entry)))
        except (UckptError, OSError) as e:
            errors.append(e)
            unknown |= holds
            continue
        read.append(entry.file)
        nbytes += entry.size
    log.info("read %d of %d manifest part(s) of %s (%d bytes) for %d array(s)%s", len(read),
             len(m.parts), source.where, nbytes, len(wanted),
             f"; {len(errors)} could not be read" if errors else "")
    return Sizes({p: None if unknown[index[p]] else count.stored(index[p]) for p in wanted},
                 read, errors)


class _Count:
    """Per-array totals over chunk tables, added one table at a time."""

    def __init__(self, narrays: int, pipelines: Any) -> None:
        self.pipelines = pipelines
        self.chunks = np.zeros(narrays, np.int64)
        self.bytes = np.zeros(narrays, np.int64)
        self.referring = np.zeros(narrays, np.int64)
        self.codecs = np.zeros((narrays, len(pipelines)), bool)

    def add(self, ai: np.ndarray, table: Any) -> None:
        n = len(self.chunks)
        ai = ai.astype(np.intp, copy=False)
        self.chunks += np.bincount(ai, minlength=n)
        np.add.at(self.bytes, ai, table.length.astype(np.int64))
        self.codecs[ai, table.codec.astype(np.intp)] = True
        in_base = np.array([b is not None for b in table.base_of], bool)
        if in_base.any():
            self.referring += np.bincount(ai[in_base[table.source]], minlength=n)

    def stored(self, i: int) -> Stored:
        names = sorted({codecs.label(self.pipelines[c])
                        for c in np.flatnonzero(self.codecs[i]).tolist()})
        return Stored(int(self.chunks[i]), int(self.bytes[i]), ",".join(names) or "-",
                      int(self.referring[i]))
