"""MPICH's shared-memory segments (``/dev/shm/mpich_shm_*``) that a killed job left.

MPICH creates one segment per node when a job starts and unlinks it in
``MPI_Finalize``; a job whose ranks are SIGKILLed (the crash and node-kill tests)
never finalizes, so its segment stays in ``/dev/shm`` (a few MB each, dozens per full
run). :func:`remove_orphans` removes those that appeared since a snapshot taken by
:func:`segments` and that no live process holds: neither mapped (``/proc/PID/maps``)
nor open (``/proc/PID/fd``). A segment of a job still running (another pytest-xdist
worker's) is always held, from its creation (the creator's open descriptor) to its
unlink, so it is never touched.
"""
from __future__ import annotations

import glob
import logging
import os
from typing import Iterable, Set

log = logging.getLogger("tests.mpich_segments")

PATTERN = "/dev/shm/mpich_shm_*"


def segments() -> Set[str]:
    """The MPICH segments in /dev/shm now."""
    return set(glob.glob(PATTERN))


def held(paths: Iterable[str]) -> Set[str]:
    """Those of ``paths`` that a live process maps or has open."""
    wanted, found = set(paths), set()
    for pid in os.listdir("/proc"):
        if found == wanted:
            break
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps") as f:
                found.update(p for p in wanted if p in f.read())
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target in wanted:
                    found.add(target)
        except OSError:  # the process ended meanwhile, or is not ours to read
            continue
    return found


def remove_orphans(before: Set[str]) -> Set[str]:
    """Remove the segments that are new since ``before`` (:func:`segments`) and that no
    live process holds; return them."""
    new = segments() - before
    if not new:
        return set()
    orphans = new - held(new)
    for path in orphans:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    if orphans:
        log.info("removed %d MPICH segment(s) of killed jobs: %s", len(orphans), sorted(orphans))
    return orphans
