"""Which part of a tree a Hugging Face directory holds: the weights, the Trainer's files
beside them, and what it has no place for.

A tree ``{"model": <weights>, "optimizer": ..., "scheduler": ..., "rng_state": ...}`` (a
Trainer checkpoint, a DCP ``{"model": sd}``, a uckpt checkpoint of live objects) writes its
``model`` as the weights and the other parts as the Trainer's files. Other keys beside
``model`` (a training loop's ``step``, ``epoch``, ``rng``) have no file there: plain values
are left out with a note; arrays are refused, naming the keys and the ``--select`` that
writes the rest. Any other tree is the weights itself. ``uckpt diff`` lines a tree up
with its Hugging Face conversion through the same choice (:func:`comparable`).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from ..errors import UnsupportedObjectError
from .interchange import Leaf, Obj, walk

MODEL = "model"
#: tree key -> file of a Trainer checkpoint (``rng_state_<rank>.pth`` too, for several ranks)
TRAINER = {"optimizer": "optimizer.pt", "scheduler": "scheduler.pt", "scaler": "scaler.pt",
           "rng_state": "rng_state.pth"}


def describe(node: Any) -> str:
    """What a node of the tree is, in words a user knows (never an internal class name)."""
    if isinstance(node, Obj):
        return f"the state of a {node.cls} object"
    if isinstance(node, Leaf):
        return f"a {node.dtype} array of shape {tuple(node.shape)}"
    if isinstance(node, dict):
        return f"a dict of {len(node)} entries"
    if isinstance(node, (list, tuple)):
        return f"a {type(node).__name__} of {len(node)} items"
    return f"the value {node!r}"[:80]


def _is_part(key: Any) -> bool:
    return key in TRAINER or str(key).startswith("rng_state_")


def _state(node: Any) -> Any:
    return node.state if isinstance(node, Obj) else node


def _nested(root: Any) -> bool:
    """Whether ``root`` holds its weights under ``model`` (a dict, or a module's state)."""
    return isinstance(root, dict) and MODEL in root and isinstance(_state(root[MODEL]), dict)


def split_root(root: Any, notes: Optional[List[str]] = None
               ) -> Tuple[Any, Dict[str, Any]]:
    """(weights, Trainer parts) of a tree, as the module docstring says; the keys left out
    are named in ``notes``. Raises :class:`UnsupportedObjectError` for keys beside ``model``
    that hold arrays but are no Trainer part."""
    root = _state(root)
    if not _nested(root):
        return root, {}
    parts = {k: v for k, v in root.items() if _is_part(k)}
    rest = [k for k in root if k != MODEL and k not in parts]
    arrays = [k for k in rest if any(isinstance(n, Leaf) for _, n in walk(root[k]))]
    if arrays:
        keep = " ".join(f"--select {k}" for k in [MODEL, *parts])
        raise UnsupportedObjectError(
            f"a Hugging Face directory holds the weights ('{MODEL}') and the Trainer's "
            f"{', '.join(sorted(set(TRAINER)))}; "
            + "; ".join(f"{k!r} beside them holds {describe(root[k])} with arrays"
                        for k in arrays)
            + ", which it has no file for", leaf=str(arrays[0]),
            hint=f"convert the parts it holds with {keep} (or another format for the whole "
                 "tree: a uckpt directory, .pt, .safetensors)")
    if rest and notes is not None:
        notes.append(f"{', '.join(repr(k) for k in rest)} beside the weights ('{MODEL}'): "
                     "plain values a Hugging Face directory has no place for; not written")
    return _state(root[MODEL]), parts


def comparable(a: Any, b: Any, a_format: str, b_format: str) -> Tuple[Any, Any]:
    """Roots ``a`` and ``b`` lined up for ``uckpt diff`` when one is a Hugging Face directory
    of weights alone (a flat root) and the other nests them under ``model`` (what
    ``--to hf`` wrote it from): the other's ``model`` entries compare with the weights,
    its other keys by their own paths."""
    if a_format == "hf" and b_format != "hf" and not _nested(a) and _nested(_state(b)):
        return a, _unnested(_state(b))
    if b_format == "hf" and a_format != "hf" and not _nested(b) and _nested(_state(a)):
        return _unnested(_state(a)), b
    return a, b


def _unnested(root: Dict[str, Any]) -> Dict[str, Any]:
    weights = _state(root[MODEL])
    out = {k: v for k, v in root.items() if k != MODEL and k not in weights}
    return {**weights, **out}
