"""``convert(src, dst)`` and ``open_checkpoint(path)``: the Python API of ``uckpt convert``."""
from __future__ import annotations

import importlib
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..errors import UckptError
from . import detect as _detect
from .errors import ConvertWarning
from .limits import Limits, using
from .model import Tree
from .progress import Progress

#: format -> module reading it (``read(path) -> Tree``)
READERS = {"npz": "npz", "pickle": "torch_pickle", "hdf5": "hdf5",
           "safetensors": "safetensors_fmt", "uckpt": "uckpt_fmt", "dcp": "dcp"}
#: format -> module writing it (``plan(tree) -> Layout``, ``write(tree, layout, path, progress)``)
WRITERS = {"npz": "npz", "pickle": "torch_writer", "hdf5": "hdf5",
           "safetensors": "safetensors_fmt", "uckpt": "uckpt_fmt"}
DIRECTORY_TARGETS = ("uckpt",)


def _module(name: str):
    return importlib.import_module(f"{__package__}.{name}")


@dataclass
class Report:
    """What a conversion did (or, with ``dry_run``, would do)."""

    src: str
    dst: str
    src_format: str
    dst_format: str
    arrays: List[Tuple[str, str, Tuple[int, ...], int]] = field(default_factory=list)
    values: List[str] = field(default_factory=list)  # names of plain values
    warnings: List[str] = field(default_factory=list)
    seconds: float = 0.0
    dry_run: bool = False

    @property
    def nbytes(self) -> int:
        return sum(a[3] for a in self.arrays)

    def to_json(self) -> Dict[str, Any]:
        return {"src": self.src, "dst": self.dst, "src_format": self.src_format,
                "dst_format": self.dst_format, "dry_run": self.dry_run,
                "nbytes": self.nbytes, "seconds": round(self.seconds, 6),
                "arrays": [{"name": n, "dtype": d, "shape": list(s), "nbytes": b}
                           for n, d, s, b in self.arrays],
                "values": self.values, "warnings": self.warnings}


def open_checkpoint(path, format: Optional[str] = None, *,
                    limits: Optional[Limits] = None) -> Tree:
    """Open a checkpoint of any supported format as a tree of lazy leaves (close it after use,
    or use it as a context manager). ``format`` overrides detection from the content;
    ``limits`` (:class:`~uckpt.conversion.limits.Limits`) raise or lower the limits on
    hostile input (default: those in force, see docs/convert.md)."""
    fmt = _detect.canonical(format) or _detect.detect(path)
    with using(limits):
        return _module(READERS[fmt]).read(path, fmt)


def convert(src, dst, *, src_format: Optional[str] = None, dst_format: Optional[str] = None,
            force: bool = False, dry_run: bool = False,
            progress: Optional[Callable[[int, int], None]] = None,
            limits: Optional[Limits] = None, compress: Any = None) -> Report:
    """Convert the checkpoint ``src`` to ``dst``.

    Formats: ``npz``, ``pickle`` (``torch.save``), ``hdf5``, ``safetensors``, ``uckpt``,
    and ``dcp`` (PyTorch Distributed Checkpoint, as a source only). The source format is
    detected from the content, the target's from its name (a ``.npz``, ``.pt``, ``.h5``,
    ``.safetensors`` file, else a uckpt directory); ``src_format`` and ``dst_format``
    override them.

    Every array is copied bit for bit, one at a time (memory stays about the largest
    array). ``dst`` is written atomically and never replaced unless ``force``. What the
    target cannot hold, or holds differently, is listed in ``Report.warnings`` and raised
    as a :class:`~uckpt.conversion.errors.ConvertWarning`. ``progress(done, total)`` is
    called with bytes of array data as they are written. With ``dry_run``, nothing is
    written and the report lists what would be. ``limits`` (a
    :class:`~uckpt.conversion.limits.Limits`) raise the limits on hostile input for a
    legitimate source that exceeds them (tree nodes, bytes made per byte stored).
    ``compress`` (``"zstd"``, or True for it) compresses a uckpt target's chunks
    (docs/format.md section 6.3).
    """
    from .output import check_output, write_atomically

    start = time.monotonic()
    src_fmt = _detect.canonical(src_format) or _detect.detect(src)
    dst_fmt = _detect.canonical(dst_format, target=True) or _detect.target_format(dst)
    directory = dst_fmt in DIRECTORY_TARGETS
    dst_path = Path(dst).absolute()
    if Path(src).absolute() == dst_path or (dst_path.exists() and
                                            os.path.samefile(src, dst_path)):
        raise UckptError(f"{str(src)!r}: source and destination are the same",
                         hint="write the conversion to another path")
    if not dry_run:
        check_output(dst_path, directory, force)
    writer = _module(WRITERS[dst_fmt])
    options = _compress_option(compress, dst_fmt, writer)
    with open_checkpoint(src, src_fmt, limits=limits) as tree:
        lay = writer.plan(tree)
        report = Report(str(src), str(dst), src_fmt, dst_fmt, dry_run=dry_run,
                        arrays=[(n, leaf.dtype, leaf.shape, leaf.nbytes) for n, leaf in lay.arrays],
                        values=[n for n, _ in lay.values], warnings=tree.notes + lay.notes)
        for text in report.warnings:
            warnings.warn(text, ConvertWarning, stacklevel=2)
        if not dry_run:
            done = Progress(lay.nbytes, progress)
            write_atomically(dst_path, directory, force,
                             lambda tmp: writer.write(tree, lay, tmp, done, **options))
    report.seconds = time.monotonic() - start
    return report


def _compress_option(compress, dst_fmt: str, writer) -> Dict[str, Any]:
    """The writer's keyword for ``compress`` (none when not asked for); refuses a target
    that cannot compress."""
    from ..codecs import compression_of

    if compress is None or compress is False:
        return {}
    if not getattr(writer, "COMPRESSES", False):
        raise UckptError(f"a {dst_fmt} target cannot be compressed",
                         hint="leave out --compress, or convert to a uckpt directory")
    return {"compress": compression_of("zstd" if compress is True else compress)}
