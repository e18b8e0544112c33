"""The code blocks of docs/format.md (format 1.0) and docs/format-legacy.md (pre-release
versions 1 to 6) that the tests run: each follows a ``<!-- test: name -->`` marker."""
import re
from pathlib import Path

import numpy as np

from uckpt import dtypes

DOCS = Path(__file__).resolve().parent.parent / "docs"
SPEC = DOCS / "format.md"
LEGACY = DOCS / "format-legacy.md"


def doc_block(name, doc=SPEC):
    """The fenced code block that follows ``<!-- test: name -->`` in ``doc``."""
    m = re.search(r"<!-- test: %s -->\n```[a-z]*\n(.*?)^```\n" % re.escape(name),
                  Path(doc).read_text(encoding="utf-8"), re.S | re.M)
    assert m, f"{Path(doc).name} has no block marked 'test: {name}'"
    return m.group(1)


def _run(name, doc):
    namespace = {}
    exec(compile(doc_block(name, doc), f"{Path(doc).name}:{name}", "exec"), namespace)
    return namespace


def reference_reader():
    """The namespace of docs/format.md's reference reader (``read_checkpoint``, ``decode``)."""
    return _run("reader", SPEC)


def legacy_reader():
    """The namespace of docs/format-legacy.md's reader of versions 1 to 6."""
    return _run("legacy-reader", LEGACY)


def reader_for(directory):
    """The reader of the documents for the checkpoint at ``directory``: the reference reader
    for format 1.0 (a string version), the legacy one for an integer ``format_version``."""
    text = (Path(directory) / "manifest.json").read_bytes()
    version = re.search(rb'"format_version"\s*:\s*("[^"]*"|\d+)', text)
    is_legacy = version is not None and not version.group(1).startswith(b'"')
    return legacy_reader() if is_legacy else reference_reader()


def as_read(value):
    """``value``, as uckpt loads it, the way the documents' readers give it: bfloat16 widened
    to float32, the float8 types as their uint8 bits (containers walked)."""
    if isinstance(value, (np.ndarray, np.generic)):
        name = dtypes.name_of(value.dtype)
        arr = np.asarray(value)
        if name == "bfloat16":
            arr = arr.astype(np.float32)  # exact
        elif name.startswith("float8"):
            arr = arr.view(np.uint8)
        return arr[()] if isinstance(value, np.generic) else arr
    if isinstance(value, dict):
        return {k: as_read(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(as_read(v) for v in value)
    return value


__all__ = ["as_read", "doc_block", "legacy_reader", "reference_reader", "reader_for"]
