"""The storage seam: the one interface through which checkpoint bytes go.

Three small classes, implemented for local POSIX directories (:mod:`.local`) and for
S3-compatible object stores (:mod:`.objects`):

* :class:`Store`: a *root* holding checkpoints by name (a ``CheckpointManager`` tier
  holds ``step_00000042``, ...; ``uckpt.save("/a/b/ckpt")`` uses root ``/a/b``, name
  ``ckpt``). Lists committed checkpoints, opens sources and sinks, deletes, removes
  debris, and makes the root's writer lock.
* :class:`CheckpointSource`: one checkpoint being read: its manifest's bytes (capped),
  then byte ranges of its data files into the caller's buffers. The reader
  (:class:`uckpt.loading.reader.CheckpointReader`) checks every byte against its CRC-32C.
* :class:`CheckpointSink`: one checkpoint being written: data files, then the manifest
  last, which is the commit. Nothing is visible to readers before the commit.

Who calls what, and in what order (DCP style):

* a save (:mod:`uckpt.saving.collective`, every rank; a single process is a world of one):
  the coordinator (rank 0) calls :meth:`Store.sink` (checks the target, prepares the
  temporary place) and broadcasts :attr:`CheckpointSink.token`; every other rank calls
  :meth:`Store.join_sink` with it. Every rank then calls :meth:`CheckpointSink.replica`,
  writes its own data file (:meth:`~CheckpointSink.write_pieces`,
  :meth:`~CheckpointSink.write_image` or :meth:`~CheckpointSink.copy_file`), and the
  lowest rank of each view calls :meth:`~CheckpointSink.commit` with the manifest's
  bytes after every rank has written. Every rank finally calls
  :meth:`~CheckpointSink.release`, or :meth:`~CheckpointSink.abort` after a failure;
* a copy to another tier (:mod:`uckpt.manager.tiers`): a sink on the target store, each data
  file copied from a source on the first store, every copied byte read back through
  :meth:`CheckpointSink.written` and checked, then ``commit`` with the source's
  manifest bytes;
* the writer of a root (:class:`uckpt.CheckpointManager`, from its first save):
  :meth:`Store.writer_lock` then ``try_acquire`` once, :meth:`Store.remove_debris`,
  then saves and :meth:`Store.delete` (retention), each save after ``check`` of the
  lock (a lock with a lease can be lost); a rollback (:mod:`uckpt.manager.rollback`):
  :meth:`Store.put_record`, :meth:`Store.archive` for each base then each step moved,
  :meth:`Store.drop_record`. Readers call only :meth:`Store.steps` (which reads
  :meth:`Store.record`), :meth:`Store.has`, :meth:`Store.source`,
  :meth:`Store.archives`, :meth:`Store.within` and, at construction, ``peek`` of a lock;
* a listing (``uckpt ls``, ``verify --all``, ``tiers``; :mod:`uckpt.cli.scan`), which
  changes nothing: :meth:`Store.itself` (is the root a checkpoint?), else
  :meth:`Store.entries`; for each :data:`CHECKPOINT` entry :meth:`Store.source` to read
  its manifest, then its ``files`` against the manifest; :meth:`Store.still_there` to
  tell an entry that turned out damaged from one deleted or replaced meanwhile.

Every method raises errors of :mod:`uckpt.errors`; those of reading a damaged or
missing checkpoint are the ones ``CheckpointManager.restore`` falls back on.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import (TYPE_CHECKING, Any, Dict, Hashable, Iterable, List, Optional, Protocol,
                    Sequence, Tuple, Union)

from ..errors import CorruptCheckpointError, RootLockedError, TruncatedDataError
from .readback import SourceReader

if TYPE_CHECKING:  # collections.abc.Buffer from Python 3.12 on
    import numpy as np
    from numpy.typing import NDArray
    from typing_extensions import Buffer

    from ..format.model import Manifest

STEP_NAME = re.compile(r"^step_(\d+)$")
#: the most bytes read for a manifest (one more is read to tell); a larger one is refused
MAX_MANIFEST_BYTES = 1 << 30


class MediumReader(Protocol):
    """What :meth:`CheckpointSource.medium_reader` gives (:mod:`uckpt.storage.readback`)."""

    @property
    def how(self) -> str:
        """Which way it reads, for messages ("O_DIRECT", "store read", ...)."""

    def read(self, buf: Buffer, offset: int) -> int:
        """Fill ``buf`` from ``offset``; the bytes read (fewer only where the file ends)."""

    def close(self) -> None:
        """Done reading."""


class CheckpointSource:
    """One checkpoint, read. Call order: :meth:`manifest_bytes` (once), then
    :meth:`open_file` for each data file a read needs (before any array is allocated),
    then :meth:`read_into` any number of times from any number of threads, then
    :meth:`close`. ``manifest``, when a source is made with one, is the manifest of a
    checkpoint not yet committed (a copy being verified)."""

    #: the checkpoint's path or URL, for messages
    where: str = ""
    #: bytes a reader asks for at once within a chunk (each block is checksummed as it lands)
    block_bytes: int = 1 << 20
    #: whether adjacent chunks are read together (:meth:`read_vectored`) by ``read_arrays``
    coalesce: bool = False
    #: chunks read at once by ``read_arrays``, and checked at once by ``verify``
    read_threads: int = 1
    verify_threads: int = 1

    @property
    def location(self) -> Union[Path, str]:
        """Where the checkpoint is, as :meth:`Store.location` says it: a
        :class:`~pathlib.Path` in the local file system, else its URL."""
        return self.where

    def manifest_bytes(self) -> bytes:
        """The manifest's exact bytes, read up to the manifest size cap (+1 byte to tell).
        Raises NotACheckpointError if there is none, ManifestError if it is too large."""
        raise NotImplementedError

    def open_file(self, name: str, what: str = "data file") -> int:
        """Make data file ``name`` ready to read and return its actual size (raises
        CheckpointNotFoundError if it is missing, CorruptCheckpointError if it is not a
        plain file or object). ``what`` names the file in those errors (a manifest part is
        read through here too)."""
        raise NotImplementedError

    def read_into(self, name: str, buf: Buffer, offset: int) -> int:
        """Fill ``buf`` (a writable buffer) from data file ``name`` at ``offset``; return
        the bytes read (fewer only where the file ends). ``open_file(name)`` came first.
        May raise OSError (the reader names the leaf and offset) or a uckpt error."""
        raise NotImplementedError

    def read_vectored(self, name: str, bufs: Sequence[Buffer], offset: int) -> int:
        """Fill the flat byte buffers ``bufs`` in order, as one range of data file ``name``
        from ``offset``; return the bytes read (fewer only where the file ends). Like
        :meth:`read_into` (which this default calls for each buffer); a local file reads
        them with one system call."""
        total = 0
        for buf in bufs:
            want = memoryview(buf).nbytes
            n = self.read_into(name, buf, offset + total) if want else 0
            total += n
            if n != want:
                break
        return total

    #: whether the ranks of one node reading this checkpoint share their reads already (a
    #: local file system's page cache): a cooperative load's "auto" then leaves every rank
    #: to read what it loads (uckpt.loading.cooperative)
    shares_cache: bool = False

    @property
    def bytes_read(self) -> int:
        """The bytes read from the storage medium so far through :meth:`read_into` and
        :meth:`read_vectored` (data files and manifest parts; 0 where nothing is counted):
        what a load reports as read from storage (:class:`uckpt.LoadReport`)."""
        return 0

    def file_where(self, name: str) -> str:
        """The path or URL of data file ``name``, for messages."""
        raise NotImplementedError

    def medium_reader(self, name: str) -> MediumReader:
        """A reader of data file ``name`` from the storage medium, not a cache, where the
        store allows (:mod:`uckpt.storage.readback`): ``read(buf, offset) -> int``, ``close()``
        and ``how``. Here: :meth:`read_into` (an object store's ranged GET)."""
        return SourceReader(self, name)

    def sibling(self, name: str) -> "CheckpointSource":
        """The checkpoint ``name`` beside this one (same parent directory or prefix): a
        base of an incremental checkpoint (docs/format.md section 11.4). Only its data
        files are read, once its manifest was seen to exist (:func:`uncommitted_base`
        if not). Raises CheckpointNotFoundError if it does not exist,
        NotACheckpointError if it is not a directory (a symlink included)."""
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self) -> "CheckpointSource":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class CheckpointSink:
    """One checkpoint being written by one rank (see the module docstring for the order).

    ``token``: what the other ranks of a save pass to :meth:`Store.join_sink`.
    """

    token: str = ""
    where: str = ""
    #: :meth:`write_stream` is done with a piece's buffer once it takes the next piece
    #: (it copies them), so the caller may reuse the buffer then
    copies_stream_pieces: bool = False

    def replica(self) -> str:
        """Which copy of the storage this rank writes to: ranks that share a view share
        the files, and the lowest rank of each view commits (node-local directories are
        one view per node; an object store is one view)."""
        raise NotImplementedError

    def write_pieces(self, name: str, size: int, pieces: List[Tuple[int, Buffer]]) -> None:
        """Write data file ``name`` of ``size`` bytes from ``(offset, uint8 buffer)``
        pieces sorted by offset (gaps are zero), durably."""
        raise NotImplementedError

    def write_stream(self, name: str, pieces: Iterable[Tuple[int, Buffer]],
                     reserve: Optional[int] = None) -> None:
        """Write data file ``name`` from an iterator of ``(offset, uint8 buffer)`` pieces
        sorted by offset (gaps are zero; the file ends with the last piece), durably.
        Compressed chunks come this way, encoded while earlier ones are written, and so
        do an incremental save's changed chunks. ``reserve``: the pieces are views that
        stay valid until the call returns (without it, a piece's memory may be reused
        once the next one is asked for), and the file is at most this many bytes.
        This default gathers them first and calls :meth:`write_pieces`."""
        gathered = list(pieces)
        size = gathered[-1][0] + memoryview(gathered[-1][1]).nbytes if gathered else 0
        self.write_pieces(name, size, gathered)

    def write_image(self, name: str, image: NDArray[np.uint8], size: int) -> None:
        """Write data file ``name`` from ``image``, a page-aligned buffer holding the
        file's ``size`` bytes (and padding), durably."""
        raise NotImplementedError

    def copy_file(self, source: CheckpointSource, name: str, size: int) -> None:
        """Copy the first ``size`` bytes of ``source``'s data file ``name``, durably;
        TruncatedDataError if it holds fewer."""
        raise NotImplementedError

    def open_writer(self, name: str) -> Any:
        """A writer of file ``name`` (a context manager with ``write(buffer)``, the file
        complete when it exits without error): a file not in the manifest, e.g. a piece
        of redundancy across nodes (docs/format.md 13.3)."""
        raise NotImplementedError

    def written(self, manifest: Manifest) -> CheckpointSource:
        """A source over what this sink wrote, read back from storage, with ``manifest``
        (not yet committed): for verifying a copy before its commit."""
        raise NotImplementedError

    def commit(self, manifest_bytes: bytes, overwrite: bool = False) -> None:
        """Write the manifest last and make the checkpoint visible (one view's lowest
        rank, after every rank of the view has written). CheckpointExistsError if a
        committed checkpoint appeared meanwhile (unless ``overwrite``)."""
        raise NotImplementedError

    def release(self) -> None:
        """This rank is done with the save (committed, or cleaned up)."""

    def abort(self) -> None:
        """After a failure: remove what this rank wrote (best effort), then release."""
        raise NotImplementedError


class WriterLock:
    """A root's writer lock (see docs/architecture.md, "A root shared by many processes").

    Call order: :meth:`try_acquire` once (``None``: held; else the holder's record),
    :meth:`refusal` to build the error when refused, :meth:`check` before each save,
    :meth:`release` at the end. :meth:`peek` (a reader's look) needs none of these."""

    #: whether one rank of a job takes it for every rank (an object store, seen alike by
    #: all) rather than every rank for the copy it sees (local directories)
    one_per_job: bool = False
    job: str = ""

    def try_acquire(self) -> Optional[Dict[str, Any]]:
        raise NotImplementedError

    def holder(self) -> Dict[str, Any]:
        raise NotImplementedError

    def refusal(self) -> RootLockedError:
        raise NotImplementedError

    def release(self) -> None:
        raise NotImplementedError

    def check(self) -> None:
        """Raise :class:`~uckpt.errors.WriterLeaseLostError` if this holder lost the lock
        (a lock with a lease); a lock the kernel holds for the process cannot be lost."""

    def peek(self) -> Optional[Tuple[int, str]]:
        """Without taking it: a logging level and a sentence on who holds the lock now
        (None: nobody, or this kind of lock cannot be looked at without taking it)."""
        return None


#: kinds of :class:`Entry`
CHECKPOINT, TEMPORARY, STALE, LINK = "checkpoint", "temporary", "stale", "link"


@dataclass
class Entry:
    """One child of a root as :meth:`Store.entries` finds it (names and sizes only, no
    file read). ``kind``: :data:`CHECKPOINT` (named like a step, or holding a manifest:
    committed or damaged, as its manifest says), :data:`TEMPORARY` (what a save in progress
    or interrupted left), :data:`STALE` (left by an interrupted delete or overwrite) or
    :data:`LINK` (a symbolic link named like a checkpoint: never followed)."""

    name: str
    kind: str
    #: its path or URL, for messages and listings
    where: str
    #: the step its name carries (``step_N``, also hidden inside a temporary name)
    step: Optional[int] = None
    #: bytes of all its files (below it, for a directory)
    size: int = 0
    #: a CHECKPOINT's own plain files (not below a subdirectory): name -> size
    files: Dict[str, int] = field(default_factory=dict)
    #: its other entries, which are not plain files: name -> what they are ("a FIFO ...")
    not_plain: Dict[str, str] = field(default_factory=dict)
    #: what the store says of it: why it is TEMPORARY, STALE or a LINK, or why a
    #: CHECKPOINT could not be listed (then it is damaged)
    reason: str = ""
    #: what :meth:`Store.still_there` compares (the store's own; None: nothing)
    token: Any = None


class Store:
    """A root of checkpoints (a directory, or a prefix in a bucket)."""

    #: the root's path or URL as the user gave it (for messages and ``Tier.name``)
    where: str = ""

    def acts_here(self, rank: int) -> bool:
        """Whether ``rank`` removes debris, deletes and moves checkpoints of this root:
        every rank for the copy of a directory it sees (node-local or shared; ranks sharing
        one tolerate each other), rank 0 alone for an object store (one view for all)."""
        raise NotImplementedError

    # -- what a listing asks (never changes anything) -----------------------------------------
    def exists(self) -> bool:
        """Whether the root is there (a directory, a symlink to one included; a prefix of
        an object store always is: it holds whatever is put under it)."""
        raise NotImplementedError

    def identity(self) -> Hashable:
        """What tells roots apart however they are spelt (symlinks, ``..``, a trailing
        ``/``): equal for two stores of the same root."""
        raise NotImplementedError

    def itself(self) -> Optional[Entry]:
        """The root as a CHECKPOINT entry if it holds a manifest (a checkpoint given where a
        root was expected; read it with :func:`uckpt.storage.open_source` of
        :attr:`where`), else None. Raises CheckpointNotFoundError if the root does not
        exist, NotACheckpointError if it is not a directory."""
        raise NotImplementedError

    def entries(self) -> List[Entry]:
        """The children of the root that a listing shows, by name: checkpoints (committed
        or not), what saves in progress or interrupted left, what interrupted deletions
        left, symlinks named like any of them. Raises like :meth:`itself`."""
        raise NotImplementedError

    def still_there(self, entry: Entry) -> bool:
        """Whether ``entry`` (from :meth:`entries`) is still there, neither deleted nor
        replaced since it was listed (a local directory renamed away or another one in its
        place; an object store checkpoint whose manifest is gone: a deletion removes it
        first)."""
        raise NotImplementedError

    def location(self, name: str) -> Union[Path, str]:
        """Where checkpoint ``name`` of this root is: a :class:`~pathlib.Path` for a root
        in the local file system, else a URL (a ``str``). The public API hands it on as
        is (``CheckpointManager.path``, ``uckpt.convert``); messages and
        :attr:`Entry.where` use its ``str``."""
        raise NotImplementedError

    def steps(self) -> List[int]:
        """Steps of the committed ``step_N`` checkpoints of the root, oldest first."""
        raise NotImplementedError

    def has(self, name: str) -> bool:
        """Whether checkpoint ``name`` is committed (its manifest exists)."""
        raise NotImplementedError

    def files_present(self, name: str, files: Sequence[str]) -> bool:
        """Whether this process sees every one of ``files`` of checkpoint ``name``."""
        return True

    def source(self, name: str, manifest: Optional[Manifest] = None) -> CheckpointSource:
        raise NotImplementedError

    def check_target(self, name: str, overwrite: bool) -> None:
        """Refuse early (CheckpointExistsError) to replace what must not be replaced."""
        raise NotImplementedError

    def sink(self, name: str, overwrite: bool = False, shared: bool = False) -> CheckpointSink:
        """The coordinator's sink for a new checkpoint ``name`` (checks the target first).
        ``shared``: other ranks will join it."""
        raise NotImplementedError

    def join_sink(self, name: str, token: str) -> CheckpointSink:
        """Another rank's sink for the save the coordinator's ``token`` names."""
        raise NotImplementedError

    def rewriter(self, name: str, file: str) -> Any:
        """A writer (as :meth:`CheckpointSink.open_writer`) that replaces file ``file`` of
        committed checkpoint ``name`` whole: a share file or piece rebuilt from
        redundancy across nodes, checked against its record (docs/format.md 13.3)."""
        raise NotImplementedError

    def delete(self, name: str) -> bool:
        """Delete committed checkpoint ``name`` so that readers see it whole or not at all
        (hide or un-commit first, then remove the data). False if it was already gone."""
        raise NotImplementedError

    def remove_debris(self) -> List[str]:
        """Writer only: remove what dead saves and deletions left, never a live save's."""
        raise NotImplementedError

    def writer_lock(self, job: str, shared: bool) -> WriterLock:
        raise NotImplementedError

    def prepare_root(self) -> None:
        """Writer only: create the root if it does not exist."""

    # -- archives of rolled-back steps (:mod:`uckpt.storage.archive`) ----------------------
    def record(self, name: str) -> Optional[bytes]:
        """The bytes of the small root-level record ``name`` (capped), None if absent."""
        raise NotImplementedError

    def put_record(self, name: str, data: bytes) -> None:
        """Writer only: write root-level record ``name`` atomically and durably."""
        raise NotImplementedError

    def drop_record(self, name: str) -> None:
        """Writer only: remove root-level record ``name`` (absent is fine)."""
        raise NotImplementedError

    def archive(self, name: str, into: str, keep: bool = False) -> bool:
        """Writer only: move committed checkpoint ``name`` to ``into/name`` (``keep``: copy
        it there, hard links where the store has them, and keep it here), the manifest
        last there and, moving, first here. Idempotent: finishes a move or copy a kill
        interrupted. False if ``name`` is committed in neither place."""
        raise NotImplementedError

    def archives(self) -> List[str]:
        """Names of the archives under the root (``rollback_NNNN``), oldest first."""
        raise NotImplementedError

    def within(self, into: str) -> "Store":
        """The archive ``into`` of this root as a root of its own."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.where!r})"


def step_dir_name(step: int) -> str:
    """The name of checkpoint ``step`` in a ``CheckpointManager`` root."""
    return f"step_{step:08d}"


def step_of(name: str) -> Optional[int]:
    m = STEP_NAME.match(name)
    return int(m.group(1)) if m else None


def uncommitted_base(where: str, why: str) -> CorruptCheckpointError:
    """The error for a base of an incremental checkpoint that is not committed (``why``:
    what is missing); only committed checkpoints may be bases (docs/format.md 14.1)."""
    return CorruptCheckpointError(
        f"the base checkpoint {where!r} that the manifest refers to is not committed: {why}",
        path=where, hint="a checkpoint can only be read with all its bases committed; restore "
                         "an earlier checkpoint (CheckpointManager.restore() falls back to one "
                         "by itself)")


def wrong_size(where: str, actual: int, expected: int) -> CorruptCheckpointError:
    """The error for data file ``where`` of ``actual`` bytes where the manifest records
    ``expected`` (they must be equal, docs/format.md section 9): a TruncatedDataError if
    shorter, else a CorruptCheckpointError."""
    if actual < expected:
        return TruncatedDataError(f"data file {where!r} is truncated: {actual} bytes, the "
                                  f"manifest records {expected}", path=where, offset=actual)
    return CorruptCheckpointError(
        f"data file {where!r} is longer than the manifest records: {actual} bytes, the "
        f"manifest records {expected}", path=where,
        hint="the file was changed after its checkpoint was committed; restore an earlier "
             "checkpoint")
