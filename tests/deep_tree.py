"""A directory chain deeper than Python's recursion limit, removed bottom up afterwards
(pytest's own clean-up of tmp_path, ``shutil.rmtree``, recurses and would fail on it,
in this session and in every later one that prunes old temporary roots)."""
from __future__ import annotations

import contextlib
import os
from typing import Iterator


@contextlib.contextmanager
def deep_directory(top: str, depth: int, name: str = "d") -> Iterator[str]:
    """Make ``top/name/name/...`` ``depth`` levels deep; yield the deepest directory;
    on exit remove the chain and the files in its deepest directory."""
    deep = top
    try:
        for _ in range(depth):
            deep = os.path.join(deep, name)
            os.mkdir(deep)
        yield deep
    finally:
        if os.path.isdir(deep):
            for entry in os.listdir(deep):
                os.unlink(os.path.join(deep, entry))
        while deep != top:
            if os.path.isdir(deep):
                os.rmdir(deep)
            deep = os.path.dirname(deep)
