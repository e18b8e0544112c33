"""A save by many ranks: every rank writes its own data file; one atomic commit.

The protocol (see docs/architecture.md, "Distributed saves") runs three
exchanges on the communicator; each ends with every rank knowing whether every
other rank succeeded, so a failure anywhere raises the same
:class:`~uckpt.errors.DistributedError` everywhere and nothing is committed:

1. *plan*: rank 0 checks the target and creates the temporary directory with a
   marker file in it; every rank sends its metadata
   (:func:`~uckpt.global_plan.local_metadata`); every rank computes the same
   :class:`~uckpt.global_plan.GlobalPlan`.
2. *write*: every rank creates the temporary directory where it does not see it
   (node-local storage), writes and fsyncs its data file, and sends its chunks'
   checksums and which copy of the directory it wrote into (its *view*).
3. *commit*: the lowest rank of each view writes the manifest (the same on
   every view) and renames the directory into place.

A rank that dies makes the others' exchange fail (the backend's error or
:class:`~uckpt.errors.CollectiveTimeoutError`): nothing is committed, and the
temporary directory is removed by the survivors or, failing that, by the next
``CheckpointManager`` on that root.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Union

from . import fsutil
from .comm import Communicator
from .commit import assemble_manifest, check_metadata, check_target, make_parent_and_tmp, publish
from .leases import TmpLease, lease_dir
from .format import MANIFEST_NAME, Chunk
from .global_plan import GlobalPlan, compact, expand, global_plan, local_metadata, merged_tree
from .engine import submit_collective
from .reader import CheckpointReader
from .staging import snapshot, snapshot_share
from .tiers import Source
from .tree import Flat, flatten
from .writer import write_data_file

COORDINATOR_MARK = ".uckpt-coordinator"


def save_collective(directory, flat: Union[Flat, BaseException], comm: Communicator, *,
                    step: Optional[int] = None, metadata: Optional[Dict[str, Any]] = None,
                    overwrite: bool = False, what: Optional[str] = None) -> Path:
    """Collective: save each rank's ``flat`` as one checkpoint; returns ``directory``.

    ``flat`` may be the exception this rank failed with before the save
    (flattening, snapshot): it is reported to the other ranks, and every rank raises.
    """
    prepared = prepare_collective(directory, flat, comm, step=step, metadata=metadata,
                                  overwrite=overwrite, what=what)
    assert isinstance(flat, Flat)
    try:  # device arrays to host memory (host arrays are written in place)
        staged: Union[Flat, BaseException] = snapshot(flat, None).ready()
    except Exception as e:  # noqa: BLE001 - reported to the other ranks in the write step
        staged = e
    return finish_collective(prepared, staged, comm)


def flatten_shared(state, comm: Communicator) -> Union[Flat, BaseException]:
    """``flatten(state)`` for a collective save: with several ranks, an error is returned
    (to be told to the other ranks by the plan exchange), not raised here alone."""
    try:
        return flatten(state, rank=comm.rank)
    except Exception as e:  # noqa: BLE001 - see above
        if comm.size == 1:
            raise
        return e


@dataclass
class Prepared:
    """A collective save after its plan exchange: what the write and commit need."""

    run: "_Run"
    flat: Flat
    gathered: List[Dict[str, Any]]
    plan: GlobalPlan
    step: Optional[int]
    metadata: Dict[str, Any]
    overwrite: bool
    what: str


def prepare_collective(directory, flat: Union[Flat, BaseException], comm: Communicator, *,
                       step: Optional[int] = None, metadata: Optional[Dict[str, Any]] = None,
                       overwrite: bool = False, what: Optional[str] = None) -> Prepared:
    """Collective, step 1 (plan): returns the same plan on every rank, or raises on all."""
    directory = Path(directory).absolute()
    what = what or f"save to {str(directory)!r}"
    run = _Run(directory)

    meta: Dict[str, Any] = {}

    def plan() -> Dict[str, Any]:
        if isinstance(flat, BaseException):
            raise flat
        meta.update(local_metadata(flat))
        out = compact(meta, comm.rank)
        if comm.rank == 0:
            check_metadata(metadata)
            if step is not None and (not isinstance(step, int) or isinstance(step, bool) or step < 0):
                raise ValueError(f"step must be a non-negative int, got {step!r}")
            check_target(directory, overwrite)
            out["tmp"] = run.make_tmp()
            out["metadata"] = metadata or {}  # rank 0's: every view's manifest says the same
        return out

    try:
        gathered = comm.gather_outcomes(plan, f"{what} (planning)")
        assert isinstance(flat, Flat)
        differ = expand(gathered)
        if differ:  # rare: some rank's replicated leaves differ; fetch them to say which
            full = comm.all_gather(meta["replicated"] if comm.rank in differ else None)
            for r in differ:
                gathered[r]["replicated"] = full[r]
        gp = global_plan(gathered, comm.rank)  # raises the same error on every rank
    except BaseException:
        run.cleanup()
        raise
    run.tmp = directory.parent / gathered[0]["tmp"]
    return Prepared(run, flat, gathered, gp, step, gathered[0]["metadata"], overwrite, what)


def finish_collective(p: Prepared, staged: Union[Flat, BaseException], comm: Communicator) -> Path:
    """Collective, steps 2 and 3 (write, commit), over ``comm`` (the plan's ranks, e.g. a
    background duplicate). ``staged`` is this rank's data (a snapshot of its share, or
    the flat state), or the error the snapshot failed with."""
    run, gp = p.run, p.plan
    try:
        def write() -> Dict[str, Any]:
            if isinstance(staged, BaseException):
                raise staged
            view = run.enter()
            file, size = gp.plan.file_sizes[comm.rank]
            run.files.append(run.tmp / file)
            chunks = write_data_file(run.tmp, file, size, gp.plan.for_rank(comm.rank),
                                     staged.arrays, image=staged.images.get(file),
                                     origins=gp.origins)
            return {"sums": [chunks[it].checksum for it in gp.plan.items if it.rank == comm.rank],
                    "view": view}

        written = comm.gather_outcomes(write, f"{p.what} (writing)")

        def manifest() -> bytes:
            ordered = sorted(gp.plan.items, key=lambda it: it.rank)  # the order sums arrived in
            sums = [s for w in written for s in w["sums"]]
            chunks = {it: Chunk(it.file, it.offset, it.length, it.start, it.shape, "raw", s)
                      for it, s in zip(ordered, sums)}
            return assemble_manifest(merged_tree(p.flat.skeleton, p.gathered), gp.metas, gp.plan,
                                     chunks, p.step, p.metadata).to_bytes()

        views = [w["view"] for w in written]
        comm.gather_outcomes(lambda: run.commit(comm.rank, views, manifest, p.overwrite),
                             f"{p.what} (commit)")
    except BaseException:
        run.cleanup()
        raise
    run.release()  # a rank that made its node's copy but did not commit it
    return run.directory


def submit_async_share(saver, prepared: Prepared, comm: Communicator, background: Communicator,
                       description: str, then: Optional[Callable[[Path], Any]] = None,
                       failed: Optional[Callable[[], None]] = None):
    """Snapshot this rank's share of a prepared save into ``saver``'s staging memory and
    finish the save (write, commit, then ``then(path)``; ``failed()`` if it raised) in
    the background over ``background``; returns the :class:`~uckpt.engine.SaveHandle`."""
    def job(staged):
        try:
            path = finish_collective(prepared, staged, background)
        except BaseException:
            if failed is not None:
                failed()
            raise
        return then(path) if then is not None else path

    gp = prepared.plan
    return submit_collective(saver, prepared.flat, job, description, take=lambda pool: snapshot_share(
        prepared.flat, gp.plan, comm.rank, gp.origins, pool))


def copy_collective(src: Path, dst: Path, comm: Communicator, verify: bool = True) -> Optional[Path]:
    """Collective: copy committed checkpoint ``src`` (each rank's view of it) to ``dst``.

    Every rank copies the data files it wrote (the manifest's ``files[...].rank``)
    and checks their chunks after reading them back; the lowest rank of each view of
    ``dst`` commits. Returns ``dst``, or None if it was already committed there.
    """
    src, dst = Path(src).absolute(), Path(dst).absolute()
    what = f"copy of {str(src)!r} to {str(dst)!r}"
    run = _Run(dst)

    def plan() -> Dict[str, Any]:
        if comm.rank == 0:
            if (dst / MANIFEST_NAME).exists():
                return {"skip": True}
            return {"tmp": run.make_tmp()}
        return {}

    try:
        gathered = comm.gather_outcomes(plan, f"{what} (planning)")
        if gathered[0].get("skip"):
            return None
        run.tmp = dst.parent / gathered[0]["tmp"]
        manifest_bytes: List[bytes] = []

        def copy() -> Dict[str, Any]:
            view = run.enter()
            with Source(src) as source:  # this rank's view of the source (node-local tiers)
                manifest_bytes.append(source.manifest_bytes)
                mine = [f.name for f in source.manifest.files.values() if f.rank == comm.rank]
                for name in mine:
                    run.files.append(run.tmp / name)
                    source.copy_file(name, run.tmp / name)
            if verify:
                with CheckpointReader(run.tmp, manifest=source.manifest) as copied:
                    copied.verify(files=set(mine))
            return {"view": view}

        copied = comm.gather_outcomes(copy, f"{what} (copying)")
        comm.gather_outcomes(lambda: run.commit(comm.rank, [c["view"] for c in copied],
                                                lambda: manifest_bytes[0], False), f"{what} (commit)")
    except BaseException:
        run.cleanup()
        raise
    run.release()
    return dst


class _Run:
    """One rank's part in a collective commit of ``directory``, and its cleanup."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.tmp: Optional[Path] = None
        self.created_tmp = False
        self.lease: Optional[TmpLease] = None
        self.files: List[Path] = []

    def make_tmp(self) -> str:
        """Rank 0: create the temporary directory, marked as the coordinator's."""
        self.lease = make_parent_and_tmp(self.directory)
        self.tmp = self.lease.path
        self.created_tmp = True
        (self.tmp / COORDINATOR_MARK).touch()  # seen by the others; never needs to be durable
        return self.tmp.name

    def enter(self) -> str:
        """Find or create the temporary directory; return which copy of it this rank sees."""
        assert self.tmp is not None
        sees_coordinator = (self.tmp / COORDINATOR_MARK).exists()
        if not sees_coordinator:  # node-local storage: this node's copy of the directory
            self.directory.parent.mkdir(parents=True, exist_ok=True)
            try:
                self.tmp.mkdir()
                self.created_tmp = True
                self.lease = lease_dir(self.tmp)
            except FileExistsError:
                pass
        st = os.stat(self.tmp)
        return "coordinator" if sees_coordinator else f"{socket.gethostname()}:{st.st_dev}:{st.st_ino}"

    def release(self) -> None:
        """Drop this rank's lock on the temporary directory (after commit or cleanup)."""
        if self.lease is not None:
            self.lease.release()
            self.lease = None

    def commit(self, rank: int, views: List[str], manifest: Callable[[], bytes],
               overwrite: bool) -> None:
        """The lowest rank of each view writes the manifest and renames the directory."""
        if views.index(views[rank]) != rank:
            return
        assert self.tmp is not None
        data = manifest()
        (self.tmp / COORDINATOR_MARK).unlink(missing_ok=True)
        fsutil.write_file_durably(self.tmp / MANIFEST_NAME, data)
        fsutil.fsync_dir(self.tmp)
        publish(self.tmp, self.directory, overwrite)
        self.created_tmp = False
        self.release()

    def cleanup(self) -> None:
        """After a failure: remove what this rank made (best effort; debris is also
        removed by the root's writer once no live save holds it)."""
        if self.tmp is None:
            return
        try:
            for f in self.files:
                f.unlink(missing_ok=True)
            if self.created_tmp and self.tmp.exists() and not (self.tmp / MANIFEST_NAME).exists():
                fsutil.remove_tree(self.tmp)
        except OSError:
            pass
        finally:
            self.release()
