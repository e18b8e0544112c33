"""Chainer's trainer snapshots and uckpt's ``trainer`` entry, for trees in conversion.

``chainer.training.extensions.snapshot()`` writes what ``trainer.serialize`` gives, at the
file's root (``updater/model:main/...``, ``updater/optimizer:main/...``, ``stop_trigger``,
``extensions``, ...). ``uckpt.chainer.snapshot`` saves the same tree under ``trainer``
(beside ``rng``). :func:`uckpt_root` nests a snapshot's tree under ``trainer`` for a uckpt
target, so that ``uckpt.chainer.resume`` (or ``uckpt.load(d, {"trainer": trainer})``)
restores it; :func:`unnested` finds it there again; :func:`snapshot_root` takes a uckpt
tree's ``trainer`` entry (live or converted) back to the root for an NPZ or HDF5 target, which
``chainer.serializers.load_npz(path, trainer)`` reads (entries only uckpt records, such
as an optimizer's ``uckpt:class``, are ignored by Chainer's loader).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from .interchange import Obj

TRAINER = "chainer.trainer"
#: the key a trainer snapshot's tree is nested under in a uckpt checkpoint
TRAINER_KEY = "trainer"


def is_snapshot(root: Any) -> bool:
    """Whether ``root`` is a Chainer trainer snapshot's tree: an ``updater`` holding its
    ``iteration`` and at least one ``model:<name>``, beside ``stop_trigger``."""
    if not isinstance(root, dict) or "stop_trigger" not in root:
        return False
    updater = root.get("updater")
    return isinstance(updater, dict) and "iteration" in updater and \
        any(isinstance(k, str) and k.startswith("model:") for k in updater)


def uckpt_root(root: Any) -> Any:
    """``{"trainer": root}`` for a trainer snapshot's tree; ``root`` for any other."""
    return {TRAINER_KEY: root} if is_snapshot(root) else root


def unnested(root: Any) -> Any:
    """A snapshot's tree that a uckpt checkpoint holds under ``trainer`` (converted, or
    saved from a live trainer), or None."""
    if not isinstance(root, dict):
        return None
    node = root.get(TRAINER_KEY)
    if isinstance(node, Obj) and node.adapter == TRAINER:
        node = node.state
    return node if is_snapshot(node) else None


def snapshot_root(root: Any, notes: List[str]) -> Optional[Dict[str, Any]]:
    """The trainer's tree, for a file Chainer's ``load_npz`` reads into a trainer, from a
    uckpt tree whose ``trainer`` entry is a trainer (live, or a converted snapshot); None
    for any other tree. Other top-level entries (``rng``) are left out, with a note."""
    node = unnested(root)
    if node is None:
        return None
    dropped = [str(k) for k in root if k != TRAINER_KEY]
    if dropped:
        notes.append("a Chainer trainer snapshot holds only the trainer: left out "
                     + ", ".join(map(repr, dropped)))
    return node
