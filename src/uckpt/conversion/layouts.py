"""The frameworks' own file layouts in conversion: one call for ``convert`` and ``diff``.

A uckpt checkpoint of live objects keeps each object under its key in the state mapping
(``model``, ``optimizer``, ``trainer``); a framework's file holds one object's tree at its
root, in that framework's naming. ``adapt`` moves a tree between the two where the target
is read by a framework (Keras ``.weights.h5``: :mod:`.keras_names`; Chainer trainer
snapshots in NPZ/HDF5: :mod:`.chainer_names`) and nests a framework file's tree under
its key for a uckpt target (refusing Keras targets Keras could not read:
:func:`.keras_names.check_target`); ``comparable`` lines a file and its conversion up for ``diff``.
What is kept beside the tree (``Tree.extras``, e.g. HDF5 attributes) moves with it.
"""
from __future__ import annotations

from typing import Any, Dict, Tuple

from . import chainer_names, keras_names
from .interchange import Obj

#: (module, the key its file layout is nested under in a uckpt checkpoint)
_FRAMEWORKS = ((keras_names, keras_names.MODEL_KEY), (chainer_names, chainer_names.TRAINER_KEY))


def adapt(tree: Any, dst_format: str, dst: Any) -> None:
    """Rewrite ``tree.root`` (and its extras) for a ``dst_format`` target at ``dst``; trees
    of no known framework layout are left as they are."""
    if dst_format == "uckpt":
        for module, key in _FRAMEWORKS:
            if module.uckpt_root(tree.root) is not tree.root:
                tree.root = {key: tree.root}
                tree.extras = moved(tree.extras, "", key)
                return
        return
    keras_names.check_target(tree, dst_format, dst)
    if dst_format == "keras" or (dst_format == "hdf5" and str(dst).endswith(".weights.h5")):
        # Keras reads only these (a .keras archive holds a model.weights.h5)
        new, key = keras_names.weights_file_root(tree.root, tree.notes), keras_names.MODEL_KEY
    elif dst_format in ("npz", "hdf5"):
        new, key = chainer_names.snapshot_root(tree.root, tree.notes), chainer_names.TRAINER_KEY
    else:
        return
    if new is None:
        return
    old = tree.root.get(key)
    if old is new or (isinstance(old, Obj) and old.state is new):
        tree.extras = moved(tree.extras, key, "")
    tree.root = new


def comparable(a: Any, b: Any) -> Tuple[Any, Any]:
    """Roots ``a`` and ``b`` lined up for a path-by-path comparison: a framework file's tree
    and its conversion to uckpt (nested under ``model`` or ``trainer``) compare equal."""
    for module, _ in _FRAMEWORKS:
        if module.unnested(a) is not None and module.uckpt_root(b) is not b:
            return module.unnested(a), b
        if module.unnested(b) is not None and module.uckpt_root(a) is not a:
            return a, module.unnested(b)
    return a, b


def moved(extras: Dict[str, Any], old: str, new: str) -> Dict[str, Any]:
    """``extras`` re-keyed from paths under ``old`` to the same paths under ``new``."""
    out: Dict[str, Any] = {}
    for path, value in extras.items():
        if old and path != old and not path.startswith(old + "/"):
            key = path  # not in the moved subtree: a checkpoint-wide entry
        else:
            rest = path[len(old):].lstrip("/") if old else path
            key = "/".join(p for p in (new, rest) if p)
        out.setdefault(key, {}).update(value)
    return out
