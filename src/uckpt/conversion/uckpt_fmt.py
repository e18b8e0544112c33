"""uckpt checkpoints as a source (every chunk checksummed as it is read) and as a target,
written leaf by leaf.

Read, an array is allocated whole (its compressed chunks decoded into it), one at a time;
an array larger than ``max_ratio`` times all the source's data files is refused when the
source is opened (:func:`check_held`), so a conversion's memory is bounded by the input's
size, not by what its manifest declares. Opened for streaming (``uckpt diff``), an array
whose chunks tile it in flat order is also given a block at a time, in a constant
(``Leaf.stream``), and only a whole read is held to ``max_ratio``.

The writer lays arrays out as uckpt's single-process save does (docs/format.md
sections 15 and 9: aligned arrays, slabs along the first axis for large
arrays, as :class:`uckpt.SaveOptions` say), but reads, checksums and writes one array
at a time, so a conversion holds at most one array in memory. It writes through the
:class:`~uckpt.storage.base.CheckpointSink` the caller opened on the target's store (a
directory or an object store, as :func:`uckpt.save` does), and the caller commits the
manifest it returns.

What a uckpt manifest has no field for (HDF5 attributes, an OrderedDict's
attributes, a root that is not a dict) goes to the manifest's ``metadata``
under ``"uckpt_convert"``; the step and user metadata of a uckpt source are
kept as they are.
"""
from __future__ import annotations

import datetime as _dt
import math
from dataclasses import replace
from functools import partial
from typing import Any, Dict, Iterator, List, Tuple

import numpy as np

from .._version import __version__
from ..format import ArrayEntry, Chunk, FileEntry, Manifest, data_file_name
from ..format import encode_manifest
from ..options import DEFAULT, SaveOptions
from ..loading.reader import CheckpointReader
from ..loading.readruns import flat_chunks
from ..storage import CheckpointSink
from ..saving.writer import encode_chunks
from . import skeleton
from .limits import Limits, check_ratio, current
from .interchange import Leaf, Tree, reading
from .progress import Progress

META_KEY = "uckpt_convert"
STEP, METADATA = "uckpt.step", "uckpt.metadata"


def stored_bytes(m: Manifest) -> int:
    """Bytes of the data files a manifest's arrays are stored in (its own and its bases')."""
    return sum(f.size for f in m.files.values()) + \
        sum(size for files in m.bases.values() for size in files.values())


def check_held(m: Manifest, where: str, limits: Limits) -> None:
    """Refuse, before reading anything, a checkpoint whose largest array is more than
    ``max_ratio`` times the bytes of all its data files (a small checkpoint of Zstandard
    frames that each expand up to 32,768 times)."""
    largest = max(m.arrays.values(), key=lambda e: e.nbytes, default=None)
    if largest is not None:
        check_ratio(largest.nbytes, stored_bytes(m), f"array {largest.path!r}", where, limits)


def read(path, fmt: str = "uckpt", *, streaming: bool = False) -> Tree:
    """The checkpoint at ``path`` as a tree of lazy leaves. Only the root manifest is read
    at open (the ``max_ratio`` check needs only its sizes); a leaf's read reads the
    manifest parts that hold that array (:meth:`CheckpointReader.entry`). ``streaming``:
    leaves whose chunks tile them in flat order (:func:`uckpt.loading.readruns.flat_chunks`)
    stream (``Leaf.stream``; any other is read whole and cut), and the ``max_ratio`` check
    is made when an array is read whole, not when the checkpoint is opened (streaming
    holds a constant, whatever the ratio)."""
    reader = CheckpointReader(path, on_demand=True)
    with reading(fmt, reader.close) as tree:
        m = reader.manifest
        where, limits = str(reader.directory), current()
        if not streaming:
            check_held(m, where, limits)
        cache: Dict[str, Leaf] = {}

        def whole(name: str):
            if streaming:
                check_ratio(m.arrays[name].nbytes, stored_bytes(m), f"array {name!r}", where,
                            limits)
            return reader.read_arrays({name: None})[name]

        def stream(name: str, nbytes: int) -> Iterator[np.ndarray]:
            entry = reader.entry(name)  # its parts attached: all its chunks are known
            if flat_chunks(entry) is not None:
                yield from reader.stream(entry, nbytes)
                return
            yield from replace(cache[name], stream=None).blocks(nbytes)  # read whole, cut

        def leaf_of(name: str) -> Leaf:
            if name not in cache:
                entry = m.arrays[name]  # (dtype and shape: the root's; chunks: maybe pending)
                cache[name] = Leaf(entry.dtype, entry.shape, lambda p=name: whole(p),
                                   stream=partial(stream, name) if streaming else None)
            return cache[name]

        metadata = dict(m.metadata)
        own = metadata.pop(META_KEY, None)
        own = own if isinstance(own, dict) else {}
        extras = own.get("extras")
        tree.extras = dict(extras) if isinstance(extras, dict) else {}
        tree.extras.setdefault("", {}).update({STEP: m.step, METADATA: metadata})
        root = skeleton.build(m.tree, leaf_of, str(reader.directory))
        tree.root = skeleton.unwrap(root, own)
    return tree


def plan(tree: Tree) -> skeleton.Layout:
    return skeleton.layout(tree.root)


def _chunks(shape: Tuple[int, ...], nbytes: int, chunk_bytes: int) -> List[Tuple[int, int]]:
    """(first row, rows) of each chunk, as a single-process uckpt save cuts an array."""
    if nbytes == 0:
        return []
    rows = shape[0] if shape else 1
    if not shape or nbytes < 2 * chunk_bytes or rows < 2:
        return [(0, rows)]
    row_bytes = nbytes // rows
    n = math.ceil(rows / max(1, chunk_bytes // row_bytes))
    per = math.ceil(rows / n)
    return [(r, min(per, rows - r)) for r in range(0, rows, per)]


def write(tree: Tree, lay: skeleton.Layout, sink: CheckpointSink, progress: Progress,
          save_options: SaveOptions = DEFAULT) -> bytes:
    """Write the data file through ``sink`` (a new checkpoint's, of any store: it is the
    one path of the format's bytes to storage), laid out as ``save_options`` say, and
    return the manifest's bytes, for the caller to commit; compressed chunks are stored
    raw where they do not shrink."""
    compress, align = save_options.codec, save_options.alignment
    name = data_file_name(0)
    arrays: Dict[str, ArrayEntry] = {}
    end = 0

    def pieces():  # (offset, bytes) of each stored chunk, one array read at a time
        nonlocal end
        for path, leaf in lay.arrays:
            arr = leaf.read()
            flat = arr.reshape(-1).view(np.uint8)
            row_bytes = leaf.nbytes // (leaf.shape[0] or 1) if leaf.shape else leaf.nbytes
            cut = []
            for first, rows in _chunks(leaf.shape, leaf.nbytes, save_options.chunk_bytes):
                start = (first,) + (0,) * (len(leaf.shape) - 1) if leaf.shape else ()
                box = (rows,) + leaf.shape[1:] if leaf.shape else ()
                cut.append((path, Chunk(name, 0, 0, start, box, (), ""),
                            flat[first * row_bytes:(first + rows) * row_bytes]))
            encoded = encode_chunks(cut, compress)  # checksums and content hashes too
            at = -(-end // align) * align if leaf.nbytes else end
            chunks, data, stored = [], None, None
            for (_, key, data), (codec, stored, checksum, content) in zip(cut, encoded):
                stored = memoryview(stored).cast("B")
                chunks.append(Chunk(name, at, len(stored), key.start, key.shape, codec, checksum,
                                    content))
                if len(stored):
                    yield at, stored
                progress.advance(data.nbytes)
                at += len(stored)
            end = at
            arrays[path] = ArrayEntry(path, leaf.dtype, leaf.shape, tuple(chunks))
            # nothing of this array may stay referenced while the next one is read: the
            # last piece's views would keep all of it (two arrays held, not one)
            del arr, flat, cut, encoded, data, stored

    sink.write_stream(name, pieces())
    manifest = Manifest(world_size=1, tree=lay.skeleton, arrays=arrays,
                        files={name: FileEntry(name, 0, end)}, step=_step(tree),
                        metadata=_metadata(tree, lay), generator=f"uckpt {__version__}",
                        created=_dt.datetime.now(_dt.timezone.utc)
                        .strftime("%Y-%m-%dT%H:%M:%S.%fZ"))
    return encode_manifest(manifest)


def _step(tree: Tree) -> Any:
    step = tree.extras.get("", {}).get(STEP)
    return step if type(step) is int and step >= 0 else None


def _metadata(tree: Tree, lay: skeleton.Layout) -> Dict[str, Any]:
    root = tree.extras.get("", {})
    metadata = root.get(METADATA)
    out = dict(metadata) if isinstance(metadata, dict) else {}
    extras = {k: v for k, v in tree.extras.items() if k != ""}
    rest = {k: v for k, v in root.items() if k not in (STEP, METADATA)}
    if rest:
        extras[""] = rest
    own: Dict[str, Any] = {}
    if extras:
        own["extras"] = extras
    if lay.wrapped_root:
        own["wrapped_root"] = True
    if own:
        out[META_KEY] = own
    return out
