"""Keep Python's cyclic garbage collector from running in the middle of a save or a load.

A load parses the manifest into a few thousand dicts and lists, matches them against the
live objects and builds its read plan: containers that all die when the call returns.
CPython counts every container allocated and, past its thresholds, collects: in a
training process holding a few hundred thousand tracked objects, the occasional full
collection that such a burst sets off can take several times as long as the load itself
(docs/benchmarks.md, "Latency tails: the garbage-collector pause"). The same goes for the
part of a save that blocks training (the snapshot). Paused, the burst's containers are
freed by reference counting before the collector could count them, so no collection is
owed afterwards either.

:func:`paused` disables the collector for the length of a uckpt call on the caller's
thread and enables it again at the end, unless it was already disabled when the
outermost such call began (calls nest, in one thread or several). It never runs on
uckpt's background threads, whose saves can last long. Set
``UCKPT_PAUSE_GC=0`` (:data:`uckpt.knobs.pause_gc`) to leave the collector alone; a
``gc.disable()`` made by another thread while a uckpt call runs is undone when it ends.
"""
from __future__ import annotations

import functools
import gc
import threading
from contextlib import contextmanager
from typing import Callable, Iterator, TypeVar

from .. import knobs

F = TypeVar("F", bound=Callable)

_lock = threading.Lock()
_depth = 0  # uckpt calls running with the collector paused
_resume = False  # whether the outermost of them found the collector enabled


@contextmanager
def paused() -> Iterator[None]:
    """The collector disabled for the ``with`` block (see the module docstring)."""
    global _depth, _resume
    if not knobs.pause_gc:
        yield
        return
    with _lock:
        if _depth == 0:
            _resume = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _resume:
                gc.enable()


def pausing(fn: F) -> F:
    """``fn`` run with the collector :func:`paused`."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        with paused():
            return fn(*args, **kwargs)
    return call  # type: ignore[return-value]
