"""``.keras`` archives (Keras 3 ``model.save``): a zip of ``config.json``, ``metadata.json``
and ``model.weights.h5``.

Reading: the weights file is copied out of the archive (stored or deflated, with the zip
checks of :class:`~.fileio.ZipArchive`: at most 1032 bytes, or ``max_ratio``, per byte
stored) 1 MiB at a time into a private temporary file and read as HDF5 (on Linux a file
without a name, ``O_TMPFILE`` or unlinked at once, read through ``/proc/<pid>/fd/<n>``,
so that nothing is left in the temporary directory even when the process is killed);
``config.json`` and ``metadata.json`` are kept as text in ``Tree.extras[""]["keras.archive"]``
(never parsed or run). Writing: the tree as an HDF5 weights file, zipped (stored, as Keras
writes it) with the kept config and metadata; without them (a ``.weights.h5`` source) the
archive has a ``metadata.json`` only, which ``model.load_weights("m.keras")`` accepts but
``keras.saving.load_model`` does not (it needs the model's config), and a note says so.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import tempfile
import zipfile
from pathlib import Path
from typing import Callable, Dict, Tuple

from .._version import __version__
from ..errors import CorruptCheckpointError
from ..storage.fsutil import write_all
from . import hdf5, skeleton
from .fileio import RandomAccessFile, ZipArchive
from .interchange import Tree, reading
from .options import WriteOptions
from .progress import Progress

WEIGHTS = "model.weights.h5"
TEXT_MEMBERS = ("config.json", "metadata.json")
KEPT = "keras.archive"  # Tree.extras[""] key: member name -> text
MAX_TEXT = 64 << 20


def _copy_member(archive: ZipArchive, info: zipfile.ZipInfo, fd: int) -> None:
    """Copy a member into ``fd`` a bounded piece at a time (one ``os.write`` copies at most
    about 2 GiB on Linux; :func:`~uckpt.storage.fsutil.write_all` loops until all is written)."""
    for piece in archive.pieces(info):
        write_all(fd, piece)


def _private_file() -> Tuple[int, str, Callable[[], None]]:
    """A new temporary file for the weights: its descriptor, a path HDF5 (and the child
    that reads its values) opens it by, and what removes it. On Linux the file has no name
    (``O_TMPFILE``, else unlinked as soon as it is made) and the path is
    ``/proc/<pid>/fd/<n>``: the kernel frees it with the process, however it ends.
    Elsewhere it is a named file, removed when the tree is closed."""
    directory = tempfile.gettempdir()
    fd = -1
    if hasattr(os, "O_TMPFILE"):
        try:
            fd = os.open(directory, os.O_TMPFILE | os.O_RDWR | getattr(os, "O_CLOEXEC", 0),
                         0o600)
        except OSError:  # a file system without O_TMPFILE
            fd = -1
    name = None
    if fd < 0:
        fd, name = tempfile.mkstemp(prefix="uckpt-keras-", suffix=".weights.h5",
                                    dir=directory)
    proc = f"/proc/{os.getpid()}/fd/{fd}"
    if os.path.exists(proc):
        if name is not None:
            os.unlink(name)
        return fd, proc, lambda: os.close(fd)
    assert name is not None  # O_TMPFILE is Linux's, and so is /proc

    def remove() -> None:
        os.close(fd)
        if os.path.exists(name):
            os.unlink(name)

    return fd, name, remove


def read(path, fmt: str = "keras") -> Tree:
    raf = RandomAccessFile(path)
    with reading(fmt, raf.close) as tree:
        archive = ZipArchive(raf)
        if WEIGHTS not in archive.members:
            raise CorruptCheckpointError(f"{raf.path}: a .keras archive without {WEIGHTS}",
                                         path=raf.path, hint="a .keras archive of a model "
                                         "saved with weights in .npz is not supported")
        kept: Dict[str, str] = {}
        for name in TEXT_MEMBERS:
            if name in archive.members:
                try:
                    kept[name] = archive.read(name, MAX_TEXT).decode("utf-8")
                except UnicodeDecodeError:
                    raise CorruptCheckpointError(f"{raf.path}: {name} is not UTF-8 text",
                                                 path=raf.path) from None
        fd, tmp, remove = _private_file()
        tree.closers.append(remove)
        _copy_member(archive, archive.members[WEIGHTS], fd)
        inner = hdf5.read(tmp, fmt)
        tree.closers.append(inner.close)
        tree.root, tree.extras = inner.root, inner.extras
        tree.notes.extend(n.replace(tmp, f"{raf.path}:{WEIGHTS}") for n in inner.notes)
        tree.extras.setdefault("", {})[KEPT] = kept
    return tree


def plan(tree: Tree) -> skeleton.Layout:
    lay = hdf5.plan(tree)
    if "config.json" not in tree.extras.get("", {}).get(KEPT, {}):
        lay.notes.append("the source has no Keras model config: the .keras archive holds "
                         "the weights and metadata.json only (model.load_weights reads it; "
                         "keras.saving.load_model needs config.json)")
    return lay


def write(tree: Tree, lay: skeleton.Layout, path, progress: Progress,
          options: WriteOptions = WriteOptions()) -> None:
    kept = dict(tree.extras.get("", {}).get(KEPT, {}))
    kept.setdefault("metadata.json", json.dumps({
        "keras_version": "uckpt " + __version__,
        "date_saved": _dt.datetime.now().strftime("%Y-%m-%d@%H:%M:%S")}))
    inner = Path(str(path) + ".weights.h5")
    extras = dict(tree.extras)  # the kept members go into the archive, not into the record
    extras[""] = {k: v for k, v in extras.get("", {}).items() if k != KEPT}
    weights = Tree(tree.root, tree.format, extras={k: v for k, v in extras.items() if v})
    try:
        hdf5.write(weights, lay, inner, progress, options)
        with zipfile.ZipFile(path, "x", zipfile.ZIP_STORED, allowZip64=True) as zf:
            for name in TEXT_MEMBERS:
                if name in kept:
                    zf.writestr(name, kept[name])
            zf.write(inner, WEIGHTS)
    finally:
        if inner.exists():
            inner.unlink()
