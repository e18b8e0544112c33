"""``--select``, ``--strip-prefix P``, ``--add-prefix P``: the part of a tree to convert,
and the names its top-level keys get (a ``model/`` subtree whose keys ``from_pretrained``
takes, a Lightning ``state_dict`` without its ``model.`` prefix).

``select`` takes glob patterns matched against leaf paths as ``uckpt.load``'s ``select=``
does (:mod:`uckpt.loading.selection`; paths are uckpt array paths, components joined with
``/``, docs/format.md 5.1): :func:`keep` drops every leaf no pattern picks, so it is never
read, and the others keep their paths. One pattern without wildcards names a node, and
:func:`select` makes it the root, as before patterns: what formats keep beside it
(``Tree.extras``) moves with it. The prefixes then apply to the keys of the root dict:
``strip`` removes ``P`` from the keys that start with it (the others are kept, and a note
says how many), ``add`` puts ``P`` before every key.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, List, Optional, Sequence

from ..errors import UnknownKeyError
from ..loading.selection import matches, unknown
from ..tree.flatten import escape
from .interchange import Obj, Tree, children, key_text, walk
from .layouts import moved


class SelectError(UnknownKeyError):
    """``--select`` names no node of the tree, or a prefix was asked of a root that is not
    a dict."""


def is_node_path(patterns: Sequence[str]) -> bool:
    """Whether ``select`` is one path without wildcards (the node :func:`select` roots at)."""
    return len(patterns) == 1 and not any(c in patterns[0] for c in "*?[")


def keep(tree: Tree, patterns: Sequence[str]) -> None:
    """Drop from ``tree`` every leaf no pattern picks (their containers too, when left
    empty; an item of a list or tuple becomes None, so the others keep their indices);
    a pattern that picks no leaf raises :class:`SelectError` naming it."""
    paths = [_path(parts) for parts, node in walk(tree.root)
             if children(node) is None and not isinstance(node, Obj)]
    for pattern in patterns:
        if not any(matches(p, pattern) for p in paths):
            e = unknown(pattern, paths, f"the {tree.format} source", "--select pattern")
            raise SelectError(str(e.args[0]).split("\n")[0], leaf=pattern,
                              hint=e.hint) from None
    tree.root = _kept(tree.root, [], patterns)


def _path(parts: List[str]) -> str:
    return "/".join(parts)


_GONE = object()  # what is left of a node without picked leaves


def _kept(node: Any, parts: List[str], patterns: Sequence[str]) -> Any:
    """``node`` at ``parts`` with only the leaves ``patterns`` pick (``_GONE``: none)."""
    if isinstance(node, Obj):
        state = _kept(node.state, parts, patterns)
        return _GONE if state is _GONE else replace(node, state=state)
    items = children(node)
    if items is None:
        path = _path(parts)
        return node if any(matches(path, p) for p in patterns) else _GONE
    kept = [_kept(child, parts + [name], patterns) for name, child in items]
    if all(value is _GONE for value in kept):
        return _GONE
    if isinstance(node, dict):
        return {key: value for key, value in zip(node, kept) if value is not _GONE}
    values = [None if value is _GONE else value for value in kept]
    return tuple(values) if isinstance(node, tuple) else values


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
    """Strip ``strip`` from, then put ``add`` before, the keys of the root dict (an ``add``
    ending with ``/``: nest the root under that path)."""
    nest = add if add and add.endswith("/") else None
    if nest:
        add = None
    _rename(tree, strip, add)
    if nest:
        _nest(tree, nest)


def _nest(tree: Tree, path: str) -> None:
    """Put the root under ``path`` (``a/b/``: ``{"a": {"b": root}}``), with its extras."""
    parts = path.strip("/").split("/")
    if any(not p or p in (".", "..") for p in parts):
        raise SelectError(f"--add-prefix {path!r}: a path to nest the tree under has no empty, "
                          "'.' or '..' components", hint="e.g. --add-prefix model/")
    root = tree.root
    for part in reversed(parts):
        root = {part: root}
    tree.root = root
    tree.extras = moved(tree.extras, "", "/".join(escape(p) for p in parts))


def _rename(tree: Tree, strip: Optional[str], add: Optional[str]) -> None:
    if not strip and not add:
        return
    if not isinstance(tree.root, dict):
        raise SelectError(f"--strip-prefix and --add-prefix rename the keys of a dict, but "
                          f"the root is a {type(tree.root).__name__}",
                          hint="choose a dict with --select")
    out: Dict[Any, Any] = {}
    kept = 0
    renames: Dict[str, str] = {}
    glued: List[str] = []
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
        if add and (children(value) is not None or isinstance(value, Obj)):
            glued.append(f"{name!r} -> {new!r}")
    if glued:
        tree.notes.append(f"--add-prefix {add!r} is glued to keys that hold groups ("
                          + ", ".join(glued[:3]) + (", ..." if len(glued) > 3 else "")
                          + f"); to put the tree under {add!r} instead, give "
                            f"--add-prefix {f'{add}/'!r}")
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
