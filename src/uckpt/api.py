"""The functional API: save, load, verify, inspect."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence, Union

from .saving.collective import (flatten_shared, prepare_collective, save_collective,
                                submit_async_share)
from .comm import background_communicator, get_communicator
from .saving.engine import SaveHandle, default_saver
from .errors import UnsafePathError
from .format import Manifest
from .runtime.gcpause import pausing
from .saving.incremental import Baseline
from .options import SaveOptions, save_options
from .loading.reader import CheckpointReader, read_manifest
from .storage import locate, open_source
from .loading.cast import Cast
from .loading.collective import load_from
from .loading.report import LoadReport


@pausing
def save(directory, state: Mapping[str, Any], *, step: Optional[int] = None,
         metadata: Optional[Dict[str, Any]] = None, overwrite: bool = False,
         blocking: bool = True, comm: Any = None,
         storage_options: Optional[Mapping[str, Any]] = None,
         compression: Optional[str] = None,
         compression_level: Optional[int] = None,
         base: Any = None, incremental: bool = False,
         options: Optional[SaveOptions] = None) -> Union[Path, str, SaveHandle]:
    """Save ``state`` to ``directory`` and commit it atomically.

    ``directory`` is a local path or an ``s3://bucket/prefix`` URL of an S3-compatible
    object store (``storage_options``: ``endpoint_url``, ``key``, ``secret``, ... see
    :class:`uckpt.storage.s3.S3Options`; credentials left out come from the standard AWS
    environment variables and files). ``state`` maps names to framework objects
    (models, optimizers, schedulers, RNGs, ...), arrays and plain values. Refuses to
    replace an existing committed checkpoint unless ``overwrite=True``; the previous
    checkpoint is never damaged by a failed save.

    ``compression="zstd"`` compresses every chunk with Zstandard at
    ``compression_level`` (default 1), grouping the bytes of each element of dtypes of
    itemsize 2 or more into planes first (the pipeline ``["bytegroup", "zstd"]``, docs/format.md
    section 5); a chunk that does not shrink is stored raw. With ``blocking=False`` the
    compression runs in the background. Unknown names raise
    :class:`~uckpt.errors.CompressionError` (a ``ValueError``).

    ``options`` (a :class:`uckpt.SaveOptions`) sets the layout: chunk size, alignment,
    compression (then not also given as keywords: :class:`~uckpt.errors.OptionsError`).

    Returns the directory (a URL for an object store). With ``blocking=False``, returns a
    :class:`~uckpt.saving.engine.SaveHandle` as soon as the state is copied to host
    memory (a snapshot: later in-place changes do not reach the checkpoint);
    the write continues in the background. ``handle.wait()`` returns the
    directory or raises the error the write failed with; an error nobody looked
    at is raised by the next ``uckpt.save`` (and printed at exit otherwise).

    ``comm`` (an mpi4py communicator, a torch.distributed process group, the
    ``horovod.torch`` module, a :class:`uckpt.comm.Communicator`, or None to
    detect one; see :func:`uckpt.comm.get_communicator`): with more than one
    rank, the call is collective. Plain arrays are replicated (equal on every
    rank) and written once in total, split evenly across the ranks;
    :class:`uckpt.Shard` leaves are written by the ranks holding them (and must tile
    their arrays, in one process too); :class:`uckpt.PerRank` subtrees once per rank.
    Every rank writes its own data file (to an object store: uploads it); the
    checkpoint is committed only once every rank succeeded, and a failure on any rank
    raises :class:`~uckpt.errors.DistributedError` on all.

    ``base`` (a committed checkpoint beside ``directory``: same parent directory or
    prefix) makes an incremental checkpoint: chunks whose content hash equals the base's
    chunk of the same box are not written but refer to where the base's bytes are
    (docs/format.md section 11.4). The new checkpoint then needs its bases to load; keep
    them, or make a self-contained copy with :func:`consolidate`. Chunks are then cut into
    slabs of about ``options.incremental_chunk_bytes``; ``incremental=True`` cuts a save
    without a base the same way, so that the first checkpoint of a chain can serve as one.
    """
    default_saver().raise_unreported()  # an earlier background save's error is never lost
    layout = save_options(options, compression, compression_level)
    c = get_communicator(comm)
    store, name = locate(directory, storage_options)
    flat = flatten_shared(state, c)
    baseline = Baseline("") if incremental else None
    if base is not None:
        try:
            baseline = baseline_at(store, name, base, storage_options)
        except Exception as e:  # noqa: BLE001 - told to the other ranks by the plan exchange
            if c.size == 1:
                raise
            flat = e
    given = None if baseline is None else (lambda: baseline)
    if blocking:
        return save_collective(store, name, flat, c, step=step, metadata=metadata,
                               overwrite=overwrite, options=layout, baseline=given)
    # the plan exchange runs here (so only this rank's share is snapshotted, straight
    # into the layout of its data file); the write and commit run in the background
    prepared = prepare_collective(store, name, flat, c, step=step, metadata=metadata,
                                  overwrite=overwrite, options=layout, baseline=given)
    return submit_async_share(default_saver(), prepared, c, background_communicator(c),
                              f"save to {str(store.location(name))!r}")


def baseline_at(store, name: str, base, storage_options=None) -> Baseline:
    """The baseline of checkpoint ``base``, which must be a sibling of ``name`` in
    ``store`` (references name a directory beside the checkpoint's own)."""
    base_store, base_name = locate(base, storage_options)
    if str(base_store.location(base_name)) != str(store.location(base_name)):
        raise UnsafePathError(
            f"the base {str(base)!r} is not beside {str(store.location(name))!r}: an "
            "incremental checkpoint refers to checkpoints in its own parent directory only",
            path=str(base), hint="save next to the base (same parent directory or prefix)")
    return Baseline.of(read_manifest(base_store.source(base_name)), base_name)


def load(directory, state: Optional[Mapping[str, Any]] = None, *, strict: bool = True,
         comm: Any = None, storage_options: Optional[Mapping[str, Any]] = None,
         max_bytes: Optional[int] = None, cast: Cast = None,
         report: Optional[LoadReport] = None,
         select: Optional[Union[str, Sequence[str]]] = None,
         cooperative: Any = None) -> Dict[str, Any]:
    """Load a checkpoint (a local path, or an ``s3://`` URL with ``storage_options``).

    With ``state=None``, return the whole tree as NumPy arrays and plain values
    (no framework needed; the arrays are carved from a few large allocations, see
    :data:`uckpt.loading.reader.ARENA_BYTES`, so one array kept alive keeps its region). With a
    ``state`` mapping, restore its framework objects and arrays in place and return the
    loaded tree for its keys.

    Keys: with ``strict`` (default), the keys of ``state`` must be exactly the checkpoint's,
    at every depth (nested mappings, a model's parameters, ...); a difference raises
    :class:`~uckpt.errors.KeyMismatchError` naming the missing and unexpected keys. With
    ``strict=False``, what both hold is loaded and the rest is skipped, as
    ``torch.nn.Module.load_state_dict(strict=False)`` does: ``report`` (a
    :class:`uckpt.LoadReport`, an out-parameter so that the return value stays the loaded
    tree) is filled with the ``missing_keys`` (in ``state``, not in the checkpoint: left as
    they were) and ``unexpected_keys`` (in the checkpoint, not in ``state``: not read), as
    leaf paths (``"model/fc.weight"``); they are logged too (INFO, ``uckpt.loading.report``).
    Adapters of PyTorch modules, Keras layers and models, and Chainer links load their
    entries partly; an optimizer is loaded whole or not at all; a shape mismatch is an
    error either way.

    Dtypes: a stored array loads into a destination of its own dtype; another dtype is a
    :class:`~uckpt.errors.DtypeMismatchError` (a ``ValueError``) naming the leaf and both
    dtypes, unless ``cast`` allows the conversion: a casting rule (``"safe"``: widening
    casts, bfloat16 -> float32 included) or a mapping of glob patterns over leaf paths to
    dtypes or rules (``{"model/*": "bfloat16"}``: a narrowing, such as float32 master
    weights into a bfloat16 model, needs the dtype named). Arrays are converted while
    read, chunk by chunk into their destinations (:mod:`uckpt.loading.cast`); without
    ``state``, leaves whose pattern names a dtype are returned in it.

    Part: ``select`` (a glob pattern or a list of them, matched against leaf paths such as
    ``"model/fc.weight"``: see :mod:`uckpt.loading.selection`; ``*`` matches across ``/``,
    and a node's path selects everything below it) loads only the leaves it picks, and
    reads only their chunks. Without ``state``, the tree returned holds those leaves
    alone. With ``state``, only they are restored and the rest of ``state`` is left
    untouched: the checkpoint counts as holding the selected leaves alone, so ``strict``
    compares ``state``'s keys with the checkpoint's keys that hold one (keys of ``state``
    holding none are neither refused nor reported); in a framework object only the
    selected leaves change, its adapter given the others as the object holds them. A
    pattern that picks nothing raises :class:`~uckpt.errors.UnknownKeyError` (a
    ``KeyError``) naming it.

    Any number of ranks can load a checkpoint written by any number: replicated
    arrays are read whole by each rank; a :class:`uckpt.Shard` in ``state``
    receives its box of the saved array, however the saved array was sliced
    (only the chunks that intersect the box are read). With more than one rank
    (``comm``, as for :func:`save`), the call is collective: if it fails on any
    rank, every rank raises :class:`~uckpt.errors.DistributedError`.

    ``cooperative`` (several ranks): ``"node"`` reads each chunk that several ranks of a
    node load (replicated arrays, overlapping boxes) once on that node and sends it to
    the others over ``comm``; ``"job"`` once in the whole job; False every rank reads all
    it loads itself; ``"auto"`` (the default, ``UCKPT_COOPERATIVE_LOAD``) is ``"node"``
    from an object store and False from local files (whose page cache shares a node's
    reads already). Every rank checks every
    chunk's checksum either way; ``report.bytes_read`` and ``bytes_received`` say what
    this rank read from storage and received (docs/distributed.md, "Reads shared across
    ranks").

    Memory: the arrays the manifest declares that are not loaded into existing ones
    (``state``'s arrays are filled in place), plus the parsed manifest and a read block
    per thread. Their declared total is refused before anything is allocated
    (:class:`~uckpt.errors.MemoryLimitError`, also a ``MemoryError``) when it is more than
    ``max_bytes``, or, without it, than the memory available to the process (the least
    of ``ulimit -v``, the cgroup's limit and ``MemAvailable``: :mod:`uckpt.runtime.memory`); a
    ``MemoryError`` while reading is a MemoryLimitError too.
    """
    return load_from(lambda: open_source(directory, storage_options), state, strict, comm,
                     f"load of {str(directory)!r}", max_bytes, cast=cast, report=report,
                     select=select, cooperative=cooperative)


def consolidate(src, dst, *, overwrite: bool = False,
                storage_options: Optional[Mapping[str, Any]] = None,
                compression: Optional[str] = None,
                compression_level: Optional[int] = None,
                options: Optional[SaveOptions] = None) -> Union[Path, str]:
    """Rewrite checkpoint ``src`` (written by any number of ranks) as a single-process one
    at ``dst``: one data file, each array in one piece, the same tree (adapters, classes,
    PerRank subtrees), step and metadata. ``uckpt convert`` takes either. The copy of an
    incremental checkpoint is self-contained (no ``bases``: every chunk read through its
    references).
    ``compression``, ``compression_level`` and ``options`` as for :func:`save`.
    ``storage_options`` apply to whichever of them is an ``s3://`` URL.
    Each piece of the output is read from the source when it is written: memory is one
    source chunk (at most the largest array) plus a few pieces (:mod:`uckpt.saving.consolidation`),
    not the whole checkpoint."""
    from .saving.consolidation import consolidate as rewrite

    layout = save_options(options, compression, compression_level, "uckpt.consolidate")
    with CheckpointReader(src, storage_options=_for(src, storage_options)) as reader:
        return rewrite(reader, dst, overwrite=overwrite,
                       storage_options=_for(dst, storage_options), options=layout)


def _for(target, storage_options):
    from .storage import storage_options_for

    return storage_options_for(target, storage_options)


def verify(directory, *, storage_options: Optional[Mapping[str, Any]] = None) -> Manifest:
    """Re-check the manifest and every chunk's checksum; returns the manifest or raises.

    Memory: the parsed manifest plus a constant, whatever sizes it declares: chunks are
    streamed a read block at a time; a compressed one decoded in memory up to
    ``knobs.verify_decode_bytes``, streamed beyond (:mod:`uckpt.codecs.stream`)."""
    with CheckpointReader(directory, storage_options=storage_options) as reader:
        reader.verify()
        return reader.manifest


def manifest(directory, *, storage_options: Optional[Mapping[str, Any]] = None) -> Manifest:
    """The validated manifest of a committed checkpoint, without reading data (a
    ``manifest.json`` over ``MAX_MANIFEST_BYTES`` is refused by its size, unread)."""
    return read_manifest(directory, storage_options)
