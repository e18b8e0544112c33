"""``convert(src, dst)`` and ``open_checkpoint(path)``: the Python API of ``uckpt convert``."""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ..errors import UckptError
from . import detect as _detect
from . import layouts
from .errors import ConvertWarning, UnknownFormatError
from .limits import Limits, using
from .interchange import Tree
from .progress import Progress

#: format -> module reading it (``read(path) -> Tree``)
READERS = {"npz": "npz", "pickle": "torch_pickle", "hdf5": "hdf5",
           "safetensors": "safetensors_fmt", "uckpt": "uckpt_fmt", "dcp": "dcp",
           "keras": "keras_archive", "hf": "hf", "tf": "tf_checkpoint",
           "deepspeed": "deepspeed_zero", "orbax": "orbax_fmt"}
#: format -> module writing it (``plan(tree) -> Layout``, ``write(tree, layout, path, progress)``;
#: a writer whose ``write`` takes ``options`` gets the :class:`~.options.WriteOptions`; one
#: of several files has ``check_target(dst, force)`` and ``write_output(dst, force, write)``
#: that put them in place)
WRITERS = {"npz": "npz", "pickle": "torch_writer", "hdf5": "hdf5",
           "safetensors": "safetensors_fmt", "uckpt": "uckpt_fmt", "keras": "keras_archive",
           "hf": "hf", "tf": "tf_checkpoint", "deepspeed": "deepspeed_writer",
           "orbax": "orbax_fmt"}
DIRECTORY_TARGETS = ("uckpt", "hf", "deepspeed", "orbax")
#: sources whose arrays are read ahead on threads while the target is written (reading them
#: costs CPU that releases the GIL: inflating deflated NPZ members)
PREFETCHED = ("npz",)


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
                    limits: Optional[Limits] = None, streaming: bool = False) -> Tree:
    """Open a checkpoint of any supported format as a tree of lazy leaves (close it after use,
    or use it as a context manager). ``format`` overrides detection from the content;
    ``limits`` (:class:`~uckpt.conversion.limits.Limits`) raise or lower the limits on
    hostile input (default: those in force, see docs/convert.md). ``streaming``: leaves
    of a uckpt checkpoint that can stream their bytes do (``Leaf.stream``, memory bounded
    by a constant; see :func:`uckpt.conversion.uckpt_fmt.read`)."""
    fmt = _detect.canonical(format) or _detect.detect(path)
    with using(limits):
        if streaming and fmt == "uckpt":
            return _module(READERS[fmt]).read(path, fmt, streaming=True)
        return _module(READERS[fmt]).read(path, fmt)


def convert(src, dst, *, src_format: Optional[str] = None, dst_format: Optional[str] = None,
            force: bool = False, dry_run: bool = False,
            progress: Optional[Callable[[int, int], None]] = None,
            limits: Optional[Limits] = None, select: Union[str, Sequence[str], None] = None,
            strip_prefix: Optional[str] = None, add_prefix: Optional[str] = None,
            compress: Optional[str] = None, max_shard_size=None,
            hf_weights: str = "safetensors", ranks: Optional[int] = None,
            storage_options: Optional[Mapping[str, Any]] = None,
            save_options=None, cast=None) -> Report:
    """Convert the checkpoint ``src`` to ``dst``.

    Formats: ``npz``, ``pickle`` (``torch.save``), ``hdf5``, ``safetensors``, ``uckpt``,
    ``keras``, ``hf``, ``tf`` (TensorFlow checkpoints, read and written with TensorFlow),
    ``deepspeed`` (DeepSpeed ZeRO checkpoint directories), ``orbax`` (Orbax checkpoints
    and CheckpointManager directories, with TensorStore) and ``dcp`` (PyTorch Distributed
    Checkpoint, as a source only). The source format is
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

    ``select`` (a glob pattern or a list of them, matched against leaf paths as for
    :func:`uckpt.load`: ``"model/encoder.*"``) converts only the leaves it picks, under
    their own paths, and reads no other; one path without wildcards (``"model"``)
    converts the node there as the root. ``strip_prefix`` and ``add_prefix`` rename the
    keys of the (selected) root dict (an ``add_prefix`` ending in ``/`` nests the root
    under that path). ``compress`` (``"default"``
    or a codec: ``deflate`` for NPZ, ``gzip``/``lzf`` for HDF5 and .keras, ``zstd`` for
    uckpt) compresses the target; ``max_shard_size`` (bytes, or text such as ``"5GB"``)
    writes a Hugging Face directory of shards and an index (with ``dst_format`` safetensors,
    the default, or pickle: ``pytorch_model-*.bin``). ``hf_weights`` (``safetensors`` or
    ``pickle``) is the kind of weight files a Hugging Face target (``dst_format="hf"``) gets.
    ``ranks`` is the number of data-parallel ranks a DeepSpeed ZeRO target
    (``dst_format="deepspeed"``) is partitioned for (default: the source's).
    ``save_options`` (a :class:`uckpt.SaveOptions`: chunk size, alignment, compression)
    lay out a uckpt target; ``compress`` and a compression in them are not given together.

    A uckpt target may be an ``s3://bucket/prefix/name`` URL (``storage_options`` as for
    :func:`uckpt.save`): it is written through its store as a save writes, the manifest
    committed last; the other formats are written to local files.

    ``cast`` (as :func:`uckpt.load`'s ``cast=`` without ``state``: a mapping of glob
    patterns, matched against the (selected) leaf paths, to dtypes or rules; see
    :mod:`uckpt.conversion.cast`) converts the leaves whose pattern names a dtype to it, a
    block at a time; nothing is narrowed unless its dtype is named, and a cast that
    changes the kind of number is a :class:`~uckpt.errors.DtypeMismatchError`.
    """
    from ..storage import local_path, storage_options_for
    from .output import check_checkpoint, check_output, write_atomically, write_checkpoint

    from .options import WriteOptions, for_target, parse_size, target_of
    from .prefetch import prefetch
    from .subtree import is_node_path, keep, rename_keys, select as select_node
    from ..loading.selection import patterns_of
    from ..loading.cast import CastPolicy
    from .cast import cast_tree

    CastPolicy(cast)  # a malformed cast= fails before any work

    start = time.monotonic()
    src_fmt = _detect.canonical(src_format) or _detect.detect(src)
    named = _detect.canonical(dst_format, target=True) or _detect.target_format(dst)
    options = WriteOptions(compress, None if max_shard_size is None
                           else parse_size(max_shard_size), _detect.canonical(hf_weights),
                           ranks)
    dst_fmt = target_of(named, options)
    options = for_target(named, options)
    options.codec(dst_fmt)  # a codec the target cannot write fails before any work
    directory = dst_fmt in DIRECTORY_TARGETS
    dst_options = storage_options_for(dst, storage_options)
    local = local_path(dst)
    if local is None and dst_fmt != "uckpt":
        raise UnknownFormatError(f"{str(dst)!r}: a {dst_fmt} target is written to a local "
                                 "file; only a uckpt checkpoint is written to an object store",
                                 path=str(dst), hint="convert to a local path, or to a uckpt "
                                                     "checkpoint (a name without an extension)")
    dst_path = local.absolute() if local is not None else None
    if dst_path is not None and (Path(src).absolute() == dst_path or (
            dst_path.exists() and Path(src).exists() and os.path.samefile(src, dst_path))):
        raise UckptError(f"{str(src)!r}: source and destination are the same",
                         hint="write the conversion to another path")
    writer = _module(WRITERS[dst_fmt])
    if not dry_run:
        if dst_fmt == "uckpt":
            check_checkpoint(dst if dst_path is None else dst_path, force, dst_options)
        elif hasattr(writer, "check_target"):
            writer.check_target(dst_path, force)
        else:
            check_output(dst_path, directory, force)
    kwargs = _write_arguments(writer, dst_fmt, options, save_options)
    with open_checkpoint(src, src_fmt, limits=limits) as tree:
        if select:
            patterns = patterns_of(select)
            if is_node_path(patterns):
                select_node(tree, patterns[0])
            else:
                keep(tree, patterns)
        tree.root = cast_tree(tree.root, cast)
        rename_keys(tree, strip_prefix, add_prefix)
        # the frameworks' own file layouts, after the user's selection
        layouts.adapt(tree, dst_fmt, dst)
        lay = writer.plan(tree)
        report = Report(str(src), str(dst), src_fmt, dst_fmt, dry_run=dry_run,
                        arrays=[(n, leaf.dtype, leaf.shape, leaf.nbytes) for n, leaf in lay.arrays],
                        values=[n for n, _ in lay.values], warnings=tree.notes + lay.notes)
        for text in report.warnings:
            warnings.warn(text, ConvertWarning, stacklevel=2)
        if not dry_run:
            done = Progress(lay.nbytes, progress)
            stop = prefetch(lay.arrays) if src_fmt in PREFETCHED else (lambda: None)
            try:
                if dst_fmt == "uckpt":  # through its store, as a save writes
                    write_checkpoint(dst if dst_path is None else dst_path, force, dst_options,
                                     lambda sink: writer.write(tree, lay, sink, done, **kwargs))
                elif hasattr(writer, "write_output"):  # several files (a TensorFlow prefix)
                    writer.write_output(dst_path, force,
                                        lambda tmp: writer.write(tree, lay, tmp, done, **kwargs))
                else:
                    write_atomically(dst_path, directory, force,
                                     lambda tmp: writer.write(tree, lay, tmp, done, **kwargs))
            finally:
                stop()
    report.seconds = time.monotonic() - start
    return report


def _write_arguments(writer, fmt: str, options, save_options=None) -> Dict[str, Any]:
    """What ``writer.write`` is given beyond the tree: its options, or for uckpt's writer
    its :class:`~uckpt.SaveOptions` (``save_options``, with ``compress``'s codec)."""
    from ..options import SaveOptions
    from .options import OptionError

    params = inspect.signature(writer.write).parameters
    if save_options is not None and "save_options" not in params:
        raise OptionError(f"save_options lay out a uckpt checkpoint, not a {fmt} target",
                          hint="leave save_options out, or convert to a uckpt directory")
    if "options" in params:
        return {"options": options}
    codec = options.codec(fmt)
    if "save_options" not in params:
        if codec is not None:
            raise OptionError(f"compressing a {fmt} target ({codec}) is not supported by "
                              "uckpt convert", hint="convert without --compress")
        return {}
    if save_options is not None and not isinstance(save_options, SaveOptions):
        raise OptionError(f"save_options must be a uckpt.SaveOptions, got "
                          f"{type(save_options).__name__}",
                          hint="pass uckpt.SaveOptions(chunk_bytes=..., alignment=...)")
    layout = save_options or SaveOptions()
    if codec is not None:
        if layout.codec is not None:
            raise OptionError("compress given both as a keyword and in save_options",
                              hint="give the compression in one of them only")
        layout = dataclasses.replace(layout, compression=codec)
    return {"save_options": layout}
