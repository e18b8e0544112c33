"""The pre-release formats (integer ``format_version`` 1 to 6), read into the 1.0 model.

Isolated here so that the 1.0 parser carries none of their complexity; see
docs/format-legacy.md for what they were.
"""
from .parser import CODECS, PIPELINE_OF, READ_VERSIONS, parse

__all__ = ["CODECS", "PIPELINE_OF", "READ_VERSIONS", "parse"]
