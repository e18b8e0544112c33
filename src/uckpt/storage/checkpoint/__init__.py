"""The checkpoint layer, written once on the blob interface (:mod:`uckpt.storage.blob`).

:class:`BlobCheckpointStore` implements the checkpoint-level protocol of
:mod:`uckpt.storage.base` (sources, sinks, the commit, debris, the writer lock, the
listing of steps, archives) for any :class:`~uckpt.storage.blob.BlobStore`, choosing each
rule by the store's capability flags, never by its type:

* **commit** (docs/format.md section 2): where the store has ``atomic_rename``, a save
  writes under a hidden temporary prefix ``.<name>.uckpt-tmp-<token>/``, the manifest
  last, and renames the prefix into place (:mod:`.sink`); where it has not, it writes
  under the final prefix and the manifest, written last with ``create_if_absent``, is the
  commit (section 2);
* **debris** (:mod:`.debris`): a temporary prefix whose save lease (an advisory lock) is
  free, or, without locks, a step prefix without a manifest whose newest object is older
  than ``knobs.debris_expiry_s``; never a live save of this process;
* **writer lock** (:mod:`.lock`): an advisory lock where the store has them, else a lock
  object held under a lease, made with ``create_if_absent``.

Modules: :mod:`.names` (key layout, live saves), :mod:`.source`, :mod:`.sink`,
:mod:`.store`, :mod:`.debris`, :mod:`.lock`, :mod:`.archive`, :mod:`.urls` (which blob
store a ``memory://``, ``shm://`` or ``fsspec+<protocol>://`` URL names), :mod:`.shm`
(where ``shm://`` roots live).
"""
from __future__ import annotations

from .store import BlobCheckpointStore

__all__ = ["BlobCheckpointStore"]
