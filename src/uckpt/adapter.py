"""The contract between the core and the framework adapters.

An adapter turns one kind of framework object into a *state tree* and back. It
never opens a file and never knows about ranks: the core does all I/O.

A state tree is made of
  * containers: ``dict`` (keys ``str`` or ``int``), ``list``, ``tuple``;
  * array leaves: ``numpy.ndarray`` (any dtype named in :mod:`uckpt.dtypes`);
  * value leaves: ``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``.

Call order, on every rank that holds the object:

save
    ``handles(obj)`` then ``extract(obj)``. Array leaves may be views of the
    object's live memory: the core copies or writes them before ``save``
    returns (sync) or before the snapshot is released (async).

load
    ``handles(obj)``, then ``prepare(obj, spec)`` with the checkpoint's subtree
    in which every array is replaced by an :class:`ArraySpec` (nothing has been
    read yet: this is where an adapter validates keys, shapes and dtypes and
    refuses a mismatch before anything changes; a dtype is compared with
    :meth:`ArraySpec.fits`, which admits the casts the load's ``cast=`` allows, and
    an array it admits is then delivered in the destination's dtype). ``prepare`` returns a tree of
    the same shape whose array positions hold a writable, C-contiguous
    ``ndarray`` that the core reads into in place, or ``None`` for a fresh
    array; missing branches mean fresh arrays. Then the core reads and verifies
    the bytes, and calls ``restore(obj, tree)`` with the loaded tree. The
    arrays in that tree belong to the adapter from then on: it may keep them
    without copying (arrays it named as targets are its object's own memory).
    ``restore`` returns None when it restored ``obj`` in place (PyTorch,
    TensorFlow, Chainer), or a new object that stands for ``obj`` from then on
    (immutable arrays: a ``jax.Array`` cannot be written into). The core puts a
    new object where ``obj`` was in the state (its mapping, list, or a tuple or
    namedtuple rebuilt around it) and in the tree ``uckpt.load`` returns.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Hashable, Optional, Tuple

import numpy as np


@dataclass(frozen=True)
class ArraySpec:
    """What the checkpoint holds for one array leaf, before it is read."""

    dtype: str  # neutral dtype name, see uckpt.dtypes
    shape: Tuple[int, ...]

    @property
    def nbytes(self) -> int:
        from .dtypes import nbytes

        return nbytes(self.dtype, self.shape)

    def fits(self, dtype: str) -> bool:
        """Whether this leaf may be loaded into an array of neutral dtype ``dtype``: its own,
        or one the load's ``cast=`` converts it to (:mod:`uckpt.loading.cast`; the core then
        delivers it in ``dtype``, converted while reading). Adapters compare dtypes with this."""
        return dtype == self.dtype


def class_name(obj: Any) -> str:
    """``module.QualName`` of an object's class, as adapters record it."""
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def check_class(obj: Any, tree: Any, what: str) -> None:
    """StateMismatchError unless ``tree["class"]`` names the class of ``obj``.

    For adapters that record the class of what they saved (optimizers,
    schedulers): restoring Adam's state into SGD must fail before anything changes.
    """
    from collections.abc import Mapping

    from .errors import StateMismatchError

    saved = tree.get("class") if isinstance(tree, Mapping) else None
    if saved != class_name(obj):
        held = f"the state of a {saved}" if saved else f"no {what} state (no 'class' entry)"
        raise StateMismatchError(
            f"the checkpoint holds {held} but the {what} to restore is a {class_name(obj)}",
            hint=f"create the same {what} class that was saved before loading")


#: (error class, message): one thing that does not fit, collected before raising
Problem = Tuple[type, str]


def raise_problems(what: str, problems) -> None:
    """Raise one error listing every problem (None entries are skipped); its class is
    theirs when they share one, StateMismatchError otherwise."""
    from .errors import StateMismatchError

    problems = [p for p in problems if p]
    if not problems:
        return
    classes = {cls for cls, _ in problems}
    cls = classes.pop() if len(classes) == 1 else StateMismatchError
    raise cls("\n".join([f"{what} does not match the checkpoint"]
                        + [f"  {msg}" for _, msg in problems]))


class DeviceArray:
    """An array leaf that lives off the host (e.g. a CUDA tensor), copied on snapshot.

    An adapter returns one in place of an ``ndarray`` when the data is not in
    host memory. The core calls ``copy_to(out)`` with a C-contiguous host array
    of ``shape`` and ``dtype`` (from pinned memory made by ``allocator`` when
    given); it may start an asynchronous copy and return an object whose
    ``synchronize()`` the core calls, on a background thread, before reading
    ``out``. ``key`` identifies the memory, so two leaves with the same key are
    stored once (tied parameters).

    ``settle``: the source may be freed once ``save`` returns (a JAX buffer donated to
    the next step), so an asynchronous save waits for this copy before it returns,
    after the copies of every leaf have been started.
    """

    def __init__(self, shape, dtype, copy_to: Callable[[np.ndarray], Any], key: Hashable,
                 allocator: Optional[Callable[[int], Tuple[np.ndarray, Any]]] = None,
                 settle: bool = False) -> None:
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.copy_to = copy_to
        self.key = key
        #: ``allocator(nbytes) -> (uint8 ndarray, keepalive)`` for pinned host memory
        self.allocator = allocator
        self.settle = settle

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def __repr__(self) -> str:
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype}, key={self.key!r})"


class Adapter:
    """Base class for adapters; see the module docstring for the call order."""

    #: short name recorded in the manifest next to the subtree, e.g. ``"torch.module"``
    name: str = ""
    #: restore this adapter's objects after every other adapter's in the same load (the
    #: global random state: another adapter's ``restore`` may draw random numbers)
    restore_last: bool = False
    #: ``prepare`` takes ``keys=`` (a :class:`uckpt.loading.report.KeySink`) in a load with
    #: ``strict=False``: it then accepts the entries the object and the checkpoint share,
    #: reports the others (``keys.missing(key)``, ``keys.unexpected(key)``: a key of its
    #: subtree, a tuple of keys for a nested one) instead of refusing, and its ``restore``
    #: gets the shared entries only (the unexpected ones are not read). Adapters without it
    #: load their objects whole or refuse.
    partial: bool = False

    def handles(self, obj: Any) -> bool:
        raise NotImplementedError

    def extract(self, obj: Any) -> Any:
        raise NotImplementedError

    def prepare(self, obj: Any, spec: Any) -> Any:
        """Validate ``spec`` against ``obj``; return in-place read targets (or None)."""
        return None

    def restore(self, obj: Any, tree: Any) -> Any:
        """Put ``tree`` into ``obj``: None when done in place, else the new object that
        replaces ``obj`` (see the module docstring)."""
        raise NotImplementedError


class RNGProvider:
    """Global random state of one framework, captured by :class:`uckpt.RandomState`.

    Registered through the ``uckpt.rng`` entry-point group under the name of the
    framework's top-level module; consulted only when that module is already
    imported.
    """

    name: str = ""

    def get(self) -> Any:
        raise NotImplementedError

    def set(self, tree: Any) -> None:
        raise NotImplementedError
