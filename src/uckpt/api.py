"""The functional API: save, load, verify, inspect."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Union

from .commit import check_metadata, check_target, write_checkpoint
from .engine import SaveHandle, default_saver
from .staging import snapshot
from .format import Manifest
from .reader import CheckpointReader, read_manifest
from .restore import load_tree, restore_into
from .tree import flatten


def save(directory, state: Mapping[str, Any], *, step: Optional[int] = None,
         metadata: Optional[Dict[str, Any]] = None, overwrite: bool = False,
         blocking: bool = True) -> Union[Path, SaveHandle]:
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
    """
    default_saver().raise_unreported()  # an earlier background save's error is never lost
    flat = flatten(state)
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


def load(directory, state: Optional[Mapping[str, Any]] = None, *, strict: bool = True) -> Dict[str, Any]:
    """Load a checkpoint.

    With ``state=None``, return the whole tree as NumPy arrays and plain values
    (no framework needed). With a ``state`` mapping, restore its framework
    objects and arrays in place and return the loaded tree for its keys. With
    ``strict`` (default), the keys of ``state`` must be exactly the
    checkpoint's top-level keys; otherwise only the given keys are restored.
    """
    with CheckpointReader(directory) as reader:
        if state is None:
            return load_tree(reader)
        return restore_into(reader, state, strict=strict)


def verify(directory) -> Manifest:
    """Re-check the manifest and every chunk's checksum; returns the manifest or raises."""
    with CheckpointReader(directory) as reader:
        reader.verify()
        return reader.manifest


def manifest(directory) -> Manifest:
    """The validated manifest of a committed checkpoint, without reading data."""
    return read_manifest(directory)
