"""One hierarchy of errors for everything uckpt refuses.

Every error derives from :class:`UckptError` *and* from the built-in exception
a caller would naturally catch (a missing checkpoint is a ``FileNotFoundError``,
a malformed manifest a ``ValueError``, an unsupported object a ``TypeError``).
Messages say what went wrong, where (file, leaf, byte offset) and, when there is
one, how to fix it.
"""
from __future__ import annotations

import errno as _errno
from typing import Any, Dict, Iterable, Optional


class UckptError(Exception):
    """Base class of every error raised by uckpt."""

    def __init__(self, message: str, *, hint: Optional[str] = None, **where):
        self.hint = hint
        self.where = {k: v for k, v in where.items() if v is not None}
        for k, v in where.items():
            setattr(self, k, v)
        text = message
        if hint:
            text += f"\n  hint: {hint}"
        super().__init__(text)

    def at_path(self, path: str) -> "UckptError":
        """Name ``path`` (where the object sits in the state) in this error unless it does
        already; ``leaf`` becomes ``path`` if it was not set. For errors raised by code that
        does not know where its object sits (an adapter's ``extract``, ``prepare`` or
        ``restore``). Returns the error itself."""
        path = path or "<root>"
        if getattr(self, "leaf", None) is None:
            self.leaf = path
            self.where["leaf"] = path
        if self.args and repr(path) not in str(self.args[0]):
            self.args = (f"{path!r}: {self.args[0]}",) + tuple(self.args[1:])
        return self


class _OSFlavoured(UckptError, OSError):
    """Mixin that keeps ``OSError``'s attributes meaningful."""

    def __init__(self, message: str, *, errno: Optional[int] = None, hint=None, **where):
        UckptError.__init__(self, message, hint=hint, **where)
        self.errno = errno
        self.strerror = str(self.args[0]) if self.args else message
        self.filename = where.get("path")

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


# --- finding checkpoints -------------------------------------------------------------
class CheckpointNotFoundError(_OSFlavoured, FileNotFoundError):
    """The checkpoint (or a file it needs) does not exist."""

    def __init__(self, message: str, **kw: Any) -> None:
        kw.setdefault("errno", _errno.ENOENT)
        super().__init__(message, **kw)


class StoreNotFoundError(CheckpointNotFoundError):
    """The store itself (an object store's bucket) does not exist, so nothing in it can:
    not to be taken for one missing checkpoint."""


class NodeCopyLostError(CheckpointNotFoundError):
    """Some nodes' copies of a node-local tier hold checkpoints that another node's copy
    lacks altogether (that node was wiped or replaced), and no tier holds a checkpoint
    every rank can read: restoring nothing would silently start the job over."""


class NotACheckpointError(UckptError, ValueError):
    """The directory exists but is not a committed uckpt checkpoint."""


class CheckpointExistsError(_OSFlavoured, FileExistsError):
    """A save would replace an existing committed checkpoint."""

    def __init__(self, message: str, **kw: Any) -> None:
        kw.setdefault("errno", _errno.EEXIST)
        super().__init__(message, **kw)


class StepOrderError(UckptError, ValueError):
    """A ``CheckpointManager`` save of a step that is not above the newest step of the
    root's live line (a rollback, or a second stage counting from 1 again): refused before
    anything is written, since retention ranks by step and would delete it. ``newer``
    lists the newer steps."""


# --- reading the manifest ------------------------------------------------------------
class ManifestError(UckptError, ValueError):
    """The manifest is malformed: a field is missing, of the wrong type or inconsistent."""


class FormatVersionError(ManifestError):
    """The manifest declares a format version this uckpt cannot read."""


class UnsupportedExtensionError(FormatVersionError):
    """The manifest declares a required format extension this uckpt does not implement."""


class UnsafePathError(ManifestError):
    """A file name in the manifest escapes the checkpoint directory."""


# --- reading data -----------------------------------------------------------------------
class CorruptCheckpointError(UckptError, ValueError):
    """Stored bytes do not match what the manifest promises."""


class NotRegularFileError(CorruptCheckpointError):
    """What must be a regular file of a checkpoint (or an object of a local blob store) is
    something else, never read through: a symbolic link, a FIFO, a device, a directory.
    ``kind`` says what it is ("a symbolic link (to '/x')")."""

    kind: str


class ChecksumMismatchError(CorruptCheckpointError):
    """A chunk's checksum does not match its bytes."""


class TruncatedDataError(CorruptCheckpointError):
    """A data file is shorter than the chunks it should hold."""


class DamagedBaseError(CorruptCheckpointError):
    """An incremental save was committed referring to stored bytes that the background
    verification found damaged while it was written (:mod:`uckpt.saving.reverify`). In one
    process the save is written again, in full, over itself; with several ranks it is
    raised and the save is not reported as done (the next one writes in full)."""


class ManifestChecksumError(ManifestError, CorruptCheckpointError):
    """A manifest's bytes do not match the checksum it records, or a manifest (format 1.0,
    or pre-release 2 to 6) does not end in its checksum. ``stored`` and ``computed`` are the
    two checksums (None when there is no checksum to compare)."""


class ShareLostError(CorruptCheckpointError):
    """A node's share of a checkpoint on a level with redundancy across nodes is missing or
    damaged and cannot be rebuilt: its redundancy is gone too (two nodes of one XOR group,
    or a node and its partner). ``node``, ``ranks`` and ``step`` say whose share; the
    restore falls back to another tier."""


class MemoryLimitError(UckptError, MemoryError):
    """Reading would take more memory than the process may use: the arrays a manifest
    declares are more than ``max_bytes`` (or than the memory available, see
    :mod:`uckpt.runtime.memory`), refused before allocating; or an allocation failed while reading.
    ``need`` and ``limit``: the bytes asked for and allowed, where known."""


# --- objects and state ------------------------------------------------------------------
class UnsupportedObjectError(UckptError, TypeError):
    """No adapter knows how to extract or restore this object."""


class UnsupportedDtypeError(UckptError, TypeError):
    """The dtype has no neutral name in the uckpt format."""


class StateMismatchError(UckptError, ValueError):
    """The checkpoint does not fit the object it is restored into."""


class KeyMismatchError(StateMismatchError):
    """Keys are missing from the checkpoint or unexpected in it."""

    def __init__(self, what: str, *, missing: Iterable[str] = (), unexpected: Iterable[str] = (),
                 mismatched: Iterable[str] = (), hint=None, **where):
        self.missing = sorted(map(str, missing))
        self.unexpected = sorted(map(str, unexpected))
        self.mismatched = list(mismatched)
        lines = [f"{what} does not match the checkpoint"]
        if self.missing:
            lines.append(f"  missing from the checkpoint ({len(self.missing)}): "
                         + _short(self.missing))
        if self.unexpected:
            lines.append(f"  unexpected in the checkpoint ({len(self.unexpected)}): "
                         + _short(self.unexpected))
        for m in self.mismatched:
            lines.append(f"  mismatched: {m}")
        super().__init__("\n".join(lines), hint=hint, **where)


class UnknownKeyError(UckptError, KeyError):
    """A key or ``select=`` pattern names no leaf of the checkpoint (``uckpt.open(...)[key]``,
    ``uckpt.load(..., select=...)``); the message names it and the nearest keys there are."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return UckptError.__str__(self)


class UnsupportedIndexError(UckptError, IndexError):
    """An index of ``uckpt.open(...).slice(key)[...]`` that the lazy reader does not take
    (a step other than 1, ``None``, an array or list), or one out of range; the message
    names the key and the index."""

    def __str__(self) -> str:
        return UckptError.__str__(self)


class ShapeMismatchError(StateMismatchError):
    """A stored array has a different shape than its destination."""


class DtypeMismatchError(StateMismatchError):
    """A stored array has a different dtype than its destination."""


# --- writing ----------------------------------------------------------------------------------
class StorageFullError(_OSFlavoured):
    """No space was left on the device while writing a checkpoint."""

    def __init__(self, message: str, **kw: Any) -> None:
        kw.setdefault("errno", _errno.ENOSPC)
        super().__init__(message, **kw)


class LevelFullError(StorageFullError):
    """A save to a memory-level (``shm://``) tier would not fit in the free space of the
    node's shared memory: refused before its data is written (``needed``, ``free``: bytes)."""


class SaveError(UckptError, RuntimeError):
    """A save failed for a reason that is not one of the more specific errors."""




class RootLockedError(_OSFlavoured, BlockingIOError):
    """Another writer holds the checkpoint root (``holder``: its host, pid, job, mode)."""

    def __init__(self, message: str, **kw: Any) -> None:
        kw.setdefault("errno", _errno.EWOULDBLOCK)
        super().__init__(message, **kw)


class WriterLeaseLostError(RootLockedError):
    """This writer's lease on an object store root's writer lock ran out unrenewed or was
    taken over by another writer: it commits and deletes nothing more there."""


# --- storage ---------------------------------------------------------------------------------
class StorageError(_OSFlavoured):
    """The storage failed an operation, whatever kind it is (a directory, an object store):
    the base of the errors below, which a caller that only needs to know "this storage
    cannot be used now" catches (``CheckpointManager.restore`` skipping a tier)."""


class StorageAccessError(StorageError, PermissionError):
    """The storage refused to be written: a read-only file system, or no permission."""


class StorageUnavailableError(StorageError, ConnectionError):
    """The storage could not be reached, or kept failing (timeouts, connection resets,
    5xx answers), after every retry. ``endpoint`` names it."""

    def __init__(self, message: str, **kw: Any) -> None:
        kw.setdefault("errno", _errno.EHOSTUNREACH)
        super().__init__(message, **kw)


class ObjectStoreError(StorageError):
    """The object store answered with an error no more specific class describes
    (``code``: the S3 error code, ``status``: the HTTP status)."""

    def __init__(self, message: str, **kw: Any) -> None:
        kw.setdefault("errno", _errno.EIO)
        super().__init__(message, **kw)


class DurationError(UckptError, ValueError):
    """A duration (an MTBF, an interval) that cannot be read: not ``"90s"``, ``"30m"``,
    ``"6h"``, ``"2d"`` or a positive number of seconds."""


class StorageConfigError(UckptError, ValueError):
    """A malformed storage URL or ``storage_options``."""


class CompressionError(UckptError, ValueError):
    """An unknown ``compression=`` name or an invalid ``compression_level=``."""


class RedundancyConfigError(UckptError, ValueError):
    """A tier's ``redundancy=`` that cannot be used: not ``"partner"`` or ``"xor:G"`` (G >= 2),
    a scheme this uckpt does not build (``"rs:K+M"``), or one the job's nodes cannot hold
    (fewer than two nodes)."""


class OptionsError(UckptError, ValueError):
    """An options object (:class:`uckpt.SaveOptions`, the manager's option groups) or a
    keyword given a value it cannot take, or given twice (as a keyword and inside an
    options object); the message names the field."""


class StorageDependencyError(UckptError, ImportError):
    """The storage needs an optional package that is not installed."""


class InvalidKeyError(UckptError, ValueError):
    """A blob key or prefix that is not a relative '/'-separated path inside the store's
    root (empty, absolute, with ``.`` or ``..`` components), or a negative byte offset."""


class StoreCapabilityError(UckptError, NotImplementedError):
    """An operation a blob store does not offer (its capability flag is False)."""


# --- distributed ------------------------------------------------------------------------------
class DistributedError(UckptError, RuntimeError):
    """One or more ranks failed; raised on every rank.

    ``failures`` maps each failed rank to the text of its exception, ``kinds`` to the
    ``module.QualName`` of its exception's class and of every base class (ranks that
    failed without an exception, e.g. did not answer, have none).
    """

    def __init__(self, message: str, *, failures: Optional[Dict[int, str]] = None,
                 kinds: Optional[Dict[int, Iterable[str]]] = None, hint=None, **where):
        self.failures = dict(failures or {})
        self.kinds = {r: tuple(k) for r, k in (kinds or {}).items()}
        super().__init__(message, hint=hint, **where)

    def failed_with(self, *classes: type) -> bool:
        """Whether some rank failed with an exception of one of ``classes`` (subclasses
        included)."""
        names = {f"{c.__module__}.{c.__qualname__}" for c in classes}
        return any(names.intersection(k) for k in self.kinds.values())


class CollectiveTimeoutError(DistributedError, TimeoutError):
    """A collective did not complete within its timeout (a rank died or hangs).

    ``operation`` names the collective; ``missing`` lists the ranks known not to
    have answered (empty when the backend cannot tell).
    """

    def __init__(self, operation: str, timeout: float, *, missing: Iterable[int] = (),
                 detail: str = "", hint=None):
        self.operation = operation
        self.timeout = timeout
        self.missing = sorted(missing)
        who = (f"rank(s) {', '.join(map(str, self.missing))} did not answer" if self.missing
               else "the ranks that did not answer are unknown")
        msg = f"collective {operation!r} timed out after {timeout:g} s: {who}"
        if detail:
            msg += f" ({detail})"
        super().__init__(msg, failures={r: "did not answer" for r in self.missing},
                         hint=hint or "a rank probably died or is stuck; the communicator "
                                      "cannot be used any more, end the job")


class CommunicationError(DistributedError):
    """The backend failed a collective (e.g. a peer closed its connection)."""


def _short(items, limit: int = 20) -> str:
    items = list(items)
    text = ", ".join(items[:limit])
    if len(items) > limit:
        text += f", ... ({len(items) - limit} more)"
    return text


__all__ = [n for n in dir() if n.endswith("Error")]

