"""The key report of a load with ``strict=False``: what was missing and what was unexpected;
and what the load read from storage (and, cooperative, received from other ranks).

``uckpt.load(..., strict=False, report=r)`` and ``CheckpointManager.restore`` fill a
:class:`LoadReport` given as ``report=`` (an out-parameter: ``load`` keeps returning the
loaded tree and ``restore`` the step, for every caller). Keys are leaf paths in the
checkpoint's naming (``"model/fc.weight"``, ``"optim"``), as ``uckpt.open`` and
``uckpt.load(path)``'s tree spell them.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import List, Sequence, Union

from ..tree.flatten import escape, join

log = logging.getLogger("uckpt.loading.report")

#: a key relative to an object: one tree key, or a tuple of them for a nested entry
Key = Union[str, int, Sequence[Union[str, int]]]


@dataclass
class LoadReport:
    """Keys that ``strict=False`` skipped, as ``torch.nn.Module.load_state_dict`` reports
    them: ``missing_keys`` are in the state but not in the checkpoint (left as they were),
    ``unexpected_keys`` in the checkpoint but not in the state (not read)."""

    missing_keys: List[str] = field(default_factory=list)
    unexpected_keys: List[str] = field(default_factory=list)
    #: bytes this rank's load read from storage (data files and manifest parts, through
    #: the checkpoint's source: :attr:`uckpt.storage.base.CheckpointSource.bytes_read`)
    bytes_read: int = field(default=0, compare=False)
    #: bytes of chunks other ranks read and sent to this one (a cooperative load,
    #: :mod:`uckpt.loading.cooperative`)
    bytes_received: int = field(default=0, compare=False)

    def clear(self) -> None:
        del self.missing_keys[:], self.unexpected_keys[:]

    def at(self, path_keys: List[str]) -> "KeySink":
        """The sink an adapter reports into, for the object at ``path_keys`` (escaped)."""
        return KeySink(self, path_keys)

    def log(self, what: str) -> None:
        """Log what was skipped, at INFO (a subset of the checkpoint's top-level keys is
        the usual ``strict=False`` load: not worth a warning each time)."""
        if self.missing_keys or self.unexpected_keys:
            log.info("%s with strict=False: %d missing key(s) %s, %d unexpected key(s) %s",
                     what, len(self.missing_keys), self.missing_keys[:10],
                     len(self.unexpected_keys), self.unexpected_keys[:10])


class KeySink:
    """Where an adapter's ``prepare`` reports keys of one object (see :class:`LoadReport`)."""

    def __init__(self, report: LoadReport, path_keys: List[str]) -> None:
        self.report = report
        self.path_keys = path_keys
        self.skipped: List[List[str]] = []  # unexpected keys, as tree keys: not read

    @staticmethod
    def parts(key: Key) -> List[str]:
        return [str(key)] if isinstance(key, (str, int)) else [str(k) for k in key]

    def path(self, key: Key) -> str:
        return join(self.path_keys + [escape(k) for k in self.parts(key)])

    def missing(self, key: Key) -> None:
        self.report.missing_keys.append(self.path(key))

    def unexpected(self, key: Key) -> None:
        self.report.unexpected_keys.append(self.path(key))
        self.skipped.append(self.parts(key))
