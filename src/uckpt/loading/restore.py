"""Restore a checkpoint into live objects.

Three phases, so that a mismatch changes nothing:

1. *match*: walk the state mapping against the manifest's tree. Keys, shapes and
   dtypes are checked, and each framework object's adapter ``prepare``s (and
   validates) with array specs only. All problems are collected and raised as
   one error before anything is read.
2. *read*: read every needed array, into the objects' own memory where an
   adapter or a NumPy destination allows it, verifying every chunk.
3. *apply*: adapters ``restore`` their objects; NumPy destinations that could
   not be read into directly are copied into; plain values (numbers, strings,
   lists, tuples, None placeholders) are written back into their mapping. An
   adapter whose ``restore`` returns a new object (immutable arrays: JAX) has it
   put where the old one was (:mod:`uckpt.loading.replace`), into lists and
   tuples holding framework objects too, which the match goes into item by item.

A corrupted chunk found in phase 2 can leave objects partly overwritten; restore
them again from a valid checkpoint (``CheckpointManager.restore`` does this).
"""
from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .. import dtypes
from ..adapter import Adapter, ArraySpec
from ..errors import (DtypeMismatchError, KeyMismatchError, ShapeMismatchError, StateMismatchError,
                      UckptError, UnsupportedObjectError)
from ..format import Manifest
from .cast import Cast, CastPolicy, CastSpec, with_hint
from .report import LoadReport
from . import partial
from .reader import CheckpointReader
from .replace import Replacer
from .selection import Patterns, Selection, selection_of
from ..registry import find_adapter, no_adapter_error
from ..tree.shard import PerRank, Shard
from ..tree.flatten import array_leaf_value, decode, escape, join, unescape


def spec_leaf(manifest: Manifest, policy: Optional[CastPolicy] = None):
    arrays, new = manifest.arrays, object.__new__

    def leaf(node):
        entry = arrays[node["path"]]
        if policy is not None:  # (its fields are checked: without the frozen __init__'s cost)
            spec = new(CastSpec)
            spec.__dict__.update(dtype=entry.dtype, shape=entry.shape, path=entry.path,
                                 policy=policy)
            return spec
        spec = new(ArraySpec)
        spec.__dict__.update(dtype=entry.dtype, shape=entry.shape)
        return spec
    return leaf


# values that cannot be restored in place: they are written back into their mapping
_PLAIN = (type(None), bool, int, float, str, bytes, list, tuple, np.generic)
_VALUES = (type(None), bool, int, float, str, bytes, np.generic, np.ndarray)


def holds_objects(obj: Any) -> bool:
    """Whether a list, tuple or mapping holds something besides values and NumPy arrays
    (a framework object, a Shard): the load then goes into it item by item."""
    if isinstance(obj, (list, tuple)):
        return any(holds_objects(v) for v in obj)
    if isinstance(obj, Mapping) and not hasattr(obj, "state_dict"):
        return any(holds_objects(v) for v in obj.values())
    return not isinstance(obj, _VALUES)


def _into(obj: Any, node: Dict[str, Any]) -> bool:
    """Whether the match goes into sequence ``obj`` (saved as ``node``) item by item: a
    namedtuple (rebuilt of its type), or one holding framework objects."""
    return isinstance(obj, (list, tuple)) and node["type"] in ("list", "tuple") and \
        len(node["items"]) == len(obj) and \
        (type(obj) not in (list, tuple) or holds_objects(obj))  # a namedtuple keeps its type


class _Matcher:
    def __init__(self, manifest: Manifest, rank: int = 0, policy: Optional[CastPolicy] = None,
                 report: Optional[LoadReport] = None, sel: Optional[Selection] = None) -> None:
        self.m = manifest
        self.rank = rank
        self.sel = sel  # select=: only these leaves are restored
        #: path -> what a partly selected object holds now (:mod:`uckpt.loading.partial`)
        self.current: Dict[str, Any] = {}
        self.policy = policy if policy is not None else CastPolicy()
        self.report = report if report is not None else LoadReport()
        self.targets: Dict[str, Any] = {}  # path -> array, or a Shard for a box
        self.copies: List[Tuple[np.ndarray, str]] = []  # (destination, array path)
        self.actions: List[Tuple[Adapter, Any, Dict[str, Any], str]] = []  # (.., path)
        self.needed: List[Dict[str, Any]] = []  # subtrees whose arrays must be read
        self.assign: List[Tuple[MutableMapping, Any, Dict[str, Any], str]] = []  # plain values
        self.skipped: List[List[str]] = []  # tree keys of what strict=False left unread
        self.sequences: set = set()  # paths of lists and tuples matched item by item

    def match(self, obj: Any, node: Dict[str, Any], path_keys: List[str], strict: bool) -> None:
        path = join(path_keys) or "<root>"
        if isinstance(obj, np.ndarray):
            self.array(obj, node, path)
            return
        if isinstance(obj, Shard):
            self.shard(obj, node, path)
            return
        if isinstance(obj, PerRank):
            if node["type"] != "dict" or node.get("key_type") != "int":
                raise StateMismatchError(f"{path!r}: the state has a PerRank, the checkpoint a "
                                         f"{node['type']} that is not per-rank", leaf=path)
            if str(self.rank) not in node["items"]:
                raise KeyMismatchError(
                    f"{path!r}: the checkpoint holds no value for rank {self.rank} (it has "
                    f"ranks {', '.join(node['items']) or 'none'})", missing=[str(self.rank)],
                    hint="per-rank state restores only into ranks that saved it; leave it out "
                         "of the state (strict=False) on the other ranks")
            self.match(obj.value, node["items"][str(self.rank)], path_keys + [str(self.rank)],
                       strict)
            return
        if isinstance(obj, Mapping) and not hasattr(obj, "state_dict"):
            if node["type"] == "object" and node["state"]["type"] == "dict":
                node = node["state"]  # an object's state loaded as a mapping (a pytree)
            if node["type"] != "dict":
                raise StateMismatchError(f"{path!r}: the state has a mapping, the checkpoint "
                                         f"a {node['type']}", leaf=path)
            self.mapping(obj, node, path_keys, strict)
            return
        if _into(obj, node):  # e.g. an Optax state: namedtuples of JAX arrays
            self.sequences.add(join(path_keys))
            for i, (v, n) in enumerate(zip(obj, node["items"])):
                self.match(v, n, path_keys + [str(i)], strict)
            return
        if isinstance(obj, _PLAIN):
            self.needed.append(node)  # plain values are returned, not restored in place
            return
        adapter = find_adapter(obj)
        if adapter is None:
            raise no_adapter_error(obj, join(path_keys), saving=False)
        sub = node
        if node["type"] == "object":
            if node["adapter"] != adapter.name:
                cls = type(obj)
                raise StateMismatchError(
                    f"{path!r}: the checkpoint holds a {node['adapter']} ({node['class']}), the "
                    f"object is a {cls.__module__}.{cls.__qualname__} ({adapter.name})", leaf=path)
            sub = node["state"]
        here = join(path_keys)
        if self.sel is not None and not self.sel.whole(here):  # keeps its other leaves
            try:
                self.current[here] = adapter.extract(obj)
            except UckptError as e:
                e.at_path(here)
                raise
            spec = partial.merged(sub, self.current[here], here, self.sel,
                                  spec_leaf(self.m, self.policy), partial.as_spec)
        else:
            spec = decode(sub, spec_leaf(self.m, self.policy))
        keys = self.report.at(path_keys) if not strict and getattr(adapter, "partial", False) \
            else None
        try:
            targets = adapter.prepare(obj, spec) if keys is None else \
                adapter.prepare(obj, spec, keys=keys)  # type: ignore[call-arg]  # (partial)
        except UckptError as e:
            e.at_path(join(path_keys))  # names the path in e itself
            if isinstance(e, DtypeMismatchError):
                with_hint(e, self.policy.hint())
            raise
        if keys is not None and keys.skipped:
            sub = pruned(sub, keys.skipped)
            self.skipped += [_raw(path_keys) + parts for parts in keys.skipped]
        self.collect_targets(sub, targets)
        self.needed.append(sub)
        self.actions.append((adapter, obj, sub, join(path_keys)))

    def mapping(self, obj: Mapping, node: Dict[str, Any], path_keys: List[str],
                strict: bool) -> None:
        items = node["items"]
        int_keys = node.get("key_type") == "int"
        wrong = [k for k in obj if (isinstance(k, int) and not isinstance(k, bool)) != int_keys]
        if wrong:  # 0 and "0" are different keys: never match them by their text
            raise KeyMismatchError(
                f"state {join(path_keys) or '<root>'!r}", mismatched=[
                    f"key {k!r} is {type(k).__name__}, the checkpoint's keys here are "
                    f"{'int' if int_keys else 'str'}" for k in wrong[:5]],
                hint="use keys of the type that was saved")
        keys = {str(k): k for k in obj}
        if self.sel is not None:  # the rest of the state is left as it is
            wants = self.sel.wants
            keys = {n: k for n, k in keys.items() if wants(join(path_keys + [escape(n)]))}
            items = {n: v for n, v in items.items() if wants(join(path_keys + [escape(n)]))}
        missing = [k for k in keys if k not in items]
        unexpected = [k for k in items if k not in keys]
        if strict and (missing or unexpected):
            raise KeyMismatchError(f"state {join(path_keys) or '<root>'!r}", missing=missing,
                                   unexpected=unexpected,
                                   hint="pass strict=False to restore only the keys both have "
                                        "(and report=uckpt.LoadReport() to see the others)")
        sink = self.report.at(path_keys)
        for name in missing:
            sink.missing(name)
            del keys[name]
        for name in unexpected:
            sink.unexpected(name)
            self.skipped.append(_raw(path_keys) + [name])
        for name, key in keys.items():
            value = obj[key]
            if isinstance(obj, MutableMapping) and isinstance(value, _PLAIN) and \
                    not _into(value, items[name]):
                self.assign.append((obj, key, items[name], join(path_keys + [escape(name)])))
            self.match(value, items[name], path_keys + [escape(name)], strict)

    def array(self, obj: np.ndarray, node: Dict[str, Any], path: str) -> None:
        if node["type"] == "object":
            node = node["state"]
        if node["type"] != "array":
            raise StateMismatchError(f"{path!r}: the state has an array, the checkpoint a "
                                     f"{node['type']}", leaf=path)
        entry = self.m.arrays[node["path"]]
        check_spec(obj, ArraySpec(entry.dtype, entry.shape), path, self.policy, node["path"])
        if _writable(obj) and node["path"] not in self.targets:
            self.targets[node["path"]] = obj
        else:
            self.copies.append((obj, node["path"]))
        self.needed.append(node)

    def shard(self, obj: Shard, node: Dict[str, Any], path: str) -> None:
        if node["type"] != "array":
            raise StateMismatchError(f"{path!r}: the state has a Shard, the checkpoint a "
                                     f"{node['type']}", leaf=path)
        entry = self.m.arrays[node["path"]]
        if tuple(obj.global_shape) != tuple(entry.shape):
            raise ShapeMismatchError(f"{path!r}: the checkpoint holds shape {list(entry.shape)}, "
                                     f"the Shard's global shape is {list(obj.global_shape)}",
                                     leaf=path)
        check_spec(obj.array, ArraySpec(entry.dtype, tuple(obj.array.shape)), path, self.policy,
                   node["path"])
        if _writable(obj.array):
            self.targets[node["path"]] = obj
        else:
            raise StateMismatchError(f"{path!r}: a Shard's array must be writable and "
                                     "C-contiguous to be loaded into", leaf=path)
        self.needed.append(node)

    def take(self, path: str, target: np.ndarray) -> None:
        """Read array ``path`` into ``target`` if it fits (else it is read and copied)."""
        entry = self.m.arrays[path]
        if path not in self.targets and target.shape == entry.shape and \
                self.delivers(path, entry.dtype, target) and _writable(target):
            self.targets[path] = target

    def delivers(self, path: str, stored: str, target: np.ndarray) -> bool:
        """Whether leaf ``path`` is read into ``target``'s dtype: its own, or the one its
        cast was approved to."""
        return target.dtype == dtypes.to_numpy(stored) or \
            self.policy.approved.get(path) == _name(target.dtype)

    def collect_targets(self, node: Dict[str, Any], targets: Any) -> None:
        if targets is None:
            return
        kind = node["type"]
        if kind == "array" and isinstance(targets, Shard):
            entry = self.m.arrays[node["path"]]
            if node["path"] not in self.targets and _writable(targets.array) and \
                    tuple(targets.global_shape) == entry.shape and \
                    self.delivers(entry.path, entry.dtype, targets.array):
                self.targets[node["path"]] = targets
            return
        if kind == "array" and isinstance(targets, np.ndarray):
            self.take(node["path"], targets)
        elif kind == "dict" and isinstance(targets, Mapping):
            get, int_keys = targets.get, node.get("key_type") == "int"
            for k, v in node["items"].items():
                t = get(int(k) if int_keys else k)
                if t is None:
                    continue
                if type(t) is np.ndarray and v["type"] == "array":  # (most leaves: one call)
                    self.take(v["path"], t)
                else:
                    self.collect_targets(v, t)
        elif kind in ("list", "tuple") and isinstance(targets, (list, tuple)):
            for v, t in zip(node["items"], targets):
                self.collect_targets(v, t)
        elif kind == "object":
            self.collect_targets(node["state"], targets)


def _name(dtype: np.dtype) -> str:
    try:
        return dtypes.name_of(dtype)
    except Exception:  # noqa: BLE001 - a dtype the format cannot hold: named as NumPy does
        return str(dtype)


def check_spec(arr: np.ndarray, spec: ArraySpec, path: str,
               policy: Optional[CastPolicy] = None, leaf: Optional[str] = None) -> None:
    """Refuse a destination of another shape, or of a dtype ``policy`` does not convert
    to (leaf ``leaf``'s entry: the leaf's checkpoint path, ``path`` by default)."""
    if tuple(arr.shape) != tuple(spec.shape):
        raise ShapeMismatchError(f"{path!r}: the checkpoint holds shape {list(spec.shape)}, "
                                 f"the destination has {list(arr.shape)}", leaf=path)
    have = _name(arr.dtype)
    if have != spec.dtype:
        (policy or CastPolicy()).check(leaf or path, spec.dtype, have)


def _raw(path_keys: List[str]) -> List[str]:
    return [unescape(k) for k in path_keys]


def _writable(arr: np.ndarray) -> bool:
    flags = arr.flags
    return flags.writeable and flags.c_contiguous and arr.dtype.byteorder in "=<|"


def paths_in(node: Dict[str, Any], out: Optional[set] = None) -> set:
    """The array paths under ``node`` (added to ``out``)."""
    out = set() if out is None else out
    stack = [node]
    while stack:
        node = stack.pop()
        kind = node["type"]
        if kind in ("array", "bytes"):
            out.add(node["path"])
        elif kind == "dict":
            stack.extend(node["items"].values())
        elif kind in ("list", "tuple"):
            stack.extend(node["items"])
        elif kind == "object":
            stack.append(node["state"])
    return out


def restore_into(reader: CheckpointReader, state: Mapping, strict: bool = True,
                 rank: int = 0, cast: Cast = None, report: Optional[LoadReport] = None,
                 select: Optional[Patterns] = None) -> Dict[str, Any]:
    """Restore ``state`` in place from ``reader``; return the loaded tree for ``state``'s keys.

    ``rank`` picks the values of :class:`~uckpt.tree.shard.PerRank` subtrees; ``cast``: the
    dtype policy (:mod:`uckpt.loading.cast`); ``report``: filled with the keys a
    ``strict=False`` load skipped (:mod:`uckpt.loading.report`); ``select``
    (:mod:`uckpt.loading.selection`) restores only the leaves it picks: keys of ``state``
    holding none are left as they are (not refused), an object holding some keeps its
    other leaves (:mod:`uckpt.loading.partial`), and the tree returned holds those leaves
    alone."""
    if not isinstance(state, Mapping):
        raise UnsupportedObjectError(f"state must be a mapping, got {type(state).__name__}")
    m = reader.manifest
    sel = selection_of(m.tree, select, str(reader.directory))
    # phase 1: raises before any read
    matcher, wanted = matched(m, state, strict, rank, CastPolicy(cast), report, sel)
    arrays = reader.read_arrays(wanted)

    def leaf(node):  # None: not read (another rank's PerRank value)
        arr = arrays.get(node["path"])
        if arr is None or (node["type"] == "array" and len(node) == 2):  # (a plain array)
            return arr
        return array_leaf_value(node, arr)

    for dest, path in matcher.copies:  # phase 3
        np.copyto(dest, arrays[path])
    # adapters with restore_last (global random state) after the others, whose restore
    # may draw random numbers (e.g. lazy initialisation) from a generator restored before
    new: Dict[str, Any] = {}  # path -> the object an adapter's restore returned for it
    for adapter, obj, sub, path in sorted(matcher.actions, key=lambda a: a[0].restore_last):
        try:
            if sel is None or path not in matcher.current:
                out = adapter.restore(obj, decode(sub, leaf))
            else:  # some of its leaves selected: the others as it holds them
                out = adapter.restore(obj, partial.merged(sub, matcher.current[path], path, sel,
                                                          leaf, partial.on_host))
        except UckptError as e:
            e.at_path(path)  # names the path in e itself
            raise
        if out is not None:
            new[path] = out
    for mapping, key, node, path in matcher.assign:
        mapping[key] = decode(node, leaf) if sel is None or sel.whole(path) else \
            partial.merged(node, mapping[key], path, sel, leaf, partial.on_host)
    tree = m.tree if sel is None else sel.prune(m.tree)
    top = pruned(tree, matcher.skipped) if matcher.skipped else tree
    items = top["items"]
    if not new and not matcher.sequences:
        return {k: decode(items[str(k)], leaf) for k in state if str(k) in items}
    replacer = Replacer(new, matcher.sequences, rank)
    out_tree = {k: replacer.returned(state[k], items[str(k)], escape(str(k)), leaf)
                for k in state if str(k) in items}
    replacer.write_back(state, top, "", leaf)
    return out_tree


def matched(m: Manifest, state: Mapping, strict: bool = True, rank: int = 0,
            policy: Optional[CastPolicy] = None, report: Optional[LoadReport] = None,
            sel: Optional[Selection] = None) -> Tuple["_Matcher", Dict[str, Any]]:
    """Phase 1 of :func:`restore_into`: the matcher of ``state`` against ``m`` and what
    it reads (path -> target, as :meth:`CheckpointReader.read_arrays` takes it: a new
    array's dtype where a cast makes it another than the stored one); with ``sel``, the
    selected arrays alone."""
    if report is not None:
        report.clear()
    matcher = _Matcher(m, rank, policy, report, sel)
    matcher.mapping(state, m.tree, [], strict)
    matcher.report.missing_keys.sort()
    matcher.report.unexpected_keys.sort()
    paths: set = set()
    for node in matcher.needed:
        paths_in(node, paths)
    if sel is not None:
        paths &= sel.arrays
    for dest, path in matcher.copies:  # read in the destination's dtype, then copied
        if dest.dtype != dtypes.to_numpy(m.arrays[path].dtype):
            matcher.targets.setdefault(path, dest.dtype)
    return matcher, {p: matcher.targets.get(p, fresh(matcher.policy, m.arrays[p]))
                     for p in m.arrays if p in paths}


def fresh(policy: CastPolicy, entry, named: bool = False) -> Optional[np.dtype]:
    """What a leaf without a destination is read into: None (a new array of its stored
    dtype) or the dtype ``policy`` converts it to (``named``: a load without ``state``)."""
    if not policy.approved and not (named and policy.entries):
        return None
    name = policy.fresh_dtype(entry.path, entry.dtype, named)
    return None if name == entry.dtype else dtypes.to_numpy(name)


def pruned(node: Dict[str, Any], skipped: List[List[str]]) -> Dict[str, Any]:
    """A copy of ``node`` without the entries at the key paths ``skipped`` (lists of tree
    keys below it, through adapters' object nodes): what ``strict=False`` skipped as
    unexpected is neither read, nor restored, nor returned. Only the nodes on those paths
    are copied."""
    own: Dict[int, Dict[str, Any]] = {}  # id(copy) -> copy: nodes already copied

    def copy(n: Dict[str, Any]) -> Dict[str, Any]:
        if id(n) in own:
            return n
        if n.get("type") == "object":
            n = {**n, "state": copy(n["state"])}
        elif n.get("type") == "dict":
            n = {**n, "items": dict(n["items"])}
        own[id(n)] = n
        return n

    def items(n: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        while n.get("type") == "object":
            n = n["state"]
        return n["items"] if n.get("type") == "dict" else None

    top = copy(node)
    for parts in skipped:
        at: Optional[Dict[str, Any]] = items(top)
        for k in parts[:-1]:
            if at is None or k not in at:
                break
            child = at[k] = copy(at[k])
            at = items(child)
        else:
            if at is not None:
                at.pop(parts[-1], None)
    return top


def load_tree(reader: CheckpointReader, cast: Cast = None,
              select: Optional[Patterns] = None) -> Dict[str, Any]:
    """The whole checkpoint as NumPy arrays and plain values (leaves ``cast=`` names a dtype
    for converted to it); with ``select`` (:mod:`uckpt.loading.selection`), only the leaves
    it picks (and only their arrays read)."""
    m = reader.manifest
    policy = CastPolicy(cast)
    sel = selection_of(m.tree, select, str(reader.directory))
    tree = m.tree if sel is None else sel.prune(m.tree)
    arrays = reader.read_arrays({p: fresh(policy, e, True) for p, e in m.arrays.items()
                                 if sel is None or p in sel.arrays})
    return decode(tree, lambda node: array_leaf_value(node, arrays[node["path"]]))
