"""Standard JSON only (docs/format.md, section 3.1), for manifests and other headers.

``loads`` refuses what Python's ``json`` module accepts beyond RFC 8259 and the
format: the tokens ``NaN``/``Infinity``, numbers too large for a double (which
``json`` turns into infinity), duplicate keys, unpaired surrogates written as
``\\ud800`` escapes (invalid Unicode, which cannot even be printed), text that
is not UTF-8, and nesting too deep for the parser. Every refusal is a
``ValueError`` (``UnicodeDecodeError`` for bad UTF-8) saying why.
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from typing import Any, NoReturn

# a \\uD800-\\uDFFF escape: only these can leave a lone surrogate in a decoded string
# (paired ones are joined by the decoder; UTF-8 itself cannot encode surrogates)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _no_constants(token: str) -> NoReturn:
    raise ValueError(f"{token} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is too large for a double")
    return value


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise ValueError(f"duplicate key {ascii(k)[:80]}")
            seen.add(k)
    return out


def loads(data: bytes) -> Any:
    """Parse UTF-8 ``data`` as standard JSON; raises ``ValueError`` naming the problem."""
    text = data.decode("utf-8")
    try:
        doc = json.loads(text, parse_constant=_no_constants, parse_float=_finite,
                         object_pairs_hook=_no_duplicates)
    except RecursionError:
        raise ValueError("it nests too deeply") from None
    if _SURROGATE_ESCAPE.search(text):
        _refuse_lone_surrogates(doc)
    return doc


def _refuse_lone_surrogates(doc: Any) -> None:
    """Raise if a key or string value holds an unpaired surrogate (iteratively: any depth)."""
    stack = [doc]
    while stack:
        obj = stack.pop()
        strings: Iterable[str]
        if isinstance(obj, str):
            strings = (obj,)
        elif isinstance(obj, dict):
            strings = obj.keys()
            stack.extend(obj.values())
        elif isinstance(obj, list):
            stack.extend(obj)
            continue
        else:
            continue
        for s in strings:
            m = _SURROGATE.search(s)
            if m:
                raise ValueError(f"the string {ascii(s[:60])} holds an unpaired surrogate "
                                 f"(\\u{ord(m.group()):04x}); strings must be valid Unicode")
