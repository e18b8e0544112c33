"""Keras's ``.weights.h5`` naming for trees in conversion (no Keras needed).

Two layouts hold the same Keras state. A uckpt checkpoint of live objects
(``uckpt.save(d, {"model": model, "optimizer": model.optimizer})``) names each variable
in its layer (``model/dense/kernel``, ``model/batch_normalization/moving_mean``) and the
optimizer's by role (``optimizer/variables/iteration``, ``optimizer/slots/0/momentum``);
Keras's ``model.save_weights`` file numbers each object's variables in the order it
stores them (``layers/dense/vars/0``, ``vars/0`` for the model's own, ``optimizer/vars/0``).

* :func:`weights_file_root`: the tree to write as a ``.weights.h5`` file, in Keras's
  layout, from a checkpoint of live objects (or from a converted ``.weights.h5`` nested
  under ``model``); ``None`` when the tree is neither, so that it is written as it is.
* :func:`uckpt_root`: the tree to write as a uckpt checkpoint: a Keras ``.weights.h5``
  file's tree nested under ``model``, so that ``uckpt.load(d, {"model": model})``
  restores it (the layer adapter reads Keras's layout, see ``uckpt_tf.keras_files``).
* :func:`unnested`: the weights file's tree inside such a uckpt tree.
* :func:`check_target`: refuses what Keras could not read at the target's name (a model's
  weights to an HDF5 name other than ``*.weights.h5``; a legacy ``.h5`` to Keras 3's layout).

:mod:`.layouts` applies them for ``convert`` and ``diff``.

The live layout maps to Keras's by position, with no model at hand: a layer's variables
in the checkpoint's order are Keras's ``vars/0``, ``vars/1``, ... (both list trainable
then non-trainable variables in creation order), the ``seed_generator_state`` of
dropout-like layers is left out (Keras does not save it), every nested layer goes under
``layers/<its name>`` (as the layers of ``Sequential`` and functional models, e.g.
``keras.applications``, are), and the optimizer's variables in the checkpoint's order
are ``optimizer/vars/<n>`` (Keras's order when slots are created variable by variable, as
its built-in optimizers do; not Adam with ``amsgrad=True``). Layers that keep sublayers
as attributes (custom layers, ``MultiHeadAttention``) are named after the attribute in
Keras's file, which only the model knows: convert those from a ``.weights.h5`` written by
Keras, or restore the uckpt checkpoint and call ``model.save_weights``.
"""
from __future__ import annotations

import re
from typing import Any, Dict, List, Optional

from pathlib import PurePath

from ..errors import UnsupportedObjectError
from .errors import KerasLayoutError
from .interchange import Leaf, Obj, Tree, walk

LAYER, OPTIMIZER = "keras.layer", "keras.optimizer"
#: the key a Keras weights file's tree is nested under in a uckpt checkpoint
MODEL_KEY = "model"
#: variables Keras's weights files leave out
_NOT_SAVED = ("seed_generator_state",)
_FILE_LEAF = re.compile(r"(^|/)vars/\d+$")


def is_weights_file(node: Any) -> bool:
    """Whether ``node`` is a Keras ``.weights.h5`` tree: a dict whose every array leaf sits
    at ``.../vars/<n>`` (plain values, as HDF5 attributes, do not count)."""
    if not isinstance(node, dict) or isinstance(node, Obj):
        return False
    paths = ["/".join(parts) for parts, leaf in walk(node) if isinstance(leaf, Leaf)]
    return bool(paths) and all(_FILE_LEAF.search(p) for p in paths)


def uckpt_root(root: Any) -> Any:
    """``{"model": root}`` for a Keras weights file's tree; ``root`` for any other (one
    nested under ``model`` already, e.g. by ``--add-prefix model/``, too)."""
    return {MODEL_KEY: root} if is_weights_file(root) and unnested(root) is None else root


def unnested(root: Any) -> Any:
    """A Keras weights file's tree that a uckpt checkpoint holds under ``model``, or None."""
    if isinstance(root, dict) and set(root) == {MODEL_KEY} and is_weights_file(root[MODEL_KEY]):
        return root[MODEL_KEY]
    return None


def check_target(tree: Tree, dst_format: str, dst: Any) -> None:
    """Refuse a target Keras could not read: the weights of one Keras model (live, or in
    Keras's file layout) to an HDF5 name other than ``*.weights.h5`` (Keras 3's
    ``load_weights`` reads any other ``.h5`` name as a legacy file, and finds 0 layers in
    it), and a legacy Keras ``.h5`` to a ``.keras`` or ``.weights.h5`` target (its weights
    are named by layer, and its model config is in the legacy form Keras 3's
    ``load_model`` does not take from an archive: only Keras maps the model across)."""
    name = PurePath(str(dst)).name
    weights_name = name.endswith(".weights.h5")
    if dst_format == "keras" or (dst_format == "hdf5" and weights_name):
        legacy = _legacy_group(tree)
        if legacy is not None:
            target = "a .keras archive" if dst_format == "keras" else "a .weights.h5 file"
            raise KerasLayoutError(
                f"{name!r}: the source is a legacy Keras HDF5 file (layer_names on "
                f"{legacy or 'the root'}), which cannot become {target} without Keras: "
                "Keras 3 names the weights by their place in the model (layers/dense/vars/0), "
                "and its load_model takes the model's config only in its own form",
                path=str(dst), hint="let Keras convert it: keras.models.load_model('m.h5')"
                ".save('m.keras') (or .save_weights('m.weights.h5')); uckpt converts a legacy "
                ".h5 to .h5, .npz, .pt, .safetensors or a uckpt checkpoint")
    elif dst_format == "hdf5" and _holds_one_model(tree.root):
        stem = name[:-len(PurePath(name).suffix)] if PurePath(name).suffix else name
        raise KerasLayoutError(
            f"{name!r}: the checkpoint holds a Keras model's weights, and Keras 3's "
            "model.load_weights reads them only from a file named *.weights.h5 (any other "
            ".h5 name is read as a legacy HDF5 file, in which it finds no layers)",
            path=str(dst), hint=f"name the target {stem + '.weights.h5'!r}")


def _legacy_group(tree: Tree) -> Optional[str]:
    """Where a legacy Keras ``.h5`` (``model.save`` or ``save_weights``) keeps its
    ``layer_names`` attribute (``""``: the root), or None for any other tree."""
    from .hdf5 import ATTRS  # not at import: the HDF5 module is for HDF5 files only

    for path in ("model_weights", ""):
        if "layer_names" in tree.extras.get(path, {}).get(ATTRS, {}):
            return path
    return None


def _holds_one_model(root: Any) -> bool:
    """Whether ``root`` is a Keras weights file's tree (at the root or under ``model``) or
    holds exactly one live Keras model at its top level."""
    if is_weights_file(root) or unnested(root) is not None:
        return True
    return isinstance(root, dict) and len(_objects(root, LAYER)) == 1


def _objects(root: Dict[Any, Any], adapter: str) -> List[Any]:
    return [k for k, v in root.items() if isinstance(v, Obj) and v.adapter == adapter]


def weights_file_root(root: Any, notes: List[str]) -> Optional[Dict[str, Any]]:
    """The tree of a ``.weights.h5`` file that ``model.load_weights`` accepts, from a uckpt
    tree holding one live Keras model (and at most one Keras optimizer) at its top level,
    or a Keras weights file's tree under ``model``; None for any other tree. What the file
    cannot hold (other top-level entries) is listed in ``notes``."""
    if not isinstance(root, dict):
        return None
    if unnested(root) is not None:
        return unnested(root)
    models, optimizers = _objects(root, LAYER), _objects(root, OPTIMIZER)
    if not models:
        return None
    if len(models) > 1 or len(optimizers) > 1:
        raise UnsupportedObjectError(
            f"a .weights.h5 file holds one Keras model and its optimizer; the checkpoint holds "
            f"models at {models!r} and optimizers at {optimizers!r}",
            hint="convert one model at a time (select its entries)")
    out: Dict[str, Any] = {}
    _layer(root[models[0]].state, out, [str(models[0])])
    if optimizers:
        out["optimizer"] = {"vars": _numbered(_optimizer_leaves(root[optimizers[0]].state))}
    dropped = [str(k) for k in root if k not in models + optimizers]
    if dropped:
        notes.append("a .weights.h5 file holds only the model and its optimizer: left out "
                     + ", ".join(map(repr, dropped)))
    return out


def _numbered(leaves: List[Leaf]) -> Dict[str, Leaf]:
    return {str(i): leaf for i, leaf in enumerate(leaves)}


def _layer(state: Any, out: Dict[str, Any], parts: List[str]) -> None:
    """Fill ``out`` (one object's group in Keras's file) from a layer's live tree."""
    if not isinstance(state, dict):
        raise UnsupportedObjectError(f"{'/'.join(parts)!r}: a Keras layer's state is a "
                                     f"{type(state).__name__}, not a mapping of variables")
    own = [v for k, v in state.items() if isinstance(v, Leaf) and k not in _NOT_SAVED]
    if own:
        out["vars"] = _numbered(own)
    for key, value in state.items():
        if key == "_other":
            raise UnsupportedObjectError(
                f"{'/'.join(parts + [key])!r}: variables the layer walk could not place have "
                "no name in Keras's file layout", leaf="/".join(parts + [key]),
                hint="restore the checkpoint into the model and call model.save_weights")
        if isinstance(value, dict):
            sub: Dict[str, Any] = {}
            _layer(value, sub, parts + [str(key)])
            if sub:
                out.setdefault("layers", {})[str(key)] = sub
        elif not isinstance(value, Leaf):
            raise UnsupportedObjectError(f"{'/'.join(parts + [str(key)])!r}: a "
                                         f"{type(value).__name__} where a Keras layer holds "
                                         "variables and sublayers")


def _optimizer_leaves(state: Any) -> List[Leaf]:
    """The optimizer's variables in Keras's order (``variables``, then ``slots``, as its
    adapter lists them)."""
    if not isinstance(state, dict) or "inner_optimizer" in state:
        raise UnsupportedObjectError(
            "only a plain Keras optimizer's state maps onto Keras's file layout (not a "
            "LossScaleOptimizer's)", hint="restore the checkpoint into the model and call "
                                          "model.save_weights")
    return [leaf for part in ("variables", "slots")
            for _, leaf in walk(state.get(part, {})) if isinstance(leaf, Leaf)]
