"""``--select PATH``, ``--strip-prefix P``, ``--add-prefix P``: the part of a tree to convert,
and the names its top-level keys get (a ``model/`` subtree whose keys ``from_pretrained``
takes, a Lightning ``state_dict`` without its ``model.`` prefix).

``select`` is a uckpt array path (components joined with ``/``, docs/format.md 5.1): the
node there becomes the root, and what formats keep beside it (``Tree.extras``) moves with
it. The prefixes then apply to the keys of the root dict: ``strip`` removes ``P`` from the
keys that start with it (the others are kept, and a note says how many), ``add`` puts ``P``
before every key.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

from ..errors import UckptError
from ..tree.flatten import escape
from .interchange import Obj, Tree, children, key_text


class SelectError(UckptError, KeyError):
    """``--select`` names no node of the tree, or a prefix was asked of a root that is not
    a dict."""

    def __str__(self) -> str:  # KeyError would quote the message
        return UckptError.__str__(self)


def _child(node: Any, part: str) -> Any:
    if isinstance(node, Obj):
        node = node.state
    for name, child in children(node) or []:
        if name == part:
            return child
    raise KeyError(part)


def select(tree: Tree, path: str) -> None:
    """Make the node at ``path`` the root of ``tree``."""
    parts = path.strip("/").split("/") if path.strip("/") else []
    node = tree.root
    for i, part in enumerate(parts):
        try:
            node = _child(node, part)
        except KeyError:
            here = "/".join(parts[:i]) or "<root>"
            have = [n for n, _ in (children(node.state if isinstance(node, Obj) else node)
                                   or [])]
            raise SelectError(f"--select {path!r}: {here!r} has no {part!r}",
                              hint="it has: " + (", ".join(have[:12]) or "nothing") +
                                   (", ..." if len(have) > 12 else "") +
                                   "; see `uckpt inspect SRC` for the paths") from None
    if isinstance(node, Obj):
        node = node.state
    prefix = "/".join(parts)
    if prefix:  # the root's extras (what the file says of itself) stay; the rest moves up
        extras: Dict[str, Dict[str, Any]] = {"": dict(tree.extras.get("", {}))}
        extras[""].update(tree.extras.get(prefix, {}))
        for key, value in tree.extras.items():
            if key.startswith(prefix + "/"):
                extras[key[len(prefix) + 1:]] = value
        tree.extras = {k: v for k, v in extras.items() if v}
    tree.root = node


def rename_keys(tree: Tree, strip: Optional[str], add: Optional[str]) -> None:
    """Strip ``strip`` from, then put ``add`` before, the keys of the root dict."""
    if not strip and not add:
        return
    if not isinstance(tree.root, dict):
        raise SelectError(f"--strip-prefix and --add-prefix rename the keys of a dict, but "
                          f"the root is a {type(tree.root).__name__}",
                          hint="choose a dict with --select")
    out: Dict[Any, Any] = {}
    kept = 0
    renames: Dict[str, str] = {}
    for key, value in tree.root.items():
        name = key_text(key, [])
        new = name
        if strip:
            if name.startswith(strip):
                new = name[len(strip):]
            else:
                kept += 1
        if add:
            new = add + new
        if new in out:
            raise SelectError(f"renaming the keys makes {name!r} collide with another key as "
                              f"{new!r}", hint="choose other prefixes")
        if not new:
            raise SelectError(f"--strip-prefix {strip!r} leaves the key {name!r} empty")
        out[new] = value
        renames[escape(name)] = escape(new)
    if kept:
        tree.notes.append(f"--strip-prefix {strip!r}: {kept} key(s) of the root do not start "
                          "with it and are kept as they are")
    tree.root = out
    tree.extras = {_renamed(k, renames): v for k, v in tree.extras.items()}


def _renamed(path: str, renames: Dict[str, str]) -> str:
    if not path:
        return path
    head, sep, rest = path.partition("/")
    return renames.get(head, head) + sep + rest
