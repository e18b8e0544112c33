"""What the manifest's parts share: the format's numeric limits (docs/format.md section 12,
rule 6) and short previews of manifest values for error messages."""
from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

MAX_INT = 2 ** 63 - 1  # sizes, offsets, extents, ranks and steps fit a signed 64-bit integer
MAX_DIMS = 64  # NumPy's limit


def show(obj: Any) -> str:
    """A short JSON-like preview of a value for an error message (never huge, never raises)."""
    if isinstance(obj, str):
        return key(obj)
    if isinstance(obj, bool) or obj is None or isinstance(obj, float):
        return json.dumps(obj)
    if isinstance(obj, int):
        if obj.bit_length() > 128:
            return f"an integer of {obj.bit_length()} bits"
        return str(obj)
    if isinstance(obj, list):
        return f"a list of {len(obj)} items"
    if isinstance(obj, dict):
        return f"an object of {len(obj)} members"
    return type(obj).__name__


def key(text: str) -> str:
    """A string quoted for a message, shortened when long."""
    return repr(text) if len(text) <= 80 else repr(text[:60]) + f"... ({len(text)} characters)"


def dims(shape: Sequence[Any]) -> str:
    """A shape's preview (its dimensions, shortened when long)."""
    text = ", ".join(map(show, shape))
    return f"[{text}]" if len(text) <= 200 else f"[{text[:180]}, ...] ({len(shape)} dimensions)"
