"""PyTorch Lightning checkpoints through uckpt:
``Trainer(plugins=[uckpt.lightning.CheckpointIO()])``.

Importing this module imports ``lightning`` and ``torch``; ``import uckpt`` alone does not.

Lightning hands its ``CheckpointIO`` one dictionary per checkpoint (``state_dict``,
``optimizer_states``, ``lr_schedulers``, ``loops``, ``callbacks``, ``global_step``,
``epoch``, hyperparameters...). :class:`CheckpointIO` saves it as a uckpt checkpoint
directory at the path Lightning chooses (``.../epoch=0-step=8.ckpt`` becomes a
directory), tensors as arrays of their own dtype and everything else as plain values,
committed atomically: a save killed half way leaves the previous checkpoint at that
path whole. ``load_checkpoint`` gives the dictionary back with the same tensors, as
``torch.load`` would; no pickle is involved, so ``weights_only`` is always satisfied.

``blocking=False`` saves through uckpt's asynchronous saves: the call returns once the
tensors are copied to host memory, the write and commit run in the background, and
loading or removing a checkpoint, and ``teardown`` (the end of ``fit``), wait for the
saves still running (removing: those to its path) and raise the first error one of
them met. Lightning's own
``AsyncCheckpointIO(uckpt.lightning.CheckpointIO())`` works as well (its thread calls
the blocking save).
"""
from __future__ import annotations

import logging
import os
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch
from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO as _LightningCheckpointIO

from . import api
from .errors import NotACheckpointError
from .options import SaveOptions
from .loading.reader import CheckpointReader
from .loading.restore import load_tree
from .storage import local_path, locate, storage_options_for

log = logging.getLogger("uckpt.lightning")

__all__ = ["CheckpointIO"]


def _plain(x: Any) -> Any:
    """Lightning's dict subclasses (``AttributeDict``, ``OrderedDict``) as plain dicts, so
    that the tree holds the values, not the container classes."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_plain(v) for v in x]
    if isinstance(x, tuple) and not hasattr(x, "_fields"):
        return tuple(_plain(v) for v in x)
    return x


def _marks_tensors(node: Dict[str, Any]) -> bool:
    """Whether the manifest tree ``node`` holds an array saved as a torch tensor (an
    ``object`` node of the ``torch.tensor`` adapter), as this plugin saves them."""
    kind = node["type"]
    if kind == "object":
        return node.get("adapter") == "torch.tensor" or _marks_tensors(node["state"])
    items = node.get("items") if kind in ("dict", "list", "tuple") else None
    children = items.values() if isinstance(items, dict) else items or ()
    return any(_marks_tensors(n) for n in children)


def _tensors(node: Dict[str, Any], value: Any, device: Optional[torch.device],
             arrays: bool = False) -> Any:
    """``value`` (a loaded tree) with every leaf that was saved as a torch tensor (the manifest
    ``node`` says so) turned back into one, on ``device`` when given. ``arrays``: every
    array is a tensor (a tree whose writer did not mark its tensors: a Lightning ``.ckpt``
    converted by ``uckpt convert``, arrays saved from NumPy), NumPy scalars excepted."""
    from uckpt_torch.convert import from_numpy

    kind = node["type"]
    if (kind == "object" and node.get("adapter") == "torch.tensor") or (
            arrays and kind == "array" and isinstance(value, np.ndarray)):
        t = from_numpy(value)
        return t.to(device) if device is not None and device != t.device else t
    if kind == "object":
        return _tensors(node["state"], value, device, arrays)
    if kind == "dict":
        return {k: _tensors(n, v, device, arrays)
                for (k, v), n in zip(value.items(), node["items"].values())}
    if kind in ("list", "tuple"):
        out = [_tensors(n, v, device, arrays) for v, n in zip(value, node["items"])]
        return tuple(out) if kind == "tuple" else out
    return value


def _device(map_location: Any) -> Optional[torch.device]:
    """The device ``map_location`` sends CPU tensors to, or None to keep them on the CPU."""
    if map_location is None:
        return None
    if isinstance(map_location, (str, torch.device)):
        return torch.device(map_location)
    if isinstance(map_location, dict) and "cpu" in map_location:
        return torch.device(map_location["cpu"])
    log.debug("map_location %r is not a device: tensors are loaded on the CPU", map_location)
    return None


class CheckpointIO(_LightningCheckpointIO):
    """Lightning's ``CheckpointIO`` writing and reading uckpt checkpoints.

    ``blocking``: False for asynchronous saves (see the module docstring).
    ``storage_options``: for ``s3://`` checkpoint paths, as in :func:`uckpt.save`.
    ``save_options``: the layout of the checkpoints (a :class:`uckpt.SaveOptions`: chunk
    size, alignment, compression).
    """

    def __init__(self, *, blocking: bool = True,
                 storage_options: Optional[Dict[str, Any]] = None,
                 save_options: Optional[SaveOptions] = None) -> None:
        super().__init__()
        self.blocking = blocking
        self.storage_options = storage_options
        self.save_options = save_options
        self._pending: List[Tuple[str, Any]] = []  # (path, SaveHandle), oldest first

    def _options(self, path) -> Optional[Mapping[str, Any]]:
        return storage_options_for(path, self.storage_options)

    def save_checkpoint(self, checkpoint: Dict[str, Any], path,
                        storage_options: Optional[Any] = None) -> None:
        """Save Lightning's checkpoint dictionary at ``path`` (replacing what is there,
        atomically, as Lightning expects for ``last.ckpt``)."""
        if storage_options is not None:
            raise TypeError(f"uckpt.lightning.CheckpointIO takes no per-save storage_options "
                            f"(got {storage_options!r}); give them to the constructor")
        path = os.fspath(path)
        self._reap()
        step = checkpoint.get("global_step")
        done = api.save(path, _plain(checkpoint), overwrite=True, blocking=self.blocking,
                        step=step if isinstance(step, int) and step >= 0 else None,
                        storage_options=self._options(path), options=self.save_options)
        if not self.blocking:
            self._pending.append((path, done))

    def load_checkpoint(self, path, map_location: Optional[Any] = None,
                        weights_only: Optional[bool] = None) -> Dict[str, Any]:
        """The checkpoint dictionary saved at ``path``, tensors as tensors (on the CPU, or
        ``map_location`` when it names a device). ``weights_only`` is accepted for
        Lightning's sake: a uckpt checkpoint never holds code."""
        self.wait()
        path = os.fspath(path)
        with CheckpointReader(path, storage_options=self._options(path)) as reader:
            tree = load_tree(reader)
            node = reader.manifest.tree
            return _tensors(node, tree, _device(map_location), not _marks_tensors(node))

    def remove_checkpoint(self, path) -> None:
        """Delete the uckpt checkpoint at ``path`` (after a save to it still running); nothing
        if it is not there. A directory that is not a uckpt checkpoint is refused."""
        path = os.fspath(path)
        self.wait(path)
        store, name = locate(path, self._options(path))
        local = local_path(path)
        if local is not None and local.is_file():
            local.unlink()  # a torch.save file Lightning wrote before this plugin was used
        elif store.has(name):
            store.delete(name)
            log.info("removed checkpoint %s", path)
        elif local is not None and local.is_dir() and any(local.iterdir()):
            raise NotACheckpointError(f"{path!r} is a directory without manifest.json: not "
                                      "a uckpt checkpoint, so it was not removed",
                                      hint="remove it by hand if it is not needed")

    def wait(self, path: Optional[str] = None) -> None:
        """Wait for every asynchronous save still running (or those to ``path``); raise the
        first error."""
        pending = [(p, h) for p, h in self._pending if path is None or p == path]
        self._pending = [(p, h) for p, h in self._pending if (p, h) not in pending]
        errors = [e for e in (handle.exception() for _, handle in pending) if e is not None]
        if errors:
            raise errors[0]

    def _reap(self) -> None:
        """Forget finished saves, raising the first that failed."""
        finished = [h for _, h in self._pending if h.done()]
        self._pending = [(p, h) for p, h in self._pending if not h.done()]
        for handle in finished:
            error = handle.exception()
            if error is not None:
                raise error

    def teardown(self) -> None:
        self.wait()
