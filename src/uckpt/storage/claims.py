"""The writer job's claim on its roots: a manager that may write looks at who holds each
root, takes every root's writer lock on every rank of its job (one job id, agreed by
rank 0), and checks before each save that no lease-based lock was lost. The locks
themselves are the stores' (:meth:`~uckpt.storage.base.Store.writer_lock`); see
docs/architecture.md, "A root shared by many processes".

Call order: rank 0 calls :func:`check_roots` when a manager that may write is made;
every rank calls :func:`claim_roots` once, at the job's first save, then
:func:`check_leases` before each save.
"""
from __future__ import annotations

import logging
import os
from typing import Any, List

from .save_errors import raise_save_failure

log = logging.getLogger("uckpt.storage.claims")


def check_roots(stores: List[Any], comm: Any) -> None:
    """What a manager that may become the writer (``role="auto"``) learns at construction:
    on rank 0, log who holds each root whose lock can be looked at without taking it (an
    object store's). Reads only; never raises (a store that cannot be read is left to the
    first save)."""
    if comm.rank != 0:
        return
    for store in stores:  # peek() is None for a lock that cannot be looked at
        seen = store.writer_lock("", False).peek()
        if seen is not None:
            log.log(seen[0], "%s", seen[1])


def check_leases(locks: List[Any], comm: Any) -> None:
    """Collective: raise :class:`~uckpt.errors.WriterLeaseLostError` (with several ranks a
    :class:`~uckpt.errors.DistributedError` on every rank) if a lock of this writer job
    lost its lease. Nothing to do, and no collective, for locks without leases."""
    if not any(lock.one_per_job for lock in locks):
        return
    if comm.size == 1:
        for lock in locks:
            lock.check()
    else:
        comm.gather_outcomes(lambda: [lock.check() for lock in locks],
                             "checking the writer locks")


def new_job_id() -> str:
    return os.urandom(8).hex()


def claim_roots(stores: List[Any], comm: Any, shared: bool) -> List[Any]:
    """Collective (every rank of the writer job): take the writer lock of every root (a
    :class:`~uckpt.storage.base.Store`), creating the roots; raise
    :class:`RootLockedError` (with several ranks: a
    :class:`~uckpt.errors.DistributedError` on every rank) when another job holds one.
    A lock that one rank takes for the whole job (an object store's) is taken by rank 0."""
    job = comm.broadcast(new_job_id() if comm.rank == 0 else None)
    locks = [store.writer_lock(job, shared) for store in stores]

    def take() -> List[bool]:
        got = []
        for store, lock in zip(stores, locks):
            if lock.one_per_job and comm.rank != 0:
                got.append(True)
                continue
            try:
                store.prepare_root()
                got.append(lock.try_acquire() is None)
            except OSError as e:
                raise_save_failure(e, f"opening checkpoint root {str(store.where)!r} for "
                                      "writing", store.where)
        return got

    def check(got: List[bool]) -> None:
        for lock, ok in zip(locks, got):
            if not ok and lock.holder().get("job") != job:  # not a rank of this job
                raise lock.refusal()

    try:
        if comm.size == 1:
            check(take())
        else:
            got = comm.gather_outcomes(take, "claiming the checkpoint roots")[comm.rank]
            comm.gather_outcomes(lambda: check(got), "claiming the checkpoint roots")
    except BaseException:
        for lock in locks:
            lock.release()
        raise
    return locks
