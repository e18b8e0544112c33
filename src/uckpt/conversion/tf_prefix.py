"""The files of a TensorFlow checkpoint, found and checked without TensorFlow.

A checkpoint is a *prefix* ``P``: ``P.index`` (a table naming every tensor) and the data
shards ``P.data-00000-of-0000N`` ... A source may be named by its prefix, its ``.index``
file, one of its data shards, or a directory holding a ``checkpoint`` state file
(``tf.train.CheckpointManager``, tf_keras ``save_weights``), which means the checkpoint
that file names as its latest (``model_checkpoint_path``). A target is named by its prefix
(``--to tf``) or by ``P.index``; it is written under a temporary directory beside it and
put in place data shards first, index last (the index is what makes it visible).
"""
from __future__ import annotations

import codecs
import os
import re
import secrets
from pathlib import Path
from typing import Callable, List, Optional

from ..errors import CheckpointExistsError, CheckpointNotFoundError, CorruptCheckpointError
from ..storage import fsutil
from ..storage.checkpoint.names import TMP_MARK
from .errors import UnsafeInputError
from .output import HINT, place

INDEX = ".index"
STATE = "checkpoint"  # CheckpointManager's state file
DATA = re.compile(r"\.data-(\d{5})-of-(\d{5})$")
#: the last 8 bytes of an ``.index`` file (a LevelDB-style table: ``kTableMagicNumber``)
TABLE_MAGIC = (0xDB4775248B80FB57).to_bytes(8, "little")
MAX_STATE = 1 << 20
_LATEST = re.compile(r'^model_checkpoint_path:\s*"((?:[^"\\\n]|\\.)*)"\s*$', re.M)


def index_of(prefix: Path) -> Path:
    return prefix.with_name(prefix.name + INDEX)


def shards_of(prefix: Path) -> List[Path]:
    """The data shards of ``prefix`` that exist, sorted by name."""
    if not prefix.parent.is_dir():
        return []
    found = [prefix.parent / n for n in os.listdir(prefix.parent)
             if n.startswith(prefix.name) and DATA.fullmatch(n[len(prefix.name):])]
    return sorted(found)


def is_source(path: Path) -> bool:
    """Whether ``path`` names a TensorFlow checkpoint by its layout: a prefix (with an index
    or data shards beside it), an index or data shard with its prefix's index, or a
    directory holding a ``checkpoint`` state file."""
    if path.is_dir():
        return (path / STATE).is_file()
    if not path.exists():
        return index_of(path).is_file() or bool(shards_of(path))
    m = DATA.search(path.name)
    return m is not None and index_of(path.with_name(path.name[:m.start()])).is_file()


def is_index(head_tail: bytes) -> bool:
    """Whether the last 8 bytes of a file are the table magic of an ``.index`` file."""
    return head_tail == TABLE_MAGIC


def locate(path) -> Path:
    """The prefix of the checkpoint ``path`` names (see the module's docstring), its
    index and every data shard checked to be there."""
    p = Path(path)
    if p.is_dir():
        prefix = _latest(p)
    elif p.is_file() and p.name.endswith(INDEX):
        prefix = p.with_name(p.name[:-len(INDEX)])
    elif p.is_file() and DATA.search(p.name):
        prefix = p.with_name(p.name[:DATA.search(p.name).start()])  # type: ignore[union-attr]
    else:
        prefix = p
    check(prefix)
    return prefix


def check(prefix: Path) -> List[Path]:
    """The data shards of ``prefix``, each checked to be there, as its index."""
    index, shards = index_of(prefix), shards_of(prefix)
    if not index.is_file():
        if shards:
            raise CorruptCheckpointError(
                f"{index}: missing: the TensorFlow checkpoint {str(prefix)!r} has data shards "
                f"({shards[0].name}) but no index", path=str(index),
                hint="the index is written last: the save did not finish; use an earlier "
                     "checkpoint")
        raise CheckpointNotFoundError(f"{str(prefix)!r}: no TensorFlow checkpoint there (no "
                                      f"{index.name})", path=str(index), hint=_others(prefix))
    if not shards:
        raise CorruptCheckpointError(f"{prefix}.data-00000-of-NNNNN: missing: the TensorFlow "
                                     f"checkpoint {str(prefix)!r} has an index but no data "
                                     "shard", path=str(prefix) + ".data-00000-of-00001")
    counts = {DATA.search(s.name).group(2) for s in shards}  # type: ignore[union-attr]
    if len(counts) > 1:
        raise CorruptCheckpointError(f"{prefix}: data shards of different counts "
                                     f"({', '.join(s.name for s in shards)})", path=str(prefix),
                                     hint="remove the shards of the other save")
    n = int(counts.pop())
    for i in range(n):
        want = prefix.with_name(f"{prefix.name}.data-{i:05d}-of-{n:05d}")
        if want not in shards:
            raise CorruptCheckpointError(f"{want}: missing: data shard {i} of {n} of the "
                                         f"TensorFlow checkpoint {str(prefix)!r}",
                                         path=str(want))
    return shards


def nearby(path: Path) -> Optional[str]:
    """A hint naming the TensorFlow checkpoints beside ``path``, if there are any."""
    parent = path.parent
    if not parent.is_dir() or not any(n.endswith(INDEX) for n in os.listdir(parent)):
        return None
    return _others(path)


def _others(prefix: Path) -> str:
    parent = prefix.parent if prefix.parent.is_dir() else None
    found = sorted(n[:-len(INDEX)] for n in os.listdir(parent) if n.endswith(INDEX)) \
        if parent is not None else []
    if found:
        return (f"name a checkpoint by its prefix: {str(parent)!r} holds "
                f"{', '.join(found[:8])}{', ...' if len(found) > 8 else ''}")
    return "name a checkpoint by its prefix (the .index file's name without .index)"


def _latest(directory: Path) -> Path:
    """The checkpoint a directory's ``checkpoint`` state file names as its latest."""
    state = directory / STATE
    if not state.is_file():
        raise CheckpointNotFoundError(f"{str(directory)!r}: no {STATE} state file",
                                      path=str(state), hint=_others(directory / "x"))
    with open(state, "rb") as f:
        data = f.read(MAX_STATE + 1)
    m = _LATEST.search(data[:MAX_STATE].decode("utf-8", "replace"))
    if m is None:
        raise CorruptCheckpointError(f"{state}: names no latest checkpoint "
                                     "(model_checkpoint_path)", path=str(state),
                                     hint="name the checkpoint by its prefix")
    text = m.group(1)
    if "\\" in text:
        text = codecs.escape_decode(text.encode("utf-8"))[0].decode("utf-8", "replace")
    named = Path(text)
    prefix = named if named.is_absolute() else directory / named
    base = directory.resolve()
    if prefix.parent.resolve() != base and base not in prefix.parent.resolve().parents:
        raise UnsafeInputError(f"{state}: names {text!r}, outside its directory",
                               path=str(state), hint="name the checkpoint by its prefix")
    return prefix


# -- a target ---------------------------------------------------------------------------------
def prefix_of(dst) -> Path:
    """The prefix a target names (``P`` or ``P.index``)."""
    p = Path(dst)
    return p.with_name(p.name[:-len(INDEX)]) if p.name.endswith(INDEX) else p


def check_target(dst, force: bool) -> None:
    """Refuse early a target that must not be written: an existing checkpoint at that
    prefix (unless ``force``), a prefix that names a directory."""
    prefix = prefix_of(dst)
    if prefix.is_dir():
        raise CheckpointExistsError(f"{str(prefix)!r} is a directory; a TensorFlow checkpoint "
                                    "is named by the prefix of its files",
                                    path=str(prefix), hint=f"name it e.g. {prefix / 'ckpt'}")
    there = [f for f in [index_of(prefix)] + shards_of(prefix) if f.exists()]
    if there and not force:
        raise CheckpointExistsError(f"{str(there[0])!r} already exists", path=str(there[0]),
                                    hint=HINT)


def write_atomically(dst, force: bool, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp_prefix)`` (a prefix inside a new temporary directory beside the
    target) and put its files in place: data shards, then the index; with ``force``, data
    shards of an earlier checkpoint at the prefix that were not replaced are removed.
    Returns the prefix; any failure removes the temporary directory."""
    prefix = prefix_of(Path(dst).absolute())
    check_target(prefix, force)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    tmp = prefix.parent / f".{prefix.name}{TMP_MARK}{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        write(tmp / prefix.name)
        made = shards_of(tmp / prefix.name)
        old = set(shards_of(prefix))
        for shard in made:
            place(shard, prefix.parent / shard.name, force)
        place(index_of(tmp / prefix.name), index_of(prefix), force)
        for stale in old - {prefix.parent / s.name for s in made}:
            stale.unlink()
        fsutil.fsync_dir(prefix.parent)
    finally:
        fsutil.remove_tree(tmp)
    return prefix


def tf_error_path(prefix: Path) -> Optional[str]:
    """The one data shard of ``prefix`` (what an error reading a tensor names), if one."""
    shards = shards_of(prefix)
    return str(shards[0]) if len(shards) == 1 else None
