"""The functional API: save, load, verify, inspect."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Union

from .collective import flatten_shared, prepare_collective, save_collective, submit_async_share
from .comm import Communicator, background_communicator, get_communicator
from .commit import check_metadata, check_target, write_checkpoint
from .engine import SaveHandle, default_saver
from .staging import snapshot
from .format import Manifest
from .reader import CheckpointReader, read_manifest
from .restore import load_tree, restore_into
from .tree import Flat


def save(directory, state: Mapping[str, Any], *, step: Optional[int] = None,
         metadata: Optional[Dict[str, Any]] = None, overwrite: bool = False,
         blocking: bool = True, comm: Any = None) -> Union[Path, SaveHandle]:
    """Save ``state`` to ``directory`` and commit it atomically.

    ``state`` maps names to framework objects (models, optimizers, schedulers,
    RNGs, ...), arrays and plain values. Refuses to replace an existing
    committed checkpoint unless ``overwrite=True``; the previous checkpoint is
    never damaged by a failed save.

    Returns the directory. With ``blocking=False``, returns a
    :class:`~uckpt.engine.SaveHandle` as soon as the state is copied to host
    memory (a snapshot: later in-place changes do not reach the checkpoint);
    the write continues in the background. ``handle.wait()`` returns the
    directory or raises the error the write failed with; an error nobody looked
    at is raised by the next ``uckpt.save`` (and printed at exit otherwise).

    ``comm`` (an mpi4py communicator, a torch.distributed process group, the
    ``horovod.torch`` module, a :class:`uckpt.comm.Communicator`, or None to
    detect one; see :func:`uckpt.comm.get_communicator`): with more than one
    rank, the call is collective. Plain arrays are replicated (equal on every
    rank) and written once in total, split evenly across the ranks;
    :class:`uckpt.Shard` leaves are written by the ranks holding them;
    :class:`uckpt.PerRank` subtrees once per rank. Every rank writes its own data
    file; the checkpoint is committed only once every rank succeeded, and a
    failure on any rank raises :class:`~uckpt.errors.DistributedError` on all.
    """
    default_saver().raise_unreported()  # an earlier background save's error is never lost
    c = get_communicator(comm)
    flat = flatten_shared(state, c)
    if c.size > 1 or (isinstance(flat, Flat) and flat.boxes):
        return _save_collective(directory, flat, c, step, metadata, overwrite, blocking)
    if blocking:
        snap = snapshot(flat, None)  # device arrays only; host arrays are written in place
        return write_checkpoint(directory, snap.ready(), step=step, metadata=metadata,
                                overwrite=overwrite)
    check_metadata(metadata)
    check_target(Path(directory).absolute(), overwrite)  # input errors raise now, not later
    return default_saver().submit(
        flat, lambda staged: write_checkpoint(directory, staged, step=step, metadata=metadata,
                                              overwrite=overwrite),
        f"save to {str(directory)!r}")


def _save_collective(directory, flat, c: Communicator, step, metadata, overwrite, blocking):
    if blocking:
        return save_collective(directory, flat, c, step=step, metadata=metadata,
                               overwrite=overwrite)
    # the plan exchange runs here (so only this rank's share is snapshotted, straight
    # into the layout of its data file); the write and commit run in the background
    prepared = prepare_collective(directory, flat, c, step=step, metadata=metadata,
                                  overwrite=overwrite)
    return submit_async_share(default_saver(), prepared, c, background_communicator(c),
                              f"save to {str(directory)!r}")


def load(directory, state: Optional[Mapping[str, Any]] = None, *, strict: bool = True,
         comm: Any = None) -> Dict[str, Any]:
    """Load a checkpoint.

    With ``state=None``, return the whole tree as NumPy arrays and plain values
    (no framework needed). With a ``state`` mapping, restore its framework
    objects and arrays in place and return the loaded tree for its keys. With
    ``strict`` (default), the keys of ``state`` must be exactly the
    checkpoint's top-level keys; otherwise only the given keys are restored.

    Any number of ranks can load a checkpoint written by any number: replicated
    arrays are read whole by each rank; a :class:`uckpt.Shard` in ``state``
    receives its box of the saved array, however the saved array was sliced
    (only the chunks that intersect the box are read). With more than one rank
    (``comm``, as for :func:`save`), the call is collective: if it fails on any
    rank, every rank raises :class:`~uckpt.errors.DistributedError`.
    """
    c = get_communicator(comm)
    if c.size == 1:
        return _load_local(directory, state, strict, 0)
    out: Dict[str, Any] = {}

    def job() -> None:
        out["tree"] = _load_local(directory, state, strict, c.rank)

    c.gather_outcomes(job, f"load of {str(directory)!r}")
    return out["tree"]


def _load_local(directory, state, strict: bool, rank: int) -> Dict[str, Any]:
    with CheckpointReader(directory) as reader:
        if state is None:
            return load_tree(reader)
        return restore_into(reader, state, strict=strict, rank=rank)


def consolidate(src, dst, *, overwrite: bool = False) -> Path:
    """Rewrite checkpoint ``src`` (written by any number of ranks) as a single-process one
    at ``dst``: one data file, each array in one piece, the same tree (adapters, classes,
    PerRank subtrees), step and metadata. ``uckpt convert`` takes either."""
    with CheckpointReader(src) as reader:
        m = reader.manifest
        arrays = reader.read_arrays({p: None for p in m.arrays})
    return write_checkpoint(dst, Flat(m.tree, arrays), step=m.step, metadata=m.metadata,
                            overwrite=overwrite)


def verify(directory) -> Manifest:
    """Re-check the manifest and every chunk's checksum; returns the manifest or raises."""
    with CheckpointReader(directory) as reader:
        reader.verify()
        return reader.manifest


def manifest(directory) -> Manifest:
    """The validated manifest of a committed checkpoint, without reading data."""
    return read_manifest(directory)
