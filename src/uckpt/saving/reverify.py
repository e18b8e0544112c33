"""Which stored chunks an incremental save may refer to: only those read back from the
storage medium and found intact (docs/architecture.md, "Incremental saves refer only to
verified bytes").

A :class:`Verifier` serves one ``CheckpointManager(..., incremental=True)`` on one rank
and watches the chunks that rank stores on the first tier (its data file of each
checkpoint). Call order, from the thread that writes saves (the caller's, or the
background save worker of ``async_save``):

1. :meth:`committed`, once a save is committed: raises
   :class:`~uckpt.errors.DamagedBaseError` if it refers to a chunk found damaged while
   it was written (the save is then redone in full, see
   :func:`uckpt.saving.collective.finish_or_redo`);
   queues the read-back of the chunks it wrote, and the re-read of each base it refers
   to that ``every`` saves have referred to since it was last read;
2. :meth:`usable`, when the next save starts writing: waits for the read-back of the
   checkpoint it compares with, then returns that baseline with only verified chunks
   left, or an empty one (a full save) once after damage was found;
3. :meth:`close`.

The reads run on two daemon threads: ``uckpt-readback`` (new saves' chunks, I/O
priority best-effort 7) and ``uckpt-reverify`` (bases, idle I/O class); see
:mod:`uckpt.storage.readback` for where the bytes come from.
"""
from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from typing import Callable, Dict, List, Optional, Set, Tuple

from ..errors import DamagedBaseError, UckptError
from ..format import Chunk, Manifest, data_file_name
from .incremental import Baseline
from ..storage.readback import block_buffer, lower_io_priority, stored_checksum
from ..loading.reader import read_manifest
from ..storage.base import step_of

log = logging.getLogger("uckpt.saving.reverify")

Stored = Tuple[str, Chunk]  # (leaf path, chunk)


class _Worker:
    """One daemon thread running queued jobs in order, at a low I/O priority."""

    def __init__(self, name: str, idle: bool) -> None:
        self.name, self.idle = name, idle
        self.jobs: "queue.Queue[Optional[Callable[[], None]]]" = queue.Queue()
        self.thread: Optional[threading.Thread] = None

    def put(self, job: Callable[[], None]) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
            self.thread.start()
        self.jobs.put(job)

    def _loop(self) -> None:
        log.debug("%s: I/O priority %s", self.name, lower_io_priority(self.idle))
        while True:
            job = self.jobs.get()
            if job is None:
                return
            job()

    def stop(self) -> None:
        if self.thread is not None:
            self.jobs.put(None)
            self.thread.join()
            self.thread = None


class Verifier:
    """The verified chunks of this rank's data files on ``store`` (see the module
    docstring); ``every``: re-read a base once every that many saves referring to it;
    ``name_of``: the checkpoint name of a step."""

    def __init__(self, store, rank: int, every: int, name_of: Callable[[int], str]) -> None:
        self.store, self.file, self.every = store, data_file_name(rank), every
        self.name_of = name_of  # step -> checkpoint name
        self._lock = threading.Lock()
        self._verified: Dict[str, Set[Tuple[str, int, str]]] = {}  # name -> (file, offset, crc)
        self._bad: Set[Tuple[str, str, int]] = set()  # (checkpoint, file, offset) found damaged
        self._full_next = False  # damage found: the next save refers to nothing
        self._reading: Dict[str, threading.Event] = {}  # read-backs queued, by checkpoint
        self._refs: Dict[str, int] = {}  # base -> saves referring to it since its last read
        self._rereading: Set[str] = set()
        self._stop = threading.Event()
        self._readback = _Worker("uckpt-readback", idle=False)
        self._reverify = _Worker("uckpt-reverify", idle=True)
        #: for tests: called on the reading thread with (checkpoint, file) before a read
        self.before_read: Optional[Callable[[str, str], None]] = None
        #: totals, for benchmarks: bytes read back, seconds reading, seconds saves waited
        self.bytes_read = 0
        self.read_seconds = 0.0
        self.waited_seconds = 0.0

    # -- the saving thread -----------------------------------------------------------------
    def committed(self, manifest: Manifest, name: str) -> None:
        """Checkpoint ``name`` (``manifest``) was committed: queue its reads (see above)."""
        mine = [(e.path, c) for e in manifest.arrays.values() for c in e.chunks
                if c.file == self.file and c.hash]
        bases: Dict[str, List[Stored]] = {}
        for leaf, c in mine:
            if c.base is not None:
                bases.setdefault(c.base, []).append((leaf, c))
        with self._lock:
            hit = sorted({(c.base or name, c.offset, leaf) for leaf, c in mine
                          if (c.base or name, c.file, c.offset) in self._bad})
            if hit:
                self._full_next = True
                base, offset, leaf = hit[0]
                raise DamagedBaseError(
                    f"{self.store.location(name)} was committed referring to "
                    f"{self.store.location(base)}/{self.file} (leaf {leaf!r}, byte offset "
                    f"{offset}), which was found damaged while it was written",
                    path=str(self.store.location(name)), leaf=leaf, offset=offset,
                    hint="save again (with one rank this is done at once): the next save "
                         "writes every chunk anew")
            done = self._reading[name] = threading.Event()
            for stale in set(self._reading) - {name}:
                del self._reading[stale]
            due = []
            for base, chunks in bases.items():
                self._refs[base] = self._refs.get(base, 0) + 1
                if self._refs[base] >= self.every and base not in self._rereading:
                    self._refs[base] = 0
                    self._rereading.add(base)
                    due.append((base, chunks))
            live = set(bases) | {name}  # what later saves can still refer to
            for table in (self._verified, self._refs):
                for gone in set(table) - live:
                    del table[gone]
        own = [(leaf, c) for leaf, c in mine if c.base is None]
        self._readback.put(lambda: self._check(name, own, done))
        for base, chunks in due:
            self._reverify.put(functools.partial(self._check, base, chunks, None))

    def usable(self, baseline: Optional[Baseline]) -> Baseline:
        """What the next save may compare with: ``baseline`` (the last save's chunks; None:
        a full save anyway) less every chunk of this rank not verified; an empty baseline
        once after damage was found."""
        done = self._reading.get(baseline.name) if baseline is not None else None
        if done is not None and not done.is_set():
            start = time.perf_counter()
            done.wait()
            self.waited_seconds += time.perf_counter() - start
        with self._lock:
            if self._full_next or baseline is None:
                if self._full_next:
                    log.info("damage was found in a base: this save writes every chunk")
                self._full_next = False
                return Baseline("")
            chunks = {k: c for k, c in baseline.chunks.items()
                      if (c.file, c.offset, c.checksum) in self._verified.get(c.base or "", ())}
        mine = sum(1 for c in baseline.chunks.values() if c.file == self.file)
        if len(chunks) < mine:  # (another rank's chunks are that rank's to refer to)
            log.info("%d of %d chunks of %s's baseline in %s are not verified (not read "
                     "back, or unreadable): written anew", mine - len(chunks), mine,
                     baseline.name, self.file)
        return Baseline(baseline.name, chunks, baseline.sizes)

    def forget(self, names) -> None:
        """Checkpoints ``names`` left the store's live line (a rollback moved them): once
        the reads queued so far are done, forget what they found, which says nothing of
        the checkpoints saved under those names from now on."""
        self.join()
        with self._lock:
            for table in (self._verified, self._refs, self._reading):
                for name in names:
                    table.pop(name, None)
            self._bad = {bad for bad in self._bad if bad[0] not in names}
            self._rereading.difference_update(names)

    def join(self) -> None:
        """Wait until every read queued so far is done (tests, benchmarks)."""
        for worker in (self._readback, self._reverify):
            if worker.thread is not None:
                done = threading.Event()
                worker.put(done.set)
                done.wait()

    def close(self) -> None:
        """Stop reading (a read in progress ends at its next chunk) and join the threads."""
        self._stop.set()
        self._readback.stop()
        self._reverify.stop()

    # -- the reading threads -------------------------------------------------------------
    def _check(self, name: str, chunks: List[Stored], done: Optional[threading.Event]) -> None:
        """Read ``chunks`` of checkpoint ``name`` back; record the intact ones as verified
        and the damaged ones as damage; ``done.set()`` at the end, whatever happens."""
        try:
            start = time.perf_counter()
            good, damaged = self._read(name, chunks)
            with self._lock:
                self.bytes_read += sum(c.length for _, c, _ in damaged) + sum(
                    c.length for _, c in chunks if (c.file, c.offset, c.checksum) in good)
                self.read_seconds += time.perf_counter() - start
                self._rereading.discard(name)
                if damaged:
                    self._damaged(name, damaged)
                elif good:
                    self._verified.setdefault(name, set()).update(good)
        except BaseException as e:  # noqa: BLE001 - a failed check only leaves chunks unverified
            log.error("reading back %s failed: %s: %s", self.store.location(name),
                      type(e).__name__, e)
        finally:
            if done is not None:
                done.set()

    def _read(self, name: str, chunks: List[Stored]):
        """(the verified chunks' keys, [(leaf, chunk, checksum read)] of the damaged ones)."""
        good: Set[Tuple[str, int, str]] = set()
        damaged: List[Tuple[str, Chunk, Optional[str]]] = []
        if not chunks or self._stop.is_set():
            return good, damaged
        if self.before_read is not None:
            self.before_read(name, self.file)
        try:
            with self.store.source(name) as source:
                reader = source.medium_reader(self.file)
                try:
                    buf = block_buffer()
                    for leaf, c in sorted(chunks, key=lambda lc: lc[1].offset):
                        if self._stop.is_set():
                            break
                        got = stored_checksum(reader, c.offset, c.length, buf)
                        if got == c.checksum:
                            good.add((c.file, c.offset, c.checksum))
                        else:
                            damaged.append((leaf, c, got))
                finally:
                    reader.close()
            log.debug("read back %d chunks of %s/%s (%s): %d damaged", len(chunks),
                      self.store.location(name), self.file, reader.how, len(damaged))
        except (UckptError, OSError) as e:  # deleted meanwhile, unreadable: left unverified
            log.info("%s/%s could not be read back (%s: %s): later saves write its chunks "
                     "anew", self.store.location(name), self.file, type(e).__name__, e)
        return good, damaged

    def _damaged(self, name: str, damaged) -> None:
        """Record damage in checkpoint ``name`` (under the lock, so that a save committed
        from now on that refers to it is refused by :meth:`committed`) and log it with
        every committed checkpoint that refers to it."""
        self._bad.update((name, c.file, c.offset) for _, c, _ in damaged)
        self._full_next = True
        self._verified.pop(name, None)
        keys = {(c.file, c.offset) for _, c, _ in damaged}
        for leaf, c, got in damaged:
            log.warning(
                "uckpt: damaged data in %s/%s: leaf %r, chunk at byte offset %d (length %d) "
                "reads back as %s, stored %s; committed steps that refer to it (they may not "
                "restore): %s; the next save writes every chunk anew",
                self.store.location(name), c.file, leaf, c.offset, c.length,
                got or "truncated", c.checksum, self._referrers(name, keys) or "none")

    def _referrers(self, name: str, keys: Set[Tuple[str, int]]) -> List[int]:
        """The committed steps whose manifests hold or refer to a chunk of checkpoint
        ``name`` at one of ``keys`` ((file, offset))."""
        first = step_of(name)
        out = []
        for s in self.store.steps():
            if first is not None and s < first:
                continue
            other = self.name_of(s)
            try:
                m = read_manifest(self.store.source(other))
            except UckptError:
                continue  # deleted meanwhile, or damaged itself
            if any((c.base or other) == name and (c.file, c.offset) in keys
                   for e in m.arrays.values() for c in e.chunks):
                out.append(s)
        return out
