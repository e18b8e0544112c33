"""The blob interface: bytes under '/'-separated keys, and what a store can promise.

A :class:`BlobStore` knows nothing of checkpoints, steps or manifests: the checkpoint
layer above it (sources, sinks, the commit rule, debris, the writer lock, the listing
of steps) is written once, on this interface, and reads the capability flags to choose
how to commit and how to lock.

Keys are relative paths under the store's root: non-empty components joined by ``/``,
none of them ``.`` or ``..``, no leading ``/``, no NUL; any other character is allowed.
Components starting with :data:`RESERVED` name a store's own temporary objects: callers
may not use them and listings never show them. A *prefix* is ``""`` (everything) or a
key-like path; ``"step_1"`` and ``"step_1/"`` both mean the keys below ``step_1/``
(never those of ``step_10``).

Call order (who calls what)
---------------------------
Writing, on every rank that writes (the checkpoint layer):
  1. :meth:`BlobStore.open_writer` (or :meth:`BlobStore.write`) for each data object:
     ``BlobWriter.write`` any number of times, then ``commit`` (the object appears whole,
     durably) or ``abort`` (nothing appears). Objects are written under a temporary
     prefix where the store has :attr:`~BlobStore.atomic_rename`, else under their final
     prefix. The process that will rename the temporary prefix may first declare it
     with :meth:`BlobStore.stage`: its own objects there then need not be durable one
     by one (the rename makes the prefix durable), until :meth:`BlobStore.unstage`.
Committing, on the coordinator only, after every rank's writers committed:
  2. with ``atomic_rename``: :meth:`BlobStore.rename_prefix` of the temporary prefix to
     the final one (refused if the final prefix holds anything; everything below the
     temporary prefix, whoever wrote it, is made durable before it moves); without it:
     :meth:`BlobStore.create_if_absent` of the object written last (the manifest), which
     exactly one of several racing writers wins where the store has
     :attr:`~BlobStore.conditional_create`.
Locking, by the writer of a root: :meth:`BlobStore.lock` where the store has
  :attr:`~BlobStore.advisory_locks`, else a lease object made with ``create_if_absent``.
Reading, by any process: :meth:`BlobStore.list` / :meth:`BlobStore.list_dir` (or, to
  list many checkpoints at once, :meth:`BlobStore.list_level` and
  :meth:`BlobStore.list_tree`), then
  :meth:`BlobStore.size` and :meth:`BlobStore.read_into` (or :meth:`BlobStore.read` for
  small objects, with a cap), or :meth:`BlobStore.open_reader` once per object, its
  ranges read through the reader, then ``close``.

Fast paths (optional: each has a generic default here that a store may override):
:meth:`BlobStore.write_pieces` (an object from ``(offset, bytes)`` pieces),
:meth:`BlobStore.write_image` (from a page-aligned image), :meth:`BlobStore.copy_in`
(from another store's reader), :meth:`BlobReader.read_vectored` (many buffers at once,
one request where :attr:`BlobStore.vectored_reads`).
Removing, by the writer only: :meth:`BlobStore.delete`, :meth:`BlobStore.delete_prefix`.

Every method may be called from any thread. Errors are :mod:`uckpt.errors` classes: a
missing key raises :class:`~uckpt.errors.CheckpointNotFoundError` (a
``FileNotFoundError``), a refused create or rename
:class:`~uckpt.errors.CheckpointExistsError` (a ``FileExistsError``), a bad key or offset
:class:`~uckpt.errors.InvalidKeyError` (a ``ValueError``), a lock held elsewhere
:class:`~uckpt.errors.RootLockedError`, an operation the store does not offer
:class:`~uckpt.errors.StoreCapabilityError`.
"""
from __future__ import annotations

import abc
import hashlib
import os
from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, ClassVar, NamedTuple, Self

from ...errors import (CheckpointNotFoundError, CorruptCheckpointError, InvalidKeyError,
                       NotRegularFileError, SaveError, StoreCapabilityError,
                       UnsupportedObjectError)

#: bytes streamed at once by :meth:`BlobStore.copy`'s and :meth:`BlobStore.copy_in`'s default
COPY_BLOCK = 8 << 20
#: zeros written at once into a gap between pieces (:meth:`BlobStore.write_pieces`)
ZEROS = bytes(1 << 16)
#: the first characters of a key component a store uses for its own temporary objects
RESERVED = ".uckpt-part-"

if TYPE_CHECKING:  # collections.abc.Buffer from Python 3.12 on
    from typing_extensions import Buffer

    #: what :meth:`BlobStore.write` takes: one buffer, or buffers one after another
    Data = Buffer | Iterable[Buffer]
    #: what :meth:`BlobStore.write_pieces` takes: ``(offset, bytes)`` sorted by offset
    Pieces = Iterable[tuple[int, Buffer]]


class Version(NamedTuple):
    """A small object read whole with its version (:meth:`BlobStore.read_versioned`)."""

    data: bytes
    #: changes with every write of the object (an ETag; else a hash of its bytes)
    tag: str
    #: when it was last written and when it was read, both on the store's clock (seconds
    #: since the epoch); None where the store has no clock to ask
    modified: float | None
    now: float | None


class Listing(NamedTuple):
    """One level below a prefix: the keys directly there, and the prefixes (each ending
    in ``/``) that hold further keys. Both are full keys from the store's root, sorted."""

    keys: list[str]
    prefixes: list[str]


class Level(NamedTuple):
    """One level below a prefix from one look (:meth:`BlobStore.list_level`): what
    :meth:`BlobStore.list_dir` and :meth:`BlobStore.others` show there, and the prefixes
    directly below that hold something at a given name. Full keys, sorted."""

    keys: list[str]
    prefixes: list[str]
    others: dict[str, str]
    #: the prefixes among ``prefixes`` at whose ``<prefix><name>`` something stands
    holding: list[str]


class Tree(NamedTuple):
    """Everything below a prefix from one walk (:meth:`BlobStore.list_tree`): every key
    however deep with its size, the prefixes and what else stands directly below (full
    keys), and what tells the prefix walked from one put in its place since."""

    keys: dict[str, int]
    prefixes: list[str]
    others: dict[str, str]
    #: a store of local files: the (device, inode) of the directory walked; else None
    token: tuple[int, int] | None


def check_key(key: object) -> str:
    """``key`` if it is a valid key (see the module's docstring), else InvalidKeyError."""
    if not isinstance(key, str):
        raise InvalidKeyError(f"a blob key must be a str, not {type(key).__name__}",
                              hint="pass the key as a '/'-separated relative path")
    if not key or key.startswith("/") or "\0" in key:
        raise InvalidKeyError(f"blob key {key!r} is empty, absolute or holds a NUL",
                              path=key, hint="keys are relative paths such as 'a/b.bin'")
    for part in key.split("/"):
        if part in ("", ".", ".."):
            raise InvalidKeyError(f"blob key {key!r} has an empty, '.' or '..' component: "
                                  "it could name something outside the store's root",
                                  path=key, hint="give the key as a normalized relative "
                                                 "path, such as 'a/b.bin'")
        if part.startswith(RESERVED):
            raise InvalidKeyError(f"blob key {key!r} uses the component prefix {RESERVED!r} "
                                  "reserved for a store's temporary objects", path=key,
                                  hint="choose another name for that component")
    return key


def check_prefix(prefix: object) -> str:
    """``prefix`` as ``""`` or ``"a/b/"`` (a trailing ``/`` added), else InvalidKeyError."""
    if prefix == "":
        return ""
    return check_key(prefix[:-1] if isinstance(prefix, str) and prefix.endswith("/")
                     else prefix) + "/"


def check_below_root(prefix: object, store: object) -> str:
    """``prefix`` as :func:`check_prefix` gives it; InvalidKeyError for the root."""
    checked = check_prefix(prefix)
    if not checked:
        raise InvalidKeyError(f"delete_prefix('') would empty the whole store {store}",
                              hint="name a prefix below the root")
    return checked


def check_rename(src: object, dst: object) -> tuple[str, str]:
    """The prefixes of a rename (as :func:`check_prefix` gives them); InvalidKeyError for
    the root, or where one lies within the other."""
    a, b = check_prefix(src), check_prefix(dst)
    if not a or not b or a.startswith(b) or b.startswith(a):
        raise InvalidKeyError(f"rename_prefix({src!r}, {dst!r}): the root cannot be renamed, "
                              "nor a prefix into itself or its parent",
                              hint="name two separate prefixes below the root")
    return a, b


def check_offset(key: str, offset: object) -> int:
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise InvalidKeyError(f"read of blob {key!r}: the offset must be an integer >= 0, "
                              f"not {offset!r}", path=key, hint="pass a byte offset >= 0")
    return offset


def writable_view(key: str, buf: Buffer) -> memoryview:
    """``buf`` as a flat writable byte view, or UnsupportedObjectError."""
    view = flat(buf)
    if view.readonly:
        raise UnsupportedObjectError(f"read of blob {key!r}: the buffer must be writable",
                                     path=key, hint="pass a bytearray or a writable NumPy "
                                                    "array")
    return view


def buffers(data: Data) -> Iterator[memoryview]:
    """The flat byte views of ``data`` (one buffer, or an iterable of them)."""
    if is_buffer(data):
        yield flat(data)  # type: ignore[arg-type]
        return
    for piece in data:  # type: ignore[union-attr]
        if not is_buffer(piece):
            raise UnsupportedObjectError(f"a blob is written from buffers, not from a "
                                         f"{type(piece).__name__}",
                                         hint="pass bytes, a bytearray, a memoryview or a "
                                              "NumPy array")
        yield flat(piece)


def is_buffer(obj: object) -> bool:
    try:
        memoryview(obj)  # type: ignore[arg-type]
    except TypeError:
        return False
    return True


def flat(buf: Buffer) -> memoryview:
    """``buf`` as a flat byte view, not copied (UnsupportedObjectError unless it is
    C-contiguous)."""
    view = memoryview(buf)
    if not view.c_contiguous:
        raise UnsupportedObjectError("a blob is read into or written from C-contiguous "
                                     "buffers only", hint="pass a contiguous copy "
                                                          "(numpy.ascontiguousarray)")
    return view.cast("B") if view.ndim != 1 or view.format != "B" else view


def closed(key: str) -> SaveError:
    """The error of a write to a writer already committed or aborted."""
    return SaveError(f"the writer of blob {key!r} is closed", hint="open a new writer")


class BlobWriter(abc.ABC):
    """One object being written: :meth:`write` buffers in order, then :meth:`commit`
    (the object appears whole, replacing any object of that key) or :meth:`abort`
    (nothing appears). As a context manager it commits on success, aborts on error."""

    key: str

    @abc.abstractmethod
    def write(self, data: Buffer) -> None:
        """Append ``data`` (the caller may reuse its memory once this returns)."""

    @abc.abstractmethod
    def commit(self) -> None:
        """Make the object visible, whole and durable (where the store is durable)."""

    @abc.abstractmethod
    def abort(self) -> None:
        """Drop what was written; calling it after :meth:`commit` does nothing."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if kind is None:
            self.commit()
        else:
            self.abort()


class BlobReader:
    """One object opened for reading (:meth:`BlobStore.open_reader`): sized once, then
    read in ranges from any number of threads until :meth:`close`. This default asks the
    store for each range; a store overrides it to keep the object open."""

    #: an open file descriptor of the object, where the store has one (for kernel copies)
    fd: int | None = None
    #: which way it reads, for messages (:meth:`BlobStore.open_medium_reader`)
    how: str = "store read"

    def __init__(self, store: BlobStore, key: str) -> None:
        self.store, self.key = store, key
        self.size = store.size(key)

    def read_into(self, offset: int, buf: Buffer) -> int:
        """As :meth:`BlobStore.read_into`."""
        return self.store.read_into(self.key, offset, buf)

    def read_vectored(self, offset: int, bufs: Iterable[Buffer]) -> int:
        """Fill ``bufs`` in order, as one range from ``offset``; the bytes read (fewer
        only where the object ends). One call where :attr:`BlobStore.vectored_reads`."""
        total = 0
        for buf in bufs:
            want = memoryview(buf).nbytes
            n = self.read_into(offset + total, buf) if want else 0
            total += n
            if n != want:
                break
        return total

    def close(self) -> None:
        """Done reading; a second call does nothing."""


class BlobLock(abc.ABC):
    """An advisory lock on a key, held until :meth:`release` (or the process ends)."""

    @abc.abstractmethod
    def release(self) -> None:
        """Drop the lock; a second call does nothing."""

    def note(self, data: bytes) -> None:
        """While held: make ``data`` the object of the lock's own key (its holder's
        record, read by anyone with :meth:`BlobStore.read`), in place, so that the lock
        stays held. Give every record of a key the same length (a reader may otherwise
        see the end of a longer old one)."""
        raise StoreCapabilityError(f"{type(self).__name__} keeps no record in its lock",
                                   hint="keep the record in an object of its own")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class BlobStore(abc.ABC):
    """Bytes under keys below one root (see the module's docstring for keys, the call
    order and the errors). Subclasses implement the abstract methods and, for each
    capability flag they set, the operation it promises."""

    #: :meth:`rename_prefix` moves every key below a prefix at once (readers see all of
    #: them under one name or the other) and never replaces anything
    atomic_rename: ClassVar[bool] = False
    #: :meth:`create_if_absent` is atomic: of racing callers exactly one wins, and the
    #: object appears whole (else it is a check then a write)
    conditional_create: bool = False
    #: :meth:`lock` gives advisory locks that other processes on the root respect
    advisory_locks: ClassVar[bool] = False
    #: writers bypass the page cache (O_DIRECT) where the medium takes it
    direct_io: ClassVar[bool] = False
    #: large objects are written in parts, several at once
    multipart: ClassVar[bool] = False
    #: committed objects outlive the process (and, on POSIX, a crash of the machine)
    durable: bool = True
    #: :meth:`replace_if` and :meth:`delete_if` are atomic, and :meth:`read_versioned`
    #: tells the store's clock (else they are a read, a compare, then a write)
    versioned: ClassVar[bool] = False
    #: for a remote store: bytes a reader should ask for in one ranged read, and ranged
    #: reads worth having in flight at once (0: the local defaults of :mod:`uckpt.knobs`)
    read_block_bytes: int = 0
    read_threads: int = 0
    #: a reader's :meth:`BlobReader.read_vectored` is one request, so adjacent ranges are
    #: worth reading together
    vectored_reads: ClassVar[bool] = False
    #: :meth:`exchange_prefix` swaps two prefixes at once where the medium takes it (it
    #: says False, changing nothing, where it does not)
    atomic_exchange: ClassVar[bool] = False
    #: each key is the regular file ``<root>/<key>`` of the local file system, and its
    #: prefixes directories that exist by themselves, even empty (the checkpoint layer
    #: then shows locations as :class:`~pathlib.Path`, as callers of a local root expect,
    #: and tells a missing checkpoint directory from one without a manifest)
    local_files: ClassVar[bool] = False

    # --- reading ------------------------------------------------------------------------
    @abc.abstractmethod
    def read_into(self, key: str, offset: int, buf: Buffer) -> int:
        """Fill ``buf`` with the object's bytes from ``offset``; returns how many were
        read: fewer than ``len(buf)`` only where the object ends (0 at or past its end).
        A missing key raises, even for an empty ``buf``."""

    @abc.abstractmethod
    def size(self, key: str) -> int:
        """The object's size in bytes."""

    def root_exists(self) -> bool:
        """Whether the store's root is there. This default: always (a prefix of an object
        store holds whatever is put under it); a store whose root is a directory says
        whether it exists, for it is made by the first write, never by a read."""
        return True

    def copy_of(self, prefix: str) -> str:
        """A name of the copy of the store that holds ``prefix``, the same for every
        process and store object that sees that copy (ranks sharing a node-local
        directory). This default: this store object's own (a copy in this process)."""
        import socket  # here, on first use: it imports selectors

        return f"{socket.gethostname()}:{os.getpid()}:{id(self)}"

    def exists(self, key: str) -> bool:
        try:
            self.size(key)
        except CheckpointNotFoundError:
            return False
        return True

    def age(self, key: str) -> float | None:
        """Seconds since the object was last written, by the store's own clock; None where
        the store cannot tell (the default). The checkpoint layer removes a dead save's
        objects on a store without advisory locks only once they are old enough."""
        return None

    def read(self, key: str, cap: int) -> bytes:
        """The whole object, refused (CorruptCheckpointError) when it holds more than
        ``cap`` bytes; at most ``cap + 1`` bytes are ever read."""
        buf = bytearray(min(self.size(key), cap) + 1)
        n = self.read_into(key, 0, buf)
        if n > cap:
            raise CorruptCheckpointError(f"blob {key!r} holds more than {cap} bytes, the "
                                         "most read for it", path=key,
                                         hint="it is not an object this reader expects")
        del buf[n:]
        return bytes(buf)

    def open_reader(self, key: str) -> BlobReader:
        """The object ``key`` opened for reading (CheckpointNotFoundError if missing);
        the caller closes it."""
        return BlobReader(self, key)

    def open_medium_reader(self, key: str) -> BlobReader:
        """The object opened to read what the storage medium holds, not a cache, where
        the store can (a local file: O_DIRECT; read with page-aligned buffers and
        offsets); its ``how`` says which way. This default: :meth:`open_reader` (an object
        store's ranged read, answered by the store from its own copies)."""
        return self.open_reader(key)

    @abc.abstractmethod
    def list(self, prefix: str = "") -> Iterator[tuple[str, int]]:
        """Every key below ``prefix``, however deep, with its size, in no set order."""

    @abc.abstractmethod
    def list_dir(self, prefix: str = "") -> Listing:
        """The keys and sub-prefixes directly below ``prefix``."""

    def others(self, prefix: str = "") -> dict[str, str]:
        """What else stands directly below ``prefix`` (neither an object nor a prefix), by
        full key, said in words: on a store of local files ``"a FIFO (named pipe)"``,
        ``"a symbolic link (to 'x')"``; never read nor followed. This default: nothing (a
        store that holds only objects)."""
        return {}

    def occupied(self, key: str) -> bool:
        """Whether something stands at ``key``: an object, or on a store of local files
        anything else there too (a directory, a symbolic link, a FIFO: never followed)."""
        try:
            if self.exists(key):
                return True
        except NotRegularFileError:
            return True
        parent = key.rpartition("/")[0]
        return self.local_files and key + "/" in self.list_dir(parent).prefixes

    def list_level(self, prefix: str = "", holding: str | None = None) -> Level:
        """:meth:`list_dir` and :meth:`others` of ``prefix`` at once and, where ``holding``
        is a name, the prefixes directly below at whose ``<prefix><holding>`` something
        stands (:meth:`occupied`): a listing of many checkpoints asks this once, not
        once per checkpoint. This default: those calls, one :meth:`occupied` per prefix;
        a store of local files makes it one directory scan and one ``lstat`` per prefix."""
        listing = self.list_dir(prefix)
        held = [p for p in listing.prefixes
                if holding is not None and self.occupied(p + holding)]
        return Level(listing.keys, listing.prefixes, self.others(prefix), held)

    def list_tree(self, prefix: str = "") -> Tree:
        """:meth:`list`, and :meth:`list_dir`'s prefixes and :meth:`others` of ``prefix``,
        at once. This default: those calls (no token); a store of local files walks the
        directory once."""
        keys = dict(self.list(prefix))
        return Tree(keys, self.list_dir(prefix).prefixes, self.others(prefix), None)

    # --- writing ------------------------------------------------------------------------
    @abc.abstractmethod
    def open_writer(self, key: str) -> BlobWriter:
        """A writer of the whole object ``key`` (streamed; multipart where the store
        has it)."""

    def write(self, key: str, data: Data) -> None:
        """Write the whole object ``key`` from one buffer or an iterable of buffers,
        replacing any object of that key; readers see the old or the new one whole."""
        with self.open_writer(key) as out:
            for view in buffers(data):
                out.write(view)

    def write_pieces(self, key: str, pieces: Pieces, size: int | None = None,
                     reserve: int = 0) -> None:
        """Write the whole object ``key`` from ``(offset, bytes)`` pieces sorted by offset
        (gaps are zeros), ``size`` bytes long (else ending with the last piece; ``reserve``:
        at most that many, a hint for preallocation). With neither, a piece's memory is
        the caller's again once the next piece is taken (it is copied); otherwise the
        pieces must stay as they are until this returns (a local store writes them from
        where they are, vectored). This default streams them through :meth:`open_writer`."""
        zeros = memoryview(ZEROS)
        pos = 0
        with self.open_writer(key) as out:
            def pad(to: int) -> None:
                nonlocal pos
                while pos < to:
                    n = min(len(zeros), to - pos)
                    out.write(zeros[:n])
                    pos += n
            for offset, piece in pieces:
                pad(offset)
                view = flat(piece)
                out.write(view)
                pos += len(view)
                del view, piece  # written: not held while the next piece is made
            if size is not None:
                pad(size)

    def write_image(self, key: str, image: Buffer, size: int) -> None:
        """Write the first ``size`` bytes of ``image`` as the object ``key``. ``image``
        is page-aligned and holds ``size`` rounded up to whole pages (a local store
        writes it with O_DIRECT); this default is :meth:`write`."""
        self.write(key, flat(image)[:size])

    def copy_in(self, key: str, reader: BlobReader, size: int) -> int:
        """Write the first ``size`` bytes of ``reader`` (an object of this or any store)
        as the object ``key``; returns the bytes copied (fewer only where the source
        ends, and then the object is not written). This default streams them through
        this process in bounded blocks; a local store copies in the kernel."""
        buf = memoryview(bytearray(min(COPY_BLOCK, max(size, 1))))
        done = 0
        out = self.open_writer(key)
        try:
            while done < size:
                want = min(len(buf), size - done)
                n = reader.read_into(done, buf[:want])
                out.write(buf[:n])
                done += n
                if n < want:  # cut short: nothing appears
                    out.abort()
                    return done
            out.commit()
        except BaseException:
            out.abort()
            raise
        return done

    @abc.abstractmethod
    def create_if_absent(self, key: str, data: Buffer) -> bool:
        """Write ``data`` to ``key`` unless an object of that key exists; returns whether
        it was written. Atomic where :attr:`conditional_create` is set (give racing
        callers different contents: a store may take an identical object for its own
        retried write)."""

    @abc.abstractmethod
    def delete(self, key: str, *, durable: bool = True) -> None:
        """Remove the object (a missing one is no error). ``durable=False``: the removal
        need not survive a crash of the machine (for an object that the caller takes
        for debris should it come back, such as a released save lease); a store whose
        removals cost nothing more to make durable ignores it."""

    @abc.abstractmethod
    def delete_prefix(self, prefix: str) -> None:
        """Remove every object below ``prefix`` (which must not be the root), and the
        store's temporary objects there."""

    # --- versions of small objects (a lease lock's), atomic where :attr:`versioned` -------
    def read_versioned(self, key: str, cap: int) -> Version:
        """The whole object (at most ``cap`` bytes) with its version tag; this default
        tags it by a hash of its bytes and knows no clock."""
        data = self.read(key, cap)
        return Version(data, hashlib.blake2b(data, digest_size=16).hexdigest(), None, None)

    def create_versioned(self, key: str, data: Buffer) -> str | None:
        """:meth:`create_if_absent`, returning the new object's tag (None: it existed)."""
        if not self.create_if_absent(key, data):
            return None
        return hashlib.blake2b(flat(data), digest_size=16).hexdigest()

    def replace_if(self, key: str, data: Buffer, tag: str) -> str | None:
        """Replace the object if its tag is still ``tag``; its new tag, or None if it was
        written or deleted meanwhile (this default: a read, a compare, then a write)."""
        try:
            if self.read_versioned(key, 1 << 20).tag != tag:
                return None
        except CheckpointNotFoundError:
            return None
        self.write(key, data)
        return hashlib.blake2b(flat(data), digest_size=16).hexdigest()

    def delete_if(self, key: str, tag: str) -> bool:
        """Delete the object if its tag is still ``tag``; whether it did (this default:
        a read, a compare, then a delete)."""
        try:
            if self.read_versioned(key, 1 << 20).tag != tag:
                return False
        except CheckpointNotFoundError:
            return False
        self.delete(key)
        return True

    def copy(self, src: str, dst: str) -> None:
        """Copy object ``src`` to ``dst`` (replacing it), on the server where the store
        can; this default streams it through this process in bounded blocks."""
        size = self.size(src)
        buf = memoryview(bytearray(min(COPY_BLOCK, max(size, 1))))
        done = 0
        with self.open_writer(dst) as out:
            while done < size:
                n = self.read_into(src, done, buf)
                if not n:
                    break
                out.write(buf[:n])
                done += n

    def abort_incomplete(self, prefix: str, older_than_s: float,
                         keep: Iterable[str] = ()) -> int:
        """Abort the store's own unfinished writes below ``prefix`` (multipart uploads)
        started at least ``older_than_s`` ago, except those below a prefix in ``keep``;
        returns how many. Nothing to do (the default) where a writer leaves nothing."""
        return 0

    # --- staging: a prefix whose objects one rename commits ------------------------------
    def stage(self, prefix: str) -> None:
        """Declare that what this store object writes or deletes below ``prefix`` from
        now on becomes visible only through ``rename_prefix(prefix, dst)`` (or
        ``exchange_prefix``), or is dropped by ``delete_prefix(prefix)``: each of those
        objects then need not be durable on its own, since the rename makes everything
        below ``prefix`` durable before it moves it. Call order: ``stage(prefix)``,
        this store object's writes below ``prefix``, then, after every writer there
        committed, the rename or ``delete_prefix`` (by this or another process), then
        :meth:`unstage`. Other store objects (other processes) writing below ``prefix``
        are unaffected: their objects stay durable one by one. The default does nothing:
        a store whose objects cost nothing more to make durable one by one ignores it."""

    def unstage(self, prefix: str) -> None:
        """End :meth:`stage` of ``prefix`` (nothing where it was not staged)."""

    # --- optional operations, promised by the capability flags ---------------------------
    def rename_prefix(self, src: str, dst: str) -> None:
        """Move every key below ``src`` to below ``dst``, atomically; refused with
        CheckpointExistsError if ``dst`` holds anything, CheckpointNotFoundError if
        ``src`` holds nothing (:attr:`atomic_rename`). Where the store is
        :attr:`durable`, every object below ``src`` is durable before it moves, and the
        move is durable when this returns."""
        raise self._lacks("atomic_rename", "rename_prefix")

    def exchange_prefix(self, a: str, b: str) -> bool:
        """Swap the keys below ``a`` with those below ``b`` at once (readers see either
        both before or both after; CheckpointNotFoundError if either holds nothing);
        False, changing nothing, where this medium cannot (:attr:`atomic_exchange`).
        Durable as :meth:`rename_prefix` is."""
        raise self._lacks("atomic_exchange", "exchange_prefix")

    def lock(self, key: str, *, shared: bool = False) -> BlobLock:
        """Take the advisory lock of ``key`` without waiting (RootLockedError if another
        holder has it; ``shared`` locks coexist) (:attr:`advisory_locks`)."""
        raise self._lacks("advisory_locks", "lock")

    def close(self) -> None:
        """Release what the store holds open (connections); the default does nothing."""

    def _lacks(self, flag: str, method: str) -> StoreCapabilityError:
        return StoreCapabilityError(f"{type(self).__name__} does not offer {method}() "
                                    f"({flag} is False)",
                                    hint=f"check the store's {flag} flag before calling "
                                         f"{method}()")
