"""The functional API: save, load, verify, inspect."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Mapping, Optional

from .commit import write_checkpoint
from .format import Manifest
from .reader import CheckpointReader, read_manifest
from .restore import load_tree, restore_into
from .tree import flatten


def save(directory, state: Mapping[str, Any], *, step: Optional[int] = None,
         metadata: Optional[Dict[str, Any]] = None, overwrite: bool = False) -> Path:
    """Save ``state`` to ``directory`` and commit it atomically; returns the directory.

    ``state`` maps names to framework objects (models, optimizers, schedulers,
    RNGs, ...), arrays and plain values. Refuses to replace an existing
    committed checkpoint unless ``overwrite=True``; the previous checkpoint is
    never damaged by a failed save.
    """
    return write_checkpoint(directory, flatten(state), step=step, metadata=metadata,
                            overwrite=overwrite)


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
