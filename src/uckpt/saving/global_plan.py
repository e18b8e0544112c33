"""The plan of a save by many ranks, from one all-gather of each rank's metadata.

Each rank describes its flattened state (:func:`local_metadata`): a digest of
its tree, and per array leaf the dtype, the global shape and the box it holds
(the whole array, unless it is a :class:`~uckpt.tree.shard.Shard`). Every rank then
runs :func:`global_plan` on the same gathered list and gets the same result:
the state is checked to be consistent across ranks (same tree, same leaves,
boxes that tile each array exactly, equal small replicated leaves) and every
box is split into pieces given to the ranks holding it, balanced by bytes
(:func:`uckpt.saving.plan_columns.plan_holdings`).
"""
from __future__ import annotations

import copy
import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from .. import dtypes
from ..adapter import DeviceArray
from ..codecs.checksum import crc32c
from ..errors import StateMismatchError
from ..format.tiling import find_defect
from ..options import DEFAULT_ALIGNMENT, DEFAULT_CHUNK_BYTES
from .plan import ArrayMeta, BoxHolders, SavePlan
from .plan_columns import Columns, Held, plan_columns
from ..tree.flatten import FlatState, unescape

#: replicated arrays up to this size are compared across ranks whole (by checksum),
#: larger ones by a sample of their elements
COMPARE_BYTES = 1 << 16


def _node_at(tree: Dict[str, Any], path_keys: Sequence[str]) -> Dict[str, Any]:
    node = tree
    for part in path_keys:
        while node["type"] == "object":
            node = node["state"]
        node = node["items"][unescape(part)] if node["type"] == "dict" else node["items"][int(part)]
    return node


def shared_tree(flat: FlatState) -> Dict[str, Any]:
    """The skeleton with every PerRank subtree emptied: what all ranks must agree on."""
    if not flat.per_rank:
        return flat.skeleton
    tree = copy.deepcopy(flat.skeleton)
    for path_keys in flat.per_rank:
        _node_at(tree, path_keys)["items"] = {}
    return tree


def digest(tree: Dict[str, Any]) -> str:
    text = json.dumps(tree, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()


def local_metadata(flat: FlatState, compare: bool = True) -> Dict[str, Any]:
    """What this rank tells the others before a save (JSON-able).

    ``replicated`` lists the plain array leaves (equal on every rank, small ones
    and samples of large ones checksummed), ``own`` this rank's :class:`Shard`
    boxes and :class:`PerRank` leaves. See :func:`compact` for what is sent.
    Without ``compare`` (a world of one: no other rank to compare with) the digests
    and checksums that only tell ranks apart are left out; every other check runs."""
    mine = tuple("/".join(path_keys) + "/" for path_keys in flat.per_rank)
    replicated: List[List[Any]] = []
    own: List[List[Any]] = []
    for path, arr in flat.arrays.items():
        start, gshape = flat.placements.get(path, ((0,) * arr.ndim, tuple(arr.shape)))
        small = None
        if (compare and path not in flat.placements and not isinstance(arr, DeviceArray)
                and arr.size):
            small = crc32c(_sample(arr))
        entry = [path, dtypes.name_of(arr.dtype), list(gshape), list(start), list(arr.shape),
                 small]
        (own if path in flat.placements or path.startswith(mine) else replicated).append(entry)
    per_rank = [[path_keys, _node_at(flat.skeleton, path_keys)["items"]]
                for path_keys in flat.per_rank]
    if not compare:
        return {"tree": "", "keys": {}, "replicated": replicated, "own": own,
                "per_rank": per_rank}
    tree = shared_tree(flat)
    keys = {k: digest(v) for k, v in tree["items"].items()}  # names what differs, if anything
    return {"tree": digest(tree), "keys": keys, "replicated": replicated, "own": own,
            "per_rank": per_rank}


def compact(meta: Dict[str, Any], rank: int) -> Dict[str, Any]:
    """What ``rank`` sends: rank 0 all of its metadata, the others a digest of their
    replicated leaves instead of the list (equal to rank 0's when all is well), so
    that the all-gather grows as N, not N^2, with the number of ranks."""
    if rank == 0:
        return meta
    out = dict(meta)
    out["replicated"] = digest(out["replicated"])  # type: ignore[arg-type]
    return out


def expand(gathered: List[Dict[str, Any]]) -> Optional[List[int]]:
    """Put rank 0's replicated leaves back in place of the ranks' matching digests;
    returns the ranks whose digest differs (they must send their lists), or None."""
    reference = digest(gathered[0]["replicated"])
    differ = [r for r, g in enumerate(gathered) if r and g["replicated"] != reference]
    for r, g in enumerate(gathered):
        if r and r not in differ:
            g["replicated"] = gathered[0]["replicated"]
    return differ or None


def _sample(arr: np.ndarray) -> np.ndarray:
    """The bytes compared across ranks: all of a small array; of a larger one, 4096
    elements spread evenly over it (diverged replicas differ almost everywhere)."""
    arr = dtypes.as_little_endian(arr)
    if arr.nbytes > COMPARE_BYTES:
        if arr.flags.c_contiguous:  # a strided view: no index array to build
            arr = arr.reshape(-1)[::arr.size // 4096][:4096]
        else:
            arr = np.asarray(arr.flat[np.linspace(0, arr.size - 1, 4096).astype(np.int64)])
    return np.ascontiguousarray(arr).reshape(-1).view(np.uint8)


@dataclass
class GlobalPlan:
    plan: SavePlan
    metas: Dict[str, ArrayMeta]  # every array of every rank, in save order
    #: path -> start of this rank's local array in the global one (sharded leaves)
    starts: Dict[str, Tuple[int, ...]]


def global_plan(gathered: List[Dict[str, Any]], rank: int, exact_chunk_bytes: int = 0, *,
                chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                alignment: int = DEFAULT_ALIGNMENT) -> GlobalPlan:
    """:func:`global_columns`' plan, with ``rank``'s starts of its sharded leaves."""
    metas, columns = global_columns(gathered, exact_chunk_bytes, chunk_bytes=chunk_bytes,
                                    alignment=alignment)
    return GlobalPlan(columns.plan(), metas, own_starts(gathered[rank]["own"]))


def global_columns(gathered: List[Dict[str, Any]], exact_chunk_bytes: int = 0, *,
                   chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                   alignment: int = DEFAULT_ALIGNMENT) -> Tuple[Dict[str, ArrayMeta], Columns]:
    """Check the ranks' metadata against each other and plan the save (same on every rank).

    Arrays are cut into chunks of ``exact_chunk_bytes`` when given (incremental saves), else of
    at most ``chunk_bytes``: with several ranks, of about an eighth of a rank's share where
    that is smaller, but not below 1 MiB (unless ``chunk_bytes`` is); each array starts at
    a multiple of ``alignment`` in its data file."""
    world = len(gathered)
    bad = [r for r, g in enumerate(gathered) if g["tree"] != gathered[0]["tree"]]
    if bad:
        first = gathered[bad[0]]["keys"]
        ref = gathered[0]["keys"]
        keys = sorted(k for k in set(first) | set(ref) if first.get(k) != ref.get(k))
        raise StateMismatchError(
            f"the state's structure or plain values differ between ranks: rank(s) "
            f"{', '.join(map(str, bad))} differ from rank 0 (rank {bad[0]} in key(s) "
            f"{', '.join(map(repr, keys))})",
            hint="every rank must pass the same keys and the same plain values (step, "
                 "epoch, hyper-parameters); wrap state that differs by rank, such as "
                 "uckpt.RandomState(), in uckpt.PerRank(...)")
    metas: Dict[str, ArrayMeta] = {}
    held: Dict[str, Tuple[Any, List[Any], List[Any], List[int]]] = {}  # shape, starts, ...
    sums: Dict[str, Dict[int, List[int]]] = {}
    sharing = [r for r, g in enumerate(gathered)  # ranks whose replicated leaves are rank 0's
               if r and g["replicated"] is gathered[0]["replicated"]]  # (expand)
    shares_zeros = set(sharing)
    for r, g in enumerate(gathered):
        entries = g["own"] if r in shares_zeros else g["replicated"] + g["own"]
        for path, dtype, gshape, start, shape, small in entries:
            boxes = held.get(path)
            if boxes is None:
                metas[path] = ArrayMeta(dtype, tuple(gshape))
                boxes = held[path] = (gshape, [], [], [])
            elif (boxes[0] != gshape and list(boxes[0]) != list(gshape)) or \
                    metas[path].dtype != dtype:
                meta = metas[path]
                raise StateMismatchError(
                    f"leaf {path!r} is {meta.dtype} {list(meta.shape)} on one rank and "
                    f"{dtype} {list(gshape)} on rank {r}", leaf=path)
            boxes[1].append(start)
            boxes[2].append(shape)
            boxes[3].append(r)
            if small is not None:
                sums.setdefault(path, {}).setdefault(small, []).append(r)
    shared = {entry[0]: entry[5] for entry in gathered[0]["replicated"]} if sharing else {}
    for path, small in shared.items():  # the others sharing rank 0's list hold as rank 0
        if small is not None:
            group = sums[path][small]
            group[:] = sorted(group + sharing)
    for path, by_sum in sums.items():
        if len(by_sum) > 1:
            groups = "; ".join(f"ranks {', '.join(map(str, rs))}" for rs in by_sum.values())
            raise StateMismatchError(
                f"replicated leaf {path!r} holds different values on different ranks ({groups})",
                leaf=path, hint="a plain array must be equal on every rank; wrap per-rank state "
                "(e.g. uckpt.RandomState()) in uckpt.PerRank(...), or declare slices with "
                "uckpt.Shard(...)")
    holders = {path: _holders(path, metas[path].shape, starts, shapes, ranks,
                              sharing if path in shared else [])
               for path, (_, starts, shapes, ranks) in held.items()}
    total = sum(m.nbytes for m in metas.values())
    if not exact_chunk_bytes:
        exact_chunk_bytes = chunk_bytes if world == 1 else \
            min(chunk_bytes, max(1 << 20, total // (8 * world)))
    return metas, plan_columns(metas, holders, world, exact_chunk_bytes, alignment)


def own_starts(own: List[List[Any]]) -> Dict[str, Tuple[int, ...]]:
    """Where each of a rank's sharded leaves starts in its global array, from its
    metadata's ``own`` entries (:func:`local_metadata`)."""
    return {path: tuple(start) for path, dtype, gshape, start, shape, small in own
            if tuple(shape) != tuple(gshape)}


def _holders(path: str, shape: Tuple[int, ...], starts: List[Any], shapes: List[Any],
             ranks: List[int], sharing: List[int]) -> Union[BoxHolders, Held]:
    """Who holds which box of array ``path`` (:class:`~uckpt.saving.plan_columns.Held`; one
    box as :data:`~uckpt.saving.plan.BoxHolders`, which is cheaper to plan),
    after checking that the distinct boxes tile the array (:func:`_check_tiling`); the
    ranks ``sharing`` rank 0's replicated leaves hold what rank 0 holds."""
    k, ndim = len(ranks), len(shape)
    if k == 1 or not ndim:  # one box: a leaf of one rank (or rank 0's replicated), or 0-d
        if list(shapes[0]) != list(shape) or any(starts[0]):  # else the whole array: tiled
            _check_tiling(path, shape, starts[:1], shapes[:1])
        return [((tuple(starts[0]), tuple(shapes[0])), tuple(sorted(ranks + sharing)))]
    key = np.concatenate([np.array(starts, dtype=np.int64).reshape(k, ndim),
                          np.array(shapes, dtype=np.int64).reshape(k, ndim)], axis=1)
    order = np.lexsort(key.T[::-1])  # by start, then shape; a box's ranks ascending
    key = key[order]
    distinct = np.ones(k, dtype=bool)
    distinct[1:] = np.any(key[1:] != key[:-1], axis=1)
    rows = key[distinct]
    first = order[distinct]  # where each distinct box first came
    appearing = np.argsort(first, kind="stable")  # the distinct boxes as the ranks gave them
    _check_tiling(path, shape, rows[appearing, :ndim], rows[appearing, ndim:])
    grouped = np.asarray(ranks, dtype=np.int64)[order].tolist()
    if len(rows) == k:
        held = [(r,) for r in grouped]
    else:
        bounds = np.flatnonzero(distinct).tolist() + [k]
        held = [tuple(grouped[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    if sharing:  # rank 0's box is held by the ranks sharing its list too
        zero = int(np.cumsum(distinct)[int(np.flatnonzero(order == ranks.index(0))[0])]) - 1
        held[zero] = tuple(sorted(held[zero] + tuple(sharing)))
    return Held(rows[:, :ndim], rows[:, ndim:], held)


def _check_tiling(path: str, shape: Tuple[int, ...], starts_in: Any, extents_in: Any) -> None:
    """Distinct boxes (``starts_in``, ``extents_in``: one row each) must lie inside the
    array, not overlap, and cover it (O(n log n) for the layouts ranks declare:
    format/tiling.py, as for a manifest's chunks)."""
    n = len(starts_in)
    starts = np.asarray(starts_in, dtype=np.int64).reshape(n, len(shape))
    extents = np.asarray(extents_in, dtype=np.int64).reshape(n, len(shape))

    def held(i: int) -> Tuple[List[int], List[int]]:
        return starts[i].tolist(), extents[i].tolist()

    covered = int(np.prod(extents, axis=1).sum()) if n else 0
    total = math.prod(shape)
    full = np.asarray(shape, dtype=np.int64).reshape(1, -1)
    ends = starts + extents
    outside = np.flatnonzero(np.any((starts < 0) | (ends > full) | (ends < starts), axis=1))
    if outside.size:
        start, extent = held(int(outside[0]))
        raise StateMismatchError(
            f"sharded leaf {path!r}: the box at {list(start)} (shape {list(extent)}) is not "
            f"inside its global shape {list(shape)}", leaf=path,
            hint="a rank's box must lie inside the global array it is a slice of")
    nonempty = np.flatnonzero(np.all(ends > starts, axis=1))
    defect = find_defect(starts[nonempty], ends[nonempty], shape) if nonempty.size > 1 else None
    if defect is not None and defect.boxes:
        (si, ei), (sj, ej) = (held(int(nonempty[b])) for b in defect.boxes)
        raise StateMismatchError(
            f"sharded leaf {path!r}: the boxes at {list(si)} (shape {list(ei)}) and at "
            f"{list(sj)} (shape {list(ej)}) overlap (both hold element "
            f"{list(defect.index)})", leaf=path, hint=_OVERLAP_HINT)
    if covered != total:
        raise StateMismatchError(
            f"sharded leaf {path!r}: the ranks' boxes cover {covered} of its {total} elements "
            f"(global shape {list(shape)})", leaf=path,
            hint="every element of a sharded array must be held by some rank")
    if defect is not None:  # sizes add up, yet an element is missing: another is held twice
        raise StateMismatchError(
            f"sharded leaf {path!r}: the ranks' boxes overlap (element {list(defect.index)} "
            "is held by none of them although their sizes add up to the array's)", leaf=path,
            hint=_OVERLAP_HINT)


_OVERLAP_HINT = ("ranks holding the same data must declare the same box; different boxes "
                 "must be disjoint")


def merged_tree(flat_skeleton: Dict[str, Any], gathered: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The manifest's tree: the shared skeleton with every rank's PerRank subtrees."""
    if len(gathered) == 1:
        return flat_skeleton  # one rank: its skeleton already holds its PerRank subtrees
    tree = copy.deepcopy(flat_skeleton)
    for g in gathered:
        for path_keys, items in g["per_rank"]:
            _node_at(tree, path_keys)["items"].update(items)
    for path_keys, _ in gathered[0]["per_rank"]:
        node = _node_at(tree, path_keys)
        node["items"] = dict(sorted(node["items"].items(), key=lambda kv: int(kv[0])))
    return tree
