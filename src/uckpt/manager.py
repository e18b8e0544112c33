"""CheckpointManager: numbered checkpoints under one root, retention, robust restore.

Layout: ``root/step_00000042/`` per committed checkpoint (see docs/format.md).
Only directories holding a valid-looking manifest count as checkpoints;
temporary directories of interrupted saves (``.step_*.uckpt-tmp-*``) are
invisible and removed when a manager opens the root.

Call order: ``save`` / ``restore`` / ``steps`` in any order from one process,
then ``close`` (or use ``with``). ``wait`` returns once every save so far is
committed (saves are synchronous in this version, so it returns at once).
"""
from __future__ import annotations

import os
import re
import secrets
import warnings
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from . import fsutil
from .api import load
from .commit import DEL_MARK, OLD_MARK, TMP_MARK, write_checkpoint
from .errors import (CheckpointNotFoundError, CorruptCheckpointError, ManifestError,
                     NotACheckpointError)
from .format import MANIFEST_NAME
from .tree import flatten

_STEP_DIR = re.compile(r"^step_(\d+)$")
# what makes restore() fall back to an older checkpoint; state mismatches do not
_DAMAGE = (CorruptCheckpointError, ManifestError, CheckpointNotFoundError, NotACheckpointError)


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


class CheckpointManager:
    """Saves numbered checkpoints under ``root`` and restores the newest valid one.

    ``keep_last``: after each save, keep only this many newest checkpoints
    (None keeps all). The newest committed checkpoint is never deleted.
    """

    def __init__(self, root, *, keep_last: Optional[int] = None) -> None:
        if keep_last is not None and (not isinstance(keep_last, int) or keep_last < 1):
            raise ValueError(f"keep_last must be a positive int or None, got {keep_last!r}")
        self.root = Path(root).absolute()
        self.keep_last = keep_last
        self.root.mkdir(parents=True, exist_ok=True)
        self._closed = False
        self._remove_debris()

    # -- context manager -------------------------------------------------------------------
    def __enter__(self) -> "CheckpointManager":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.wait()
        self._closed = True

    def wait(self) -> None:
        """Block until every save so far is committed (immediate: saves are synchronous)."""

    # -- queries ---------------------------------------------------------------------------
    def path(self, step: int) -> Path:
        return self.root / step_dir_name(step)

    def steps(self) -> List[int]:
        """Steps of committed checkpoints, oldest first."""
        out = []
        with os.scandir(self.root) as it:
            for e in it:
                m = _STEP_DIR.match(e.name)
                if m and e.is_dir() and os.path.exists(os.path.join(e.path, MANIFEST_NAME)):
                    out.append(int(m.group(1)))
        return sorted(out)

    def latest_step(self) -> Optional[int]:
        steps = self.steps()
        return steps[-1] if steps else None

    # -- save / restore --------------------------------------------------------------------
    def save(self, step: int, state: Mapping[str, Any], *, metadata: Optional[Dict[str, Any]] = None,
             overwrite: bool = False) -> Path:
        """Save ``state`` as checkpoint ``step``; refuses an existing step unless ``overwrite``."""
        self._check_open()
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"step must be a non-negative int, got {step!r}")
        path = write_checkpoint(self.path(step), flatten(state), step=step, metadata=metadata,
                                overwrite=overwrite)
        self._retain()
        return path

    def restore(self, state: Mapping[str, Any], step: Optional[int] = None, *,
                strict: bool = True) -> Optional[int]:
        """Restore ``state`` in place; returns the step restored, or None if there is none.

        With ``step=None`` the newest checkpoint that reads back intact is used;
        damaged ones are skipped with a warning naming them and why.
        """
        self._check_open()
        if step is not None:
            load(self.path(step), state, strict=strict)
            return step
        failures = []
        for s in reversed(self.steps()):
            try:
                load(self.path(s), state, strict=strict)
            except _DAMAGE as e:
                warnings.warn(f"uckpt: skipping checkpoint step {s} ({self.path(s)}): {e}",
                              RuntimeWarning, stacklevel=2)
                failures.append((s, e))
                continue
            return s
        if failures:
            raise CorruptCheckpointError(
                f"no checkpoint under {str(self.root)!r} reads back intact: " +
                "; ".join(f"step {s}: {type(e).__name__}" for s, e in failures),
                path=str(self.root)) from failures[0][1]
        return None

    # -- housekeeping ------------------------------------------------------------------------
    def _retain(self) -> None:
        if self.keep_last is None:
            return
        steps = self.steps()
        for s in steps[:-self.keep_last]:
            self._delete(s)

    def _delete(self, step: int) -> None:
        """Hide first (rename), then delete: a crash never leaves a half-deleted checkpoint."""
        path = self.path(step)
        hidden = self.root / f".{path.name}{DEL_MARK}{secrets.token_hex(4)}"
        os.rename(path, hidden)
        fsutil.remove_tree(hidden)

    def _remove_debris(self) -> None:
        """Remove what killed saves and deletions left; put back a half-replaced checkpoint.

        An overwrite without atomic exchange renames the old checkpoint aside
        before moving the new one in; if the process died in between, the old
        one is renamed back.
        """
        with os.scandir(self.root) as it:
            entries = [e for e in it if e.name.startswith(".step_")]
        for e in entries:
            name = e.name[1:].split(".uckpt-")[0]
            if OLD_MARK in e.name and not (self.root / name).exists() and \
                    os.path.exists(os.path.join(e.path, MANIFEST_NAME)):
                os.rename(e.path, self.root / name)
            elif TMP_MARK in e.name or OLD_MARK in e.name or DEL_MARK in e.name:
                fsutil.remove_tree(e.path)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this CheckpointManager is closed")

    def __repr__(self) -> str:
        return f"CheckpointManager({str(self.root)!r}, keep_last={self.keep_last})"
