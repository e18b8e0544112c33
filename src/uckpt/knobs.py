"""Process-wide tuning, in one place (tests flip them to exercise edge cases).

These change how fast uckpt works (threads, buffer and block sizes), timeouts and
expiries, never the bytes a save writes: what shapes a checkpoint's layout (chunk
sizes, alignment, compression) is passed to each save as a :class:`uckpt.SaveOptions`
(:mod:`uckpt.options`), so that saves in one process with different layouts do not
interfere.

Each can be overridden by an environment variable of the same name, upper-cased
and prefixed with ``UCKPT_`` (e.g. ``UCKPT_IO_THREADS``), read once at import.
"""
from __future__ import annotations

import os


def _env_int(name: str, default: int) -> int:
    value = os.environ.get("UCKPT_" + name.upper())
    return int(value) if value else default


#: threads that read chunks and check their checksums in parallel when loading (an
#: object store also verifies on this many; saves do not use it, see uckpt.saving.writer)
io_threads: int = _env_int("io_threads", max(2, min(8, (os.cpu_count() or 2))))
#: threads that compress chunks in parallel; a chunk of at least ``compress_split_bytes``
#: that is a large share of its file is compressed on this many threads of Zstandard's own
compress_threads: int = _env_int("compress_threads", max(2, min(8, (os.cpu_count() or 2))))
compress_split_bytes: int = _env_int("compress_split_bytes", 4 << 20)
#: chunks are compressed ahead of the writing: a few, or more while they total at most this
compress_ahead_bytes: int = _env_int("compress_ahead_bytes", 32 << 20)
#: streamed data files (compressed chunks) go to storage through a page-aligned buffer of
#: this size, with O_DIRECT where the file system takes it
stream_buffer_bytes: int = _env_int("stream_buffer_bytes", 8 << 20)
#: reads go in blocks of this size, each checksummed while it is still in the CPU cache
read_block_bytes: int = _env_int("read_block_bytes", 1 << 20)
#: threads that copy arrays into staging memory during a snapshot
copy_threads: int = _env_int("copy_threads", max(1, min(4, (os.cpu_count() or 1))))
#: arrays at least this large are copied on the snapshot threads
parallel_copy_bytes: int = _env_int("parallel_copy_bytes", 4 << 20)
#: niceness added to background save threads (Linux), so training threads get the CPU first
background_nice: int = _env_int("background_nice", 10)
#: seconds a collective of the communicator may take before it is declared failed
comm_timeout: float = float(os.environ.get("UCKPT_COMM_TIMEOUT", "300"))
#: where directories cannot be locked (some network file systems), a hidden temporary
#: directory older than this many seconds counts as an interrupted save's debris
debris_expiry_s: float = float(os.environ.get("UCKPT_DEBRIS_EXPIRY_S", "3600"))
#: seconds an object store root's writer lock stays valid without renewal; its holder
#: renews it every third of that, and another writer may take it over once it has expired
#: on the store's clock (uckpt.storage.checkpoint.lease_lock)
lock_lease_s: float = float(os.environ.get("UCKPT_LOCK_LEASE_S", "60"))
#: 1: Python's cyclic garbage collector is paused while a save or load runs on the
#: caller's thread (uckpt.runtime.gcpause); 0: left alone
pause_gc: int = _env_int("pause_gc", 1)
#: ``uckpt convert`` from NPZ reads arrays ahead on threads while it writes one: at most
#: this many bytes of them (and always the next array) beyond the one being written
convert_ahead_bytes: int = _env_int("convert_ahead_bytes", 256 << 20)
#: ``verify`` decodes a compressed chunk of up to this many raw bytes in memory to hash
#: it; a larger one is decoded as a stream (uckpt.codecs.stream), in bounded memory
verify_decode_bytes: int = _env_int("verify_decode_bytes", 16 << 20)
#: a load on several ranks reads each chunk that several ranks need once per node
#: ("node"), once per job ("job"), on every rank that needs it ("off"), or ("auto") once
#: per node from an object store and on every rank from local files, whose page cache
#: shares the reads of a node's ranks already; a load's ``cooperative=`` overrides it
#: (uckpt.loading.cooperative, docs/distributed.md)
cooperative_load: str = os.environ.get("UCKPT_COOPERATIVE_LOAD", "auto")
#: a cooperative load moves shared chunks in rounds: in each, a rank reads, and receives,
#: at most this many bytes of them (or one chunk, where a chunk is larger)
cooperative_round_bytes: int = _env_int("cooperative_round_bytes", 64 << 20)
