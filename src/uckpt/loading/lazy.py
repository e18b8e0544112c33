"""``uckpt.open``: a checkpoint opened lazily, as safetensors' ``safe_open`` opens a file.

Opening reads the root manifest alone: keys, shapes, dtypes, the step, the metadata and
the plain values are known without reading any data. ``ck[key]`` reads one array,
``ck.slice(key)[a:b, ...]`` only the chunks that hold that box (:class:`~uckpt.Shard`
reads of :class:`~uckpt.loading.reader.CheckpointReader`); the manifest parts that list
an array's chunks are read when it is first read. Every chunk read is checked (its
CRC-32C, as stored, before a compressed one is decoded), so a damaged chunk that a read
does not need never stops it. Local directories, ``s3://`` and the other URLs of
:func:`uckpt.load`, compressed and incremental checkpoints (chunks read through their
bases) all work.
"""
from __future__ import annotations

from typing import Any, Dict, Iterator, List, Mapping, Optional, Set, Tuple

import numpy as np

from .. import dtypes
from ..errors import UnsupportedIndexError
from ..format import ArrayEntry
from ..tree.shard import Shard
from .reader import CheckpointReader
from .selection import leaves, unknown


class LazyCheckpoint:
    """A committed checkpoint opened for reading array by array (made by
    :func:`uckpt.open`; close it, or use it as a context manager)."""

    def __init__(self, target: Any, *, storage_options: Optional[Mapping[str, Any]] = None,
                 max_bytes: Optional[int] = None) -> None:
        self._reader = CheckpointReader(target, storage_options=storage_options,
                                        max_bytes=max_bytes, on_demand=True)
        self.where = str(self._reader.directory)
        self._values: Optional[Dict[str, Any]] = None
        self._aliases: Optional[Dict[str, str]] = None  # tied leaf path -> its array's

    def __enter__(self) -> "LazyCheckpoint":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the files (and connections) it holds; a second call does nothing."""
        self._reader.close()

    # -- what it holds, without reading data ------------------------------------------------
    @property
    def step(self) -> Optional[int]:
        return self._reader.manifest.step

    @property
    def metadata(self) -> Dict[str, Any]:
        """The user metadata saved with the checkpoint."""
        return dict(self._reader.manifest.metadata)

    def keys(self) -> List[str]:
        """The array paths, in the checkpoint's tree naming (``"model/fc.weight"``: the
        keys joined with ``/``, a ``/`` or ``~`` inside a key written ``~1`` / ``~0``), as
        the manifest lists them (an array tied to another is listed once, under the path
        it was saved at first; reading it by its other paths works too)."""
        return list(self._reader.manifest.arrays)

    def __iter__(self) -> Iterator[str]:
        return iter(self._reader.manifest.arrays)

    def __len__(self) -> int:
        return len(self._reader.manifest.arrays)

    def __contains__(self, key: object) -> bool:
        return key in self._reader.manifest.arrays or key in self._tied()

    def shape(self, key: str) -> Tuple[int, ...]:
        return tuple(self._entry(key).shape)

    def dtype(self, key: str) -> str:
        """The array's dtype by its neutral name (``"float32"``, ``"bfloat16"``)."""
        return self._entry(key).dtype

    def nbytes(self, key: str) -> int:
        return self._entry(key).nbytes

    def plain_values(self) -> Dict[str, Any]:
        """The plain (non-array) leaves by path: numbers, strings, booleans, None."""
        if self._values is None:
            from ..tree.flatten import decode

            self._values = {path: decode(node, lambda n: None)
                            for path, node in leaves(self._reader.manifest.tree)
                            if node["type"] in ("value", "float")}
        return dict(self._values)

    # -- reading ----------------------------------------------------------------------------
    def __getitem__(self, key: str) -> np.ndarray:
        """Array ``key``, read whole (a NumPy array; a NumPy scalar saved is a 0-d array,
        ``bytes`` a uint8 array), every chunk's checksum checked."""
        path = self._entry(key).path
        return self._reader.read_arrays({path: None})[path]

    def get_tensor(self, key: str) -> np.ndarray:
        """``ck[key]`` (safetensors' name)."""
        return self[key]

    def slice(self, key: str) -> "LazySlice":
        """Array ``key`` to be indexed: ``ck.slice(key)[1000:2000]`` reads only the chunks
        that hold those rows."""
        return LazySlice(self, self._entry(key))

    get_slice = slice

    def _entry(self, key: str) -> ArrayEntry:
        arrays = self._reader.manifest.arrays
        if isinstance(key, str) and key not in arrays:
            key = self._tied().get(key, key)
        if not isinstance(key, str) or key not in arrays:
            raise unknown(str(key), list(arrays), self.where, "array")
        return arrays[key]

    def _tied(self) -> Dict[str, str]:
        """The other paths of tied arrays (an array saved at two places of the tree)."""
        if self._aliases is None:
            self._aliases = {path: node["path"] for path, node in
                             leaves(self._reader.manifest.tree)
                             if node["type"] in ("array", "bytes") and node["path"] != path}
        return self._aliases

    def _read_box(self, entry: ArrayEntry, start: Tuple[int, ...], shape: Tuple[int, ...]
                  ) -> np.ndarray:
        out = np.empty(shape, dtype=dtypes.to_numpy(entry.dtype))
        if out.size:
            self._reader.read_arrays({entry.path: Shard(out, entry.shape, start)})
        return out

    def __repr__(self) -> str:
        return f"<uckpt.open {self.where!r}: {len(self)} arrays, step {self.step}>"


class LazySlice:
    """One array of a :class:`LazyCheckpoint`, read by basic indexing: integers, slices
    of step 1 and ``...``; a box is read whole from the chunks that intersect it."""

    def __init__(self, owner: LazyCheckpoint, entry: ArrayEntry) -> None:
        self._owner, self._entry = owner, entry

    @property
    def shape(self) -> Tuple[int, ...]:
        return tuple(self._entry.shape)

    @property
    def dtype(self) -> str:
        return self._entry.dtype

    def get_shape(self) -> List[int]:
        return list(self._entry.shape)

    def __len__(self) -> int:
        if not self._entry.shape:
            raise TypeError("len() of a 0-d array")
        return self._entry.shape[0]

    def __getitem__(self, index: Any) -> np.ndarray:
        start, shape, drop = box_of(index, tuple(self._entry.shape), self._entry.path)
        out = self._owner._read_box(self._entry, start, shape)
        return out.reshape([n for d, n in enumerate(shape) if d not in drop]) if drop else out


def box_of(index: Any, shape: Tuple[int, ...], key: str
           ) -> Tuple[Tuple[int, ...], Tuple[int, ...], Set[int]]:
    """``(start, shape, axes indexed by an integer)`` of the box that basic index
    ``index`` takes of an array of ``shape``; anything else is refused."""
    items = list(index) if isinstance(index, tuple) else [index]
    if sum(i is Ellipsis for i in items) > 1:
        raise _bad(key, index, "an index can only have a single ellipsis ('...')")
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items[at:at + 1] = [slice(None)] * (len(shape) - len(items) + 1)
    if len(items) > len(shape):
        raise _bad(key, index, f"{len(items)} indices for an array of {len(shape)} dimension(s)")
    items += [slice(None)] * (len(shape) - len(items))
    start: List[int] = []
    size: List[int] = []
    drop: Set[int] = set()
    for d, (item, n) in enumerate(zip(items, shape)):
        if isinstance(item, slice):
            if item.step not in (None, 1):
                raise _bad(key, index, f"step {item.step!r} in dimension {d}: the lazy reader "
                                       "reads slices of step 1")
            lo, hi, _ = item.indices(n)
            start.append(lo)
            size.append(max(0, hi - lo))
        elif isinstance(item, (int, np.integer)) and not isinstance(item, bool):
            i = int(item) + (n if item < 0 else 0)
            if not 0 <= i < n:
                raise _bad(key, index, f"index {int(item)} is out of range for dimension {d} "
                                       f"of size {n}")
            start.append(i)
            size.append(1)
            drop.add(d)
        else:
            raise _bad(key, index, f"{type(item).__name__} in dimension {d}: the lazy reader "
                                   "takes integers, slices of step 1 and '...'")
    return tuple(start), tuple(size), drop


def _bad(key: str, index: Any, why: str) -> UnsupportedIndexError:
    return UnsupportedIndexError(
        f"array {key!r}[{index!r}]: {why}", leaf=key,
        hint="read the box with integers and step-1 slices, then index the NumPy array "
             "returned (e.g. ck.slice(key)[a:b][::2])")


def open_checkpoint(path_or_url: Any, *, storage_options: Optional[Mapping[str, Any]] = None,
                    max_bytes: Optional[int] = None) -> LazyCheckpoint:
    """Open checkpoint ``path_or_url`` lazily (see :class:`LazyCheckpoint`)."""
    return LazyCheckpoint(path_or_url, storage_options=storage_options, max_bytes=max_bytes)


__all__ = ["LazyCheckpoint", "LazySlice", "open_checkpoint"]
