"""What a listing of a root on a blob store shows (:meth:`Store.entries`,
:meth:`Store.itself`), from one listing of its keys; nothing is read or changed."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Dict, Iterator, List, Optional, Tuple

from ...errors import CheckpointNotFoundError, NotACheckpointError
from ..fsutil import kind_of
from ..base import CHECKPOINT, LINK, STALE, TEMPORARY, Entry, step_of
from ..blob.base import Tree
from .names import HIDDEN, MANIFEST_NAME, TMP_MARK

if TYPE_CHECKING:
    from ..blob.base import BlobStore, Level
    from .store import BlobCheckpointStore


def is_prefix(blob: BlobStore, prefix: str) -> bool:
    """Whether ``prefix`` (``"a/b/"``) is listed beside its siblings: on a store with
    :attr:`~uckpt.storage.blob.base.BlobStore.local_files` a directory, even empty."""
    parent = prefix[:-1].rpartition("/")[0]
    return prefix in blob.list_dir(parent + "/" if parent else "").prefixes


def _entry(store: BlobCheckpointStore, name: str, tree: Tree, sub: str) -> Entry:
    """The entry of child ``name`` (at prefix ``sub``) from what is below it."""
    keys = {k[len(sub):]: n for k, n in tree.keys.items()}
    files = {k: n for k, n in keys.items() if "/" not in k}
    if store.blob.local_files:  # directories, even empty, and entries that are no objects
        not_plain = {p[len(sub):-1]: "a directory" for p in tree.prefixes}
        not_plain.update((k[len(sub):], kind) for k, kind in tree.others.items())
    else:
        not_plain = {p[len(sub):-1]: "a prefix holding further objects" for p in tree.prefixes}
    entry = Entry(name, CHECKPOINT, store.at(name), step=step_of(name),
                  size=sum(keys.values()), files=files, not_plain=not_plain, token=tree.token)
    m = HIDDEN.match(name)
    if m:
        entry.step = step_of(m.group(1))
        entry.kind = TEMPORARY if m.group(2) == TMP_MARK else STALE
        what = "directory" if store.blob.local_files else "prefix"
        entry.reason = (f"temporary {what} of a save in progress or interrupted"
                        if entry.kind == TEMPORARY
                        else "left by an interrupted delete or overwrite")
    elif (not store.blob.atomic_rename and MANIFEST_NAME not in files
          and MANIFEST_NAME not in not_plain):
        # without a rename a save writes in place and its manifest is the commit
        # (docs/format.md section 2); with one it writes under a hidden name, so a
        # checkpoint's name without a manifest is a damaged checkpoint
        entry.kind = TEMPORARY
        entry.reason = "objects of a save in progress or interrupted (no manifest)"
    return entry


def identity(store: BlobCheckpointStore, name: str) -> Optional[Tuple[int, int]]:
    """Where the store keeps local files, the (device, inode) of child ``name`` (not
    followed): what tells the directory listed from one put in its place since; else (or
    where it is gone) None."""
    if not store.blob.local_files:
        return None
    try:
        st = os.stat(store.at(name), follow_symlinks=False)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def check_root(store: BlobCheckpointStore) -> None:
    """Where the store keeps local files, CheckpointNotFoundError if the root directory is
    missing and NotACheckpointError if something else stands there (a symlink to a
    directory is followed: it was given). A prefix of an object store always exists."""
    if not store.blob.local_files or store.exists():
        return
    where = store.where
    try:
        mode = os.stat(where).st_mode
    except FileNotFoundError:
        raise CheckpointNotFoundError(f"{where!r} does not exist", path=where) from None
    raise NotACheckpointError(f"{where!r} is {kind_of(mode)}, not a directory of checkpoints",
                              path=where)


def children(store: BlobCheckpointStore, level: Optional[Level] = None
             ) -> Iterator[Tuple[str, str, Tree]]:
    """``(name, prefix, what is below it)`` of the root's children that may be
    checkpoints. Local files: from ``level``, one scan of the root's own entries with a
    look at each directory's manifest (:meth:`~uckpt.storage.blob.base.BlobStore.list_level`),
    only the children named like a step, hidden by uckpt or holding a manifest are walked,
    each once (a root may sit beside a large unrelated tree). An object store: one listing
    of every key below the root, grouped (a request per 1,000 keys; a request per child
    costs more)."""
    if store.blob.local_files:
        level = level or store.blob.list_level(store.prefix, MANIFEST_NAME)
        holding = set(level.holding)
        for sub in level.prefixes:
            name = sub[len(store.prefix):-1]
            if step_of(name) is None and not HIDDEN.match(name) and sub not in holding:
                continue
            yield name, sub, store.blob.list_tree(sub)
        return
    grouped: Dict[str, Dict[str, int]] = {}
    for key, size in store.blob.list(store.prefix):
        name, sep, rest = key[len(store.prefix):].partition("/")
        if sep:
            grouped.setdefault(name, {})[key] = size
    for name, keys in sorted(grouped.items()):
        sub = f"{store.prefix}{name}/"
        yield name, sub, _objects(keys, sub)


def _objects(keys: Dict[str, int], sub: str) -> Tree:
    """What is below ``sub`` on an object store, from its keys (prefixes hold objects)."""
    below = {k[len(sub):].partition("/")[0] for k in keys if "/" in k[len(sub):]}
    return Tree(keys, sorted(sub + b + "/" for b in below), {}, None)


def entries(store: BlobCheckpointStore) -> List[Entry]:
    """The root's checkpoints and uckpt's hidden entries (:func:`children`), and the
    symbolic links named like a step."""
    check_root(store)
    level = store.blob.list_level(store.prefix, MANIFEST_NAME) \
        if store.blob.local_files else None
    out = []
    for name, sub, tree in children(store, level):
        entry = _entry(store, name, tree, sub)
        if entry.kind == CHECKPOINT or entry.step is not None:
            out.append(entry)
    others = level.others if level is not None else store.blob.others(store.prefix)
    for key, kind in others.items():
        link = _link(store, key[len(store.prefix):], kind)
        if link is not None:
            out.append(link)
    return sorted(out, key=lambda e: e.name)


def _link(store: BlobCheckpointStore, name: str, kind: str) -> Optional[Entry]:
    """A symbolic link named like a checkpoint: listed, never followed (what else is
    not a directory in a root is no checkpoint: left out)."""
    m = HIDDEN.match(name)
    step = step_of(m.group(1) if m else name)
    if not kind.startswith("a symbolic link") or (step is None and not m):
        return None
    return Entry(name, LINK, store.at(name), step=step,
                 reason=f"{kind}, not a checkpoint directory: not followed")


def itself(store: BlobCheckpointStore) -> Optional[Entry]:
    check_root(store)
    if not store.blob.exists(store.prefix + MANIFEST_NAME):
        return None
    tree = store.blob.list_tree(store.prefix) if store.blob.local_files \
        else _objects(dict(store.blob.list(store.prefix)), store.prefix)
    name = (store.prefix[:-1] or store.where).rpartition("/")[2]
    entry = _entry(store, name, tree, store.prefix)
    entry.where = store.where
    return entry


__all__ = ["check_root", "entries", "identity", "is_prefix", "itself"]
