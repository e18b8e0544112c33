"""Checks and helpers of a commit, and a whole plan written from one process.

The save path of :func:`uckpt.save` and :class:`uckpt.CheckpointManager`, for any number
of ranks, is :mod:`uckpt.saving.collective`; the bytes go through a
:class:`~uckpt.storage.base.CheckpointSink` (:mod:`uckpt.storage`): data files first,
the manifest last, which is the commit. :func:`write_checkpoint` writes every data file
of a flat state's plan from this one process (``uckpt.consolidate``). Until the commit
readers see nothing new; the previous checkpoint is never touched. Any failure removes what
the save wrote and raises.
"""
from __future__ import annotations

import datetime as _dt
import json
from typing import Any, Callable, Dict, Optional

from ..loading import manifest_io
from .._version import __version__ as _version
from ..errors import ManifestError
from ..format import ArrayEntry, FileEntry, Manifest
from ..options import DEFAULT, SaveOptions
from .plan import SavePlan, WriteItem, metas
from .plan_columns import plan_save
from ..storage.save_errors import raise_save_failure
from ..storage import locate
from ..tree.flatten import FlatState
from .writer import file_end, write_data_file, write_read_chunks

def check_metadata(metadata: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    if metadata is None:
        return {}
    if not isinstance(metadata, dict) or not all(isinstance(k, str) for k in metadata):
        raise ManifestError("metadata must be a dict with str keys of JSON values")
    try:
        json.dumps(metadata, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ManifestError(
            f"metadata is not JSON-serialisable: {e}",
            hint="use str, int, float (finite), bool, None, lists and dicts") from None
    return metadata


def check_step(step) -> None:
    if step is not None and (not isinstance(step, int) or isinstance(step, bool) or step < 0):
        raise ValueError(f"step must be a non-negative int, got {step!r}")


def write_checkpoint(directory, flat: FlatState, *, step: Optional[int] = None,
                     metadata: Optional[Dict[str, Any]] = None, overwrite: bool = False,
                     storage_options=None, options: SaveOptions = DEFAULT,
                     read_chunk: Optional[Callable[[WriteItem], Any]] = None):
    """Write every data file of ``flat`` (one file, laid out as ``options`` say) from this
    process, its chunks compressed as they say, and commit; returns the checkpoint's
    location (a Path, or a URL). With ``read_chunk(item) -> raw bytes`` each item's bytes
    are fetched only when it is written (a few at a time); ``flat.arrays`` then need only
    ``dtype`` and ``shape``."""
    metadata = check_metadata(metadata)
    check_step(step)
    store, name = locate(directory, storage_options)
    plan = plan_save(metas(flat.arrays), chunk_bytes=options.chunk_bytes,
                     alignment=options.alignment)
    compression = options.codec
    where = store.location(name)
    sink = None
    try:
        sink = store.sink(name, overwrite)
        chunks, sizes = {}, []
        for rank, (file, size) in enumerate(plan.file_sizes):
            if read_chunk is not None:
                written = write_read_chunks(sink, file, plan.for_rank(rank), read_chunk,
                                            compression, options.alignment)
            else:
                written = write_data_file(sink, file, size, plan.for_rank(rank), flat.arrays,
                                          compression=compression, alignment=options.alignment)
            chunks.update(written)
            sizes.append(size if compression is None and read_chunk is None
                         else file_end(written.values()))
        manifest = assemble_manifest(flat.skeleton, metas(flat.arrays), plan, chunks, step,
                                     metadata, sizes)
        manifest_io.commit(sink, manifest, overwrite)
    except BaseException as e:
        if sink is not None:
            sink.abort()
        raise_save_failure(e, f"writing checkpoint {str(where)!r}", where,
                           f" ({flat.nbytes} bytes of arrays)")
    return where


#: the manifest's ``generator``
GENERATOR = f"uckpt {_version}"


def created_now() -> str:
    """The manifest's ``created``: the UTC time now."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def assemble_manifest(tree, array_metas, plan: SavePlan, chunks, step, metadata,
                      sizes=None, bases=None) -> Manifest:
    """The manifest of a plan's chunks (``chunks``: write item -> :class:`~uckpt.format.Chunk`);
    ``sizes``: the data files' sizes by rank when they differ from the plan's (compressed
    chunks, or an incremental save writing only changed ones); ``bases``: the
    checkpoints chunks refer to."""
    by_path: Dict[str, list] = {p: [] for p in array_metas}
    for item in plan.items:
        by_path[item.path].append(chunks[item])
    arrays = {p: ArrayEntry(p, m.dtype, tuple(m.shape), tuple(by_path[p]))
              for p, m in array_metas.items()}
    files = {f: FileEntry(f, r, size if sizes is None else sizes[r])
             for r, (f, size) in enumerate(plan.file_sizes)}
    return Manifest(world_size=plan.world_size, tree=tree, arrays=arrays, files=files,
                    step=step, metadata=metadata, generator=GENERATOR, created=created_now(),
                    bases=bases or {})
