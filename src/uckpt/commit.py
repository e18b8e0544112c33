"""Write a flattened state as a checkpoint directory and commit it atomically.

Order of operations (single writer; the distributed protocol adds a gather of
chunk records between steps 3 and 4):

1. refuse early if ``directory`` holds a committed checkpoint (unless
   ``overwrite``) or anything that is not a checkpoint;
2. create ``.<name>.uckpt-tmp-<random>`` beside ``directory``, locked for the life of
   the save (``leases.make_tmp_dir``: a writer's debris removal never touches it);
3. write and fsync every data file (space is preallocated, so a full disk fails
   before data is written);
4. write and fsync ``manifest.json``, fsync the temporary directory;
5. rename it to ``directory`` (or swap it with the old checkpoint atomically
   when overwriting), fsync the parent.

Until step 5 readers see nothing new; the previous checkpoint is never touched.
Any failure removes the temporary directory and raises.
"""
from __future__ import annotations

import datetime as _dt
import errno
import json
import os
import secrets
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterator, Optional

from ._version import __version__ as _version
from . import fsutil
from .errors import (CheckpointExistsError, ManifestError, SaveError, StorageAccessError,
                     StorageFullError, UckptError)
from .format import MANIFEST_NAME, ArrayEntry, FileEntry, Manifest
from .leases import DEL_MARK, OLD_MARK, TMP_MARK, make_tmp_dir  # noqa: F401 (re-exported)
from .plan import SavePlan, metas, plan_save
from .tree import Flat
from .writer import write_data_file



def check_metadata(metadata: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    if metadata is None:
        return {}
    if not isinstance(metadata, dict) or not all(isinstance(k, str) for k in metadata):
        raise ManifestError("metadata must be a dict with str keys of JSON values")
    try:
        json.dumps(metadata, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ManifestError(f"metadata is not JSON-serialisable: {e}",
                            hint="use str, int, float (finite), bool, None, lists and dicts") from None
    return metadata


def check_target(directory: Path, overwrite: bool) -> None:
    """Refuse to replace what must not be replaced (see module docstring, step 1)."""
    if not directory.exists():
        return
    if not directory.is_dir():
        raise CheckpointExistsError(f"{str(directory)!r} exists and is a file; refusing to "
                                    "replace it with a checkpoint", path=str(directory))
    if (directory / MANIFEST_NAME).exists():
        if not overwrite:
            raise CheckpointExistsError(
                f"{str(directory)!r} already holds a committed checkpoint", path=str(directory),
                hint="pass overwrite=True to replace it, or save to another directory")
        return
    if not fsutil.dir_is_empty(directory):
        raise CheckpointExistsError(
            f"{str(directory)!r} exists, is not empty and is not a uckpt checkpoint; "
            "refusing to write into it", path=str(directory),
            hint="choose an empty or new directory")


def write_checkpoint(directory, flat: Flat, *, step: Optional[int] = None,
                     metadata: Optional[Dict[str, Any]] = None, overwrite: bool = False,
                     plan: Optional[SavePlan] = None) -> Path:
    """Write ``flat`` to ``directory`` and commit it; returns the directory."""
    directory = Path(directory).absolute()
    metadata = check_metadata(metadata)
    if step is not None and (not isinstance(step, int) or isinstance(step, bool) or step < 0):
        raise ValueError(f"step must be a non-negative int, got {step!r}")
    check_target(directory, overwrite)
    plan = plan or flat.plan or plan_save(metas(flat.arrays))
    with staged_dir(directory, f"writing checkpoint {str(directory)!r}",
                    f" ({flat.nbytes} bytes of arrays)") as tmp:
        chunks = {}
        for rank, (file, size) in enumerate(plan.file_sizes):
            chunks.update(write_data_file(tmp, file, size, plan.for_rank(rank), flat.arrays,
                                          image=flat.images.get(file)))
        manifest = build_manifest(flat, plan, chunks, step, metadata)
        fsutil.write_file_durably(tmp / MANIFEST_NAME, manifest.to_bytes())
        fsutil.fsync_dir(tmp)
        publish(tmp, directory, overwrite)
    return directory


def build_manifest(flat: Flat, plan: SavePlan, chunks, step, metadata) -> Manifest:
    return assemble_manifest(flat.skeleton, metas(flat.arrays), plan, chunks, step, metadata)


def assemble_manifest(tree, array_metas, plan: SavePlan, chunks, step, metadata) -> Manifest:
    """The manifest of a plan's chunks (``chunks``: write item -> :class:`Chunk`)."""
    by_path: Dict[str, list] = {p: [] for p in array_metas}
    for item in plan.items:
        by_path[item.path].append(chunks[item])
    arrays = {p: ArrayEntry(p, m.dtype, tuple(m.shape), tuple(by_path[p]))
              for p, m in array_metas.items()}
    files = {f: FileEntry(f, r, size) for r, (f, size) in enumerate(plan.file_sizes)}
    created = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return Manifest(world_size=plan.world_size, tree=tree, arrays=arrays, files=files,
                    step=step, metadata=metadata, generator=f"uckpt {_version}", created=created)


def make_parent_and_tmp(directory: Path):
    """Create ``directory``'s parent if needed and a locked temporary directory beside it."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    return make_tmp_dir(directory)


@contextmanager
def staged_dir(directory: Path, doing: str, detail: str = "") -> Iterator[Path]:
    """A locked temporary directory beside ``directory`` for the body to fill and publish.
    On any failure it is removed and the error raised as uckpt's (:func:`save_failure`);
    the lock is released either way."""
    lease = None
    try:
        lease = make_parent_and_tmp(directory)
        yield lease.path
    except BaseException as e:
        if lease is not None:
            fsutil.remove_tree(lease.path)
        err = save_failure(e, doing, directory, detail)
        if err is e:
            raise
        raise err from e
    finally:
        if lease is not None:
            lease.release()


def save_failure(e: BaseException, doing: str, directory: Path, detail: str = "") -> BaseException:
    """The uckpt error to raise for ``e``, which ended ``doing`` (``e`` itself if it is one)."""
    if fsutil.is_enospc(e):
        return StorageFullError(f"no space left on the device while {doing}{detail}",
                                path=str(directory),
                                hint="free space or choose another location; earlier "
                                     "checkpoints are intact")
    if isinstance(e, OSError) and e.errno in (errno.EROFS, errno.EACCES, errno.EPERM) and \
            not isinstance(e, UckptError):
        where = e.filename or directory
        return StorageAccessError(
            f"{doing} failed: {str(where)!r} cannot be written ({os.strerror(e.errno)})",
            path=str(where), errno=e.errno,
            hint="check that the file system is mounted read-write and that this user may "
                 "write there; earlier checkpoints are intact")
    if isinstance(e, OSError) and not isinstance(e, UckptError):
        return SaveError(f"{doing} failed: {e}", path=str(directory))
    return e


def publish(tmp: Path, directory: Path, overwrite: bool) -> None:
    """Make ``tmp`` visible as ``directory`` (step 5)."""
    if directory.exists() and (directory / MANIFEST_NAME).exists():
        if not overwrite:  # appeared since check_target: never clobber
            raise _committed_meanwhile(directory)
        if not fsutil.exchange(tmp, directory):
            old = directory.parent / f".{directory.name}{OLD_MARK}{secrets.token_hex(4)}"
            os.rename(directory, old)
            os.rename(tmp, directory)
            tmp = old
        fsutil.fsync_dir(directory.parent)
        fsutil.remove_tree(tmp)  # now holds the replaced checkpoint
        return
    try:
        os.rename(tmp, directory)  # replaces an empty directory atomically
    except OSError as e:
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST):  # another saver committed it first
            raise _committed_meanwhile(directory) from None
        if e.errno == errno.ENOENT and not tmp.exists():
            raise SaveError(
                f"could not commit {str(directory)!r}: its temporary directory {tmp.name!r} "
                "was removed by another process during the save", path=str(directory),
                hint="only the root's writer removes interrupted saves, and never a live one; "
                     "something outside uckpt deleted it") from None
        raise SaveError(f"could not commit {str(directory)!r}: {e}", path=str(directory)) from e
    fsutil.fsync_dir(directory.parent)


def _committed_meanwhile(directory: Path) -> CheckpointExistsError:
    return CheckpointExistsError(f"{str(directory)!r} was committed by another save during "
                                 "this one", path=str(directory),
                                 hint="two savers wrote the same step; the first one's "
                                      "checkpoint is kept, this one is discarded")
