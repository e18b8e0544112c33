"""Keras's own ``.weights.h5`` layout, restored through the layer adapter.

Keras names what ``model.save_weights`` writes by the place of each object in the model
(``layers/conv2d/vars/0``, ``layers/functional/layers/dense/vars/1``, ``vars/0`` for the
model's own variables, ``optimizer/vars/3``), numbering each object's variables in the
order its ``save_own_variables`` stores them. A ``.weights.h5`` converted to uckpt keeps
those names; uckpt's own checkpoints of live models use variable names instead
(``conv2d/kernel``, see :mod:`.layers`). :func:`file_variables` asks Keras itself for its
layout (its saving walk, with a store that records instead of writing), so the layer
adapter restores a checkpoint of either layout: ``uckpt.load(dir, {"model": model})``.
The optimizer the model was compiled with is part of that layout, as in Keras's file; it
is built against ``model.trainable_variables`` first when the checkpoint holds its state
and it is not built yet (what ``model.fit`` would do on its first step).

The reverse, naming a live checkpoint's variables as Keras's file does without a model at
hand, is :mod:`uckpt.conversion.keras_names`.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Dict, List, Tuple

from uckpt.errors import UnsupportedObjectError

from .convert import flat

#: a leaf path of Keras's weights-file layout
_FILE_LEAF = re.compile(r"(^|/)vars/\d+$")


def is_file_layout(tree: Any) -> bool:
    """Whether a checkpoint subtree is in Keras's ``.weights.h5`` layout: a non-empty
    mapping whose every leaf sits at ``.../vars/<n>``."""
    if not isinstance(tree, Mapping):
        return False
    keys = list(flat(tree))
    return bool(keys) and all(_FILE_LEAF.search(k) for k in keys)


def _recorder_class():
    from keras.src.saving.saving_lib import H5IOStore

    class Recorder(H5IOStore):
        """Keras's write-side weights store, recording ``path/vars/key -> value`` instead
        of writing a file (Keras's ``_save_state`` accepts only its own store classes)."""

        def __init__(self) -> None:  # no file: nothing of H5IOStore's state is used
            self.entries: List[Tuple[str, Any]] = []
            self.names: Dict[str, str] = {}  # entry path -> the saveable's name
            self._path = ""

        def __bool__(self) -> bool:
            return True

        def make(self, path, metadata=None):
            self._path = path
            if metadata and isinstance(metadata.get("name"), str):
                self.names[path] = metadata["name"]
            return self

        def __setitem__(self, key, value) -> None:
            group = f"{self._path}/vars" if self._path else "vars"
            self.entries.append((f"{group}/{key}", (self._path, key, value)))

        def close(self) -> None:
            pass

    return Recorder


def _optimizers(model: Any) -> Dict[str, Any]:
    """The optimizers Keras's walk may meet in ``model``, by name (they save copies of their
    variables' values, so their entries are matched by position instead)."""
    out: Dict[str, Any] = {}
    opt = getattr(model, "optimizer", None)
    while opt is not None and hasattr(opt, "variables"):
        out.setdefault(getattr(opt, "name", ""), opt)
        opt = getattr(opt, "inner_optimizer", None)
    return out


def file_variables(model: Any) -> Dict[str, Any]:
    """``{"layers/dense/vars/0": variable, ...}``: every variable ``model.save_weights``
    writes, under the path Keras gives it in the file."""
    from keras.src.saving import saving_lib

    store = _recorder_class()()
    saving_lib._save_state(model, weights_store=store, assets_store=None, inner_path="",
                           visited_saveables=set())
    optimizers = _optimizers(model)
    out: Dict[str, Any] = {}
    for name, (path, key, value) in store.entries:
        if hasattr(value, "assign"):
            out[name] = value
            continue
        opt = optimizers.get(store.names.get(path, ""))
        index = int(key) if str(key).isdigit() else -1
        if opt is None or not 0 <= index < len(opt.variables):
            raise UnsupportedObjectError(
                f"Keras saves {name!r} of the {type(model).__name__} as a computed value, not "
                "a variable, so a checkpoint in Keras's file layout cannot be restored into it",
                leaf=name, hint="load the .weights.h5 file with model.load_weights instead")
        out[name] = opt.variables[index]
    return out


def build_optimizer(model: Any, tree: Mapping) -> None:
    """Build ``model.optimizer`` against ``model.trainable_variables`` when ``tree`` (in the
    file layout) holds optimizer state and the optimizer is not built yet."""
    opt = getattr(model, "optimizer", None)
    if opt is None or getattr(opt, "built", True) or "optimizer" not in tree:
        return
    opt.build(model.trainable_variables)
