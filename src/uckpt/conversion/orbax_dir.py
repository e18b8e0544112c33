"""The files of an Orbax checkpoint, found and checked without Orbax.

An Orbax *item* is a directory holding ``_METADATA`` (JSON: ``tree_metadata``, one entry
per leaf with its pytree keys and value type, and ``use_ocdbt``). A source may be named
by the item itself (``StandardCheckpointer``/``PyTreeCheckpointer`` output), by a step of
a ``CheckpointManager`` directory (``ROOT/STEP``: its one item, ``default`` or another),
or by the manager's directory (``ROOT``: its latest step, the largest number).
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from ..errors import CheckpointNotFoundError, CorruptCheckpointError
from .errors import UnknownFormatError
from .fileio import open_regular

METADATA = "_METADATA"
CHECKPOINT_METADATA = "_CHECKPOINT_METADATA"
MAX_METADATA = 64 << 20  # a _METADATA larger than this is refused, never read
SEQUENCE, DICT = 1, 2  # Orbax's KeyType
_STEP = re.compile(r"\d+")


def _item_of(step: Path) -> Optional[Path]:
    """The item directory of one step (``step`` itself, or its one item subdirectory)."""
    if (step / METADATA).is_file():
        return step
    items = sorted(d for d in step.iterdir() if d.is_dir() and (d / METADATA).is_file())
    if len(items) == 1:
        return items[0]
    named = [d for d in items if d.name == "default"]
    return named[0] if named else None


def steps(root: Path) -> List[int]:
    """The committed steps of a CheckpointManager directory (names that are numbers; Orbax's
    temporary ``N.orbax-checkpoint-tmp-*`` directories are not)."""
    if not root.is_dir():
        return []
    return sorted(int(n) for n in os.listdir(root)
                  if _STEP.fullmatch(n) and (root / n).is_dir() and _item_of(root / n))


def is_source(path: Path) -> bool:
    """Whether ``path`` is an Orbax item, a step of a manager, or a manager's directory."""
    if not path.is_dir():
        return False
    return _item_of(path) is not None or bool(steps(path))


def locate(path: Union[str, "os.PathLike[str]"]) -> Path:
    """The item directory that ``path`` names (see the module's docstring)."""
    p = Path(path)
    if not p.is_dir():
        raise CheckpointNotFoundError(f"{str(p)!r} is not a directory of an Orbax checkpoint",
                                      path=str(p))
    item = _item_of(p)
    if item is None:
        found = steps(p)
        if not found:
            raise UnknownFormatError(
                f"{str(p)!r} holds no Orbax {METADATA} file, neither itself, nor in an item "
                "subdirectory, nor in a numbered step", path=str(p),
                hint="name the directory an Orbax checkpointer saved to, or a "
                     "CheckpointManager's directory")
        item = _item_of(p / str(found[-1]))
        assert item is not None
    return item


def metadata(item: Path) -> Dict[str, Any]:
    """``_METADATA`` of ``item``, parsed and checked to have the shape uckpt reads."""
    where = str(item / METADATA)
    fd = open_regular(item / METADATA, where, follow=False)
    try:
        size = os.fstat(fd).st_size
        if size > MAX_METADATA:
            raise CorruptCheckpointError(f"{where}: {size} bytes, more than a pytree's "
                                         f"metadata may hold ({MAX_METADATA})", path=where)
        data = os.pread(fd, size, 0)
    finally:
        os.close(fd)
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise CorruptCheckpointError(f"{where}: not valid JSON ({e})", path=where,
                                     hint="the file is damaged; use an earlier checkpoint"
                                     ) from None
    entries = doc.get("tree_metadata") if isinstance(doc, dict) else None
    if not isinstance(entries, dict) or not all(_entry_ok(e) for e in entries.values()):
        raise CorruptCheckpointError(f"{where}: no 'tree_metadata' of entries with "
                                     "'key_metadata' and 'value_metadata'", path=where,
                                     hint="the file is damaged; use an earlier checkpoint")
    parsed: Dict[str, Any] = doc
    return parsed


def _entry_ok(entry: Any) -> bool:
    return isinstance(entry, dict) and isinstance(entry.get("value_metadata"), dict) and \
        isinstance(entry.get("key_metadata"), list) and all(
            isinstance(k, dict) and isinstance(k.get("key"), str) and
            k.get("key_type") in (SEQUENCE, DICT) for k in entry["key_metadata"])


def checkpoint_metadata(item: Path) -> Optional[str]:
    """The text of ``_CHECKPOINT_METADATA`` in ``item``, if small and there (a manager's
    step keeps its own above its items: that one describes the step, not this item)."""
    p = item / CHECKPOINT_METADATA
    if p.is_file() and not p.is_symlink() and p.stat().st_size <= MAX_METADATA:
        return p.read_text(encoding="utf-8", errors="replace")
    return None
