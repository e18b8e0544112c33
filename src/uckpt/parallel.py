"""A parallel map on plain threads.

Not ``concurrent.futures``: its executors refuse new work once the interpreter
starts shutting down, and uckpt must be able to finish a background save then
(a normal exit waits for in-flight saves).
"""
from __future__ import annotations

import threading
from typing import Callable, List, Sequence, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def parallel_map(fn: Callable[[T], R], items: Sequence[T], threads: int, name: str = "uckpt") -> List[R]:
    """``[fn(x) for x in items]`` on up to ``threads`` threads; re-raises the first error."""
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
            except BaseException as e:  # noqa: B902 - re-raised in the caller
                with lock:
                    errors.append(e)
                return

    workers = [threading.Thread(target=worker, name=f"{name}-{k}", daemon=True) for k in range(n)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if errors:
        raise errors[0]
    return results
