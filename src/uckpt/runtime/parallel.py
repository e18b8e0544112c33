"""A parallel map on plain threads.

Not ``concurrent.futures``: its executors refuse new work once the interpreter
starts shutting down, and uckpt must be able to finish a background save then
(a normal exit waits for in-flight saves).
"""
from __future__ import annotations

import itertools
import threading
from typing import Callable, Iterator, List, Optional, Sequence, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def parallel_map(fn: Callable[[T], R], items: Sequence[T], threads: int,
                 name: str = "uckpt") -> List[R]:
    """``[fn(x) for x in items]`` on up to ``threads`` threads, the caller's one of them
    (so a short map starts one thread fewer); re-raises the first error. A thread that
    cannot be started (no address space left for its stack) is done without: the items
    are shared by those that run."""
    n = min(threads, len(items))
    if n <= 1:
        return [fn(x) for x in items]
    results: List = [None] * len(items)
    errors: List[BaseException] = []
    lock = threading.Lock()
    next_index = [0]

    def worker() -> None:
        while True:
            with lock:
                i = next_index[0]
                if i >= len(items) or errors:
                    return
                next_index[0] += 1
            try:
                results[i] = fn(items[i])
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller
                with lock:
                    errors.append(e)
                return

    workers = []
    for k in range(1, n):
        w = threading.Thread(target=worker, name=f"{name}-{k}", daemon=True)
        try:
            w.start()
        except RuntimeError:  # "can't start new thread"
            break
        workers.append(w)
    try:
        worker()
    finally:
        for w in workers:
            w.join()
    if errors:
        raise errors[0]
    return results


def ordered_map(fn: Callable[[T], R], items: Sequence[T], threads: int, window: int,
                name: str = "uckpt", sizes: Optional[Sequence[int]] = None,
                ahead_bytes: int = 0) -> Iterator[R]:
    """``fn(x) for x in items``, lazily and in order, computed on up to ``threads``
    threads at most ``window`` items ahead of the consumer (so at most ``window``
    results are held at once), or further while the items started ahead of the
    consumer total at most ``ahead_bytes`` of ``sizes`` (one per item: small items
    go far ahead, large ones ``window`` at most); re-raises the first error. Stopping
    early (an error in the consumer) lets running calls finish and starts no new one."""
    n = min(threads, len(items))
    if n <= 1:
        for x in items:
            yield fn(x)
        return
    ends = list(itertools.accumulate(sizes, initial=0)) if sizes is not None else None
    cond = threading.Condition()
    state = {"next": 0, "consumed": 0, "stop": False}
    results: dict = {}
    errors: List[BaseException] = []

    def may_start(i: int) -> bool:
        first = state["consumed"]
        return i < first + window or (ends is not None and ends[i + 1] - ends[first] <= ahead_bytes)

    def worker() -> None:
        while True:
            with cond:
                while (state["next"] < len(items) and not state["stop"] and not errors
                       and not may_start(state["next"])):
                    cond.wait()
                if state["next"] >= len(items) or state["stop"] or errors:
                    return
                i = state["next"]
                state["next"] += 1
            try:
                value = fn(items[i])
            except BaseException as e:  # noqa: BLE001 - re-raised in the consumer
                with cond:
                    errors.append(e)
                    cond.notify_all()
                return
            with cond:
                results[i] = value
                cond.notify_all()

    workers = [threading.Thread(target=worker, name=f"{name}-{k}", daemon=True) for k in range(n)]
    for w in workers:
        w.start()
    try:
        for i in range(len(items)):
            with cond:
                while i not in results and not errors:
                    cond.wait()
                if i not in results:
                    raise errors[0]
                value = results.pop(i)
                state["consumed"] = i + 1
                cond.notify_all()
            yield value
    finally:
        with cond:
            state["stop"] = True
            cond.notify_all()
        for w in workers:
            w.join()
