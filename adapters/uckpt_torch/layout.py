"""PyTorch's own file layout, restored through the adapters.

A ``torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), ...})``
file converted to uckpt (``uckpt convert``) holds the state dicts as plain
mappings, without the ``"class"`` entry the adapters record. ``check_kind``
accepts such a mapping when its keys are exactly those of the live object's
own ``state_dict()`` (the class cannot be checked then, which is logged);
``align_compiled`` maps the ``_orig_mod.`` prefix that ``torch.compile`` adds to
a module's state-dict keys onto the keys of the module being restored, in either
direction. Both only read.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Dict, Iterable

from uckpt.errors import StateMismatchError

from .checks import check_class, class_name

log = logging.getLogger("uckpt.torch")

#: the prefix ``torch.compile``'s ``OptimizedModule`` puts before its module's keys
COMPILED = "_orig_mod."


def check_kind(obj: Any, tree: Any, what: str, note: bool = True) -> None:
    """Refuse ``tree`` for ``obj`` (an optimizer or scheduler) unless it records ``obj``'s
    class, or is a plain ``state_dict()`` of ``obj``'s kind (the same keys)."""
    if isinstance(tree, Mapping) and "class" not in tree:
        want = set(obj.state_dict())
        have = set(tree)
        if have == want:
            if note:
                log.info("restoring the %s %s from a plain state_dict (no 'class' entry, as in a "
                         "converted torch.save file): its class is not checked", what,
                         class_name(obj))
            return
        raise StateMismatchError(
            f"the checkpoint holds a mapping with keys {sorted(map(str, have))[:10]} where the "
            f"{what} {class_name(obj)} expects uckpt's {what} state or its own state_dict() "
            f"(keys {sorted(want)})",
            hint=f"pass the {what} at the key that holds its state (e.g. the 'optimizer' entry "
                 "of a converted torch.save file), or restore that subtree without it")
    check_class(obj, tree, what)


def _strip(key: str) -> str:
    return key[len(COMPILED):] if key.startswith(COMPILED) else key


def align_compiled(tree: Any, live: Iterable[str], module: str, note: bool = True) -> Any:
    """``tree`` with its keys renamed to ``live``'s where the two differ only by
    ``torch.compile``'s ``_orig_mod.`` prefix (a checkpoint of a compiled module restored
    into the plain one, or the reverse); ``tree`` itself when no key needs it. Logs the
    renaming when ``note``."""
    if not isinstance(tree, dict):
        return tree
    live = list(live)
    live_set = set(live)
    if all(k in live_set for k in tree):
        return tree
    by_plain: Dict[str, str] = {_strip(k): k for k in live}
    if len(by_plain) != len(live_set):
        return tree  # ambiguous: leave the mismatch to the key check
    out = {}
    renamed = 0
    for key, value in tree.items():
        target = key if key in live_set else by_plain.get(_strip(key), key) \
            if isinstance(key, str) else key
        renamed += target != key
        if target in out:
            return tree
        out[target] = value
    if renamed and note:
        log.info("the checkpoint's keys for the %s module %s torch.compile's %r prefix; "
                 "mapped onto the module's own keys (%d renamed)", module,
                 "carry" if any(isinstance(k, str) and k.startswith(COMPILED) for k in tree)
                 else "lack", COMPILED, renamed)
    return out
