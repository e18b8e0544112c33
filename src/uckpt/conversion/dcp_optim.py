"""Optimizer state in a DCP checkpoint: keys back to parameter ids.

DCP writes every dict key as a string, so a plain ``optimizer.state_dict()`` saved with
``torch.distributed.checkpoint.save`` comes back with its ``state`` keyed ``"0"``, ``"1"``...
while its ``param_groups`` still name the parameters ``0``, ``1``...; given to
``optimizer.load_state_dict`` it would restore no state at all, silently. Every dict of
the tree that looks like an optimizer state dict (``state``: a dict, ``param_groups``: a
list of dicts with ``params``) gets its ``state`` keys mapped back to the ids its groups
name. Keys that name no parameter id are kept, and a note (printed as a warning) says so.
State keyed by parameter names (what ``torch.distributed.checkpoint.state_dict`` writes)
is already right and left alone.
"""
from __future__ import annotations

from typing import Any, List

from ..tree.flatten import MAX_DEPTH, escape, join


def _params(groups: Any) -> List[Any]:
    if not isinstance(groups, list) or not all(isinstance(g, dict) and
                                               isinstance(g.get("params"), (list, tuple))
                                               for g in groups):
        return []
    return [p for g in groups for p in g["params"]]


def fix_state_keys(node: Any, notes: List[str], where: str, parts=None, depth: int = 0) -> Any:
    """``node`` with every optimizer ``state`` keyed by its parameter ids (see above)."""
    parts = parts or []
    if depth > MAX_DEPTH:
        return node
    if isinstance(node, list):
        return [fix_state_keys(v, notes, where, parts + [str(i)], depth + 1)
                for i, v in enumerate(node)]
    if not isinstance(node, dict):
        return node
    out = {k: fix_state_keys(v, notes, where, parts + [escape(str(k))], depth + 1)
           for k, v in node.items()}
    state, ids = out.get("state"), _params(out.get("param_groups"))
    if not isinstance(state, dict) or not ids or not all(type(i) is int for i in ids):
        return out
    by_text = {str(i): i for i in ids}
    fixed, unknown = {}, []
    for key, value in state.items():
        if type(key) is int and key in ids:
            fixed[key] = value
        elif isinstance(key, str) and key in by_text:
            fixed[by_text[key]] = value
        else:
            unknown.append(key)
            fixed[key] = value
    if unknown:
        notes.append(f"{where}: optimizer state at {join(parts) or '<root>'!r} has keys "
                     f"{unknown[:5]!r} that name none of the parameter ids of its param_groups "
                     f"({ids[:8]!r}); optimizer.load_state_dict would restore nothing for them")
    elif any(isinstance(k, str) for k in state):
        notes.append(f"{where}: optimizer state at {join(parts) or '<root>'!r}: DCP wrote its "
                     "keys as strings; mapped back to the parameter ids of its param_groups")
    out["state"] = fixed
    return out
