"""``torch.nn.Module``: every entry of ``state_dict()`` (parameters and persistent buffers).

save: ``extract`` returns ``{name: array}`` viewing the live tensors. Tied
parameters appear under each of their names as the *same* array object, so the
core stores them once.
load: ``prepare`` compares names, shapes and dtypes with the module, collects
every difference and raises one error before anything changes (with
``strict=False``, entries on one side only are reported, not refused, and the
others loaded, as ``load_state_dict(strict=False)`` does); it returns the
tensors' own memory as read targets where it can (CPU, contiguous), so the core
reads straight into the parameters. ``restore`` then calls
``module.load_state_dict`` (hooks and ``_extra_state`` included), handing it the
live tensor itself wherever the core already read into it, so only the other
entries are copied and tied parameters stay tied. When the core read every entry
in place and nothing in the module customises loading (see ``_loads_plainly``),
``load_state_dict`` would only copy each tensor onto itself, so it is not called.
DTensor entries (``distribute_tensor``, FSDP2's ``fully_shard``) are saved as
:class:`uckpt.Shard` leaves and loaded into this rank's box only (see
:mod:`.dtensor`); ``restore`` completes the local tensor and hands
``load_state_dict`` the live DTensor.
"""
from __future__ import annotations

import weakref

import numpy as np
import torch
from torch import nn

from uckpt.adapter import Adapter, ArraySpec
from uckpt.dtypes import name_of
from uckpt.errors import KeyMismatchError, StateMismatchError

from .checks import array_problem, raise_problems
from .convert import (_NAMES, PLAIN_TENSORS, from_numpy, same_memory, tree_from_numpy,
                      writable_view)
from .device import to_leaf, tree_to_numpy
from .dtensor import fill, is_dtensor, read_target
from .layout import align_compiled

_EXTRA = "_extra_state"
_DOT_EXTRA = "." + _EXTRA
_UNINITIALIZED = nn.parameter.UninitializedTensorMixin


def _is_array(key: str, value) -> bool:
    """An entry whose memory the adapter may read into: a tensor that is neither a
    module's extra state nor a lazy module's uninitialized parameter."""
    return (isinstance(value, torch.Tensor) and not isinstance(value, _UNINITIALIZED)
            and not key.endswith(_DOT_EXTRA) and key != _EXTRA)


def _matches(t, leaf) -> bool:
    """The common case of ``array_problem(key, t, leaf) is None``, for a plain tensor and
    an ArraySpec or ndarray leaf of its shape and dtype (False: ask array_problem)."""
    if isinstance(leaf, ArraySpec):
        name = _NAMES.get(t.dtype)
        return leaf.shape == t.shape and name is not None and leaf.fits(name)
    return type(leaf) is np.ndarray and leaf.shape == t.shape and \
        name_of(leaf.dtype) == _NAMES.get(t.dtype)


def _target(key: str, t, spec):
    """The in-place read target of entry ``key``: the tensor's memory, this rank's box of a
    DTensor (:mod:`.dtensor`), or None."""
    if type(t) in PLAIN_TENSORS and not key.endswith(_DOT_EXTRA) and key != _EXTRA:
        return writable_view(t)
    if not _is_array(key, t):
        return None
    if is_dtensor(t):
        return read_target(t, spec, key) if isinstance(spec, ArraySpec) else None
    return writable_view(t)


#: the ``_load_from_state_dict`` methods that only copy the entries given (BatchNorm's
#: adds a missing ``num_batches_tracked`` first, and a restore passes every key)
_PLAIN_LOADERS = frozenset(filter(None, (
    nn.Module._load_from_state_dict,
    getattr(getattr(nn.modules.batchnorm, "_NormBase", None), "_load_from_state_dict", None))))
_plain_types: dict = {}  # module class -> whether it loads as nn.Module does


def _plain_type(cls) -> bool:
    plain = _plain_types.get(cls)
    if plain is None:
        plain = _plain_types[cls] = (cls._load_from_state_dict in _PLAIN_LOADERS
                                     and cls.set_extra_state is nn.Module.set_extra_state)
    return plain


def _loads_plainly(obj: nn.Module) -> bool:
    """Whether ``obj.load_state_dict`` of its own live tensors would change nothing: it is
    torch's own, no module under it has load hooks or its own loading code, and tensors
    are copied, not swapped (``torch.__future__``)."""
    if type(obj).load_state_dict is not nn.Module.load_state_dict or \
            torch.__future__.get_swap_module_params_on_conversion():
        return False
    return all(_plain_type(type(m)) and not m._load_state_dict_pre_hooks
               and not m._load_state_dict_post_hooks for m in obj.modules())


def _renames(tree, live, obj, note: bool) -> dict:
    """{checkpoint key: live key} for the keys that differ by ``torch.compile``'s prefix."""
    aligned = align_compiled(tree, live.keys(), type(obj).__name__, note)
    if aligned is tree:
        return {}
    return {old: new for old, new in zip(tree, aligned) if old != new}


def _rename(tree, names: dict):
    return {names.get(k, k): v for k, v in tree.items()} if names else tree


class ModuleAdapter(Adapter):
    name = "torch.module"
    partial = True  # strict=False: the entries both hold, as load_state_dict(strict=False)

    def __init__(self) -> None:
        #: module -> {key: (tensor, the view of its memory handed to the core)}, from
        #: ``prepare`` to ``restore``: a loaded array that *is* that view was read in place
        self._views: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        #: modules being loaded with strict=False (from ``prepare`` to ``restore``)
        self._partial: "weakref.WeakSet" = weakref.WeakSet()

    def handles(self, obj):
        return isinstance(obj, nn.Module)

    def extract(self, obj):
        seen = {}  # id(tensor) -> array, so tied entries share one array
        out = {}
        for key, value in obj.state_dict(keep_vars=True).items():
            if isinstance(value, torch.Tensor):
                if id(value) not in seen:
                    seen[id(value)] = to_leaf(value, key)
                out[key] = seen[id(value)]
            else:
                out[key] = tree_to_numpy(value, key)
        return out

    def prepare(self, obj, spec, keys=None):
        live = obj.state_dict(keep_vars=True)
        names = _renames(spec, live, obj, note=True)
        spec = _rename(spec, names)
        self._partial.discard(obj)
        if keys is not None and isinstance(spec, dict):  # strict=False
            back = {new: old for old, new in names.items()}
            for key in sorted(live.keys() - spec.keys()):
                keys.missing(key)
            for key in sorted(spec.keys() - live.keys()):
                keys.unexpected(back.get(key, key))
            live = {k: t for k, t in live.items() if k in spec}
            spec = {k: v for k, v in spec.items() if k in live}
            self._partial.add(obj)
        self._check(obj, live, spec)
        targets = {key: _target(key, t, spec[key]) for key, t in live.items()}
        self._views[obj] = {key: (live[key], view) for key, view in targets.items()
                            if isinstance(view, np.ndarray)}
        if not names:
            return targets
        back = {new: old for old, new in names.items()}
        return {back.get(key, key): t for key, t in targets.items()}

    def restore(self, obj, tree):
        live = obj.state_dict(keep_vars=True)
        tree = _rename(tree, _renames(tree, live, obj, note=False))
        views = self._views.pop(obj, {})
        partial = obj in self._partial
        self._partial.discard(obj)
        if partial and isinstance(tree, dict):
            live = {k: t for k, t in live.items() if k in tree}
        read_into = set() if not isinstance(tree, dict) else {
            key for key, (t, view) in views.items()
            if live.get(key) is t and tree.get(key) is view}
        self._check(obj, live, tree, read_into)
        sd = {}
        in_place = True  # every entry is the live tensor, already holding its values
        for key, value in tree.items():
            t = live[key]
            if key in read_into:
                sd[key] = t
            elif not isinstance(value, np.ndarray) or not _is_array(key, t):
                sd[key] = tree_from_numpy(value)
                in_place = False
            elif is_dtensor(t):
                fill(t, value)  # load_state_dict then copies the DTensor onto itself
                sd[key] = t
                in_place = False
            elif same_memory(value, t):
                sd[key] = t
            else:
                sd[key] = from_numpy(value)
                in_place = False
        if not (in_place and _loads_plainly(obj)):
            obj.load_state_dict(sd, strict=not partial)

    @staticmethod
    def _check(obj, live, tree, read_into=frozenset()):
        """Raise one error naming every difference between ``live`` and ``tree`` (entries
        in ``read_into`` are the tensors' own memory, so they match)."""
        what = f"the {type(obj).__name__} module"
        if not isinstance(tree, dict):
            raise StateMismatchError(f"the checkpoint holds a {type(tree).__name__} where "
                                     f"{what} expects a state_dict")
        problems = []
        for key, t in live.items():
            leaf = tree.get(key, tree)  # (tree: absent)
            if leaf is tree or key in read_into or not _is_array(key, t) or \
                    (type(t) in PLAIN_TENSORS and _matches(t, leaf)):
                continue
            problem = array_problem(key, t, leaf)
            if problem:
                problems.append(problem)
        missing = live.keys() - tree.keys()
        unexpected = tree.keys() - live.keys()
        if missing or unexpected:
            raise KeyMismatchError(what, missing=missing, unexpected=unexpected,
                                   mismatched=[msg for _, msg in problems],
                                   hint="build the same architecture that was saved, or "
                                        "pass strict=False to load the entries both hold")
        raise_problems(what, problems)
