"""DeepSpeed ZeRO checkpoints (stages 1, 2 and 3) as a source, read without torch or DeepSpeed.

A checkpoint root holds ``latest`` (the tag, e.g. ``global_step3``) and one directory per
tag with ``mp_rank_00_model_states.pt`` (stages 1 and 2; stage 3: one
``zero_pp_rank_<r>_mp_rank_00_model_states.pt`` per rank) and one
``[bf16_]zero_pp_rank_<r>_mp_rank_00_optim_states.pt`` per data-parallel rank. Every file
is a ``torch.save`` archive read with the restricted unpickler; beyond tensors and plain
containers it admits only :data:`ADMITTED` (DeepSpeed's own small records), each to a
stand-in that keeps its fields and runs nothing.

The fp32 master weights are consolidated as DeepSpeed's ``zero_to_fp32`` does (stages 1
and 2: each parameter group is one flat vector cut into equal partitions, one per rank;
stage 3: each parameter is cut into ``ceil(numel / ranks)`` pieces, one per rank), and the
optimizer state (``exp_avg``, ``exp_avg_sq``, ``step``) is cut back into per-parameter
tensors the same way. The tree (docs/convert.md, "DeepSpeed ZeRO"):

``model/<name>``, ``optimizer/state/<name>/<key>``, ``optimizer/param_groups`` (each
group's hyperparameters, ``params`` naming its parameters), ``lr_scheduler``,
``global_steps``, ``skipped_steps``, ``global_samples``, ``client_state`` (what the user
passed to ``save_checkpoint``) and ``deepspeed`` (stage, ranks, version, config, loss
scaler, buffer names).
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import dtypes
from ..errors import CheckpointNotFoundError, CorruptCheckpointError
from .dcp import Record
from .fileio import RandomAccessFile
from .interchange import Leaf, Tree, reading
from .torch_pickle import load_archive, normalize
from .unpickler import Sealed, StandIn

LATEST = "latest"
MODEL_FILE = "mp_rank_00_model_states.pt"
STAGE3_MODEL = "zero_pp_rank_{}_mp_rank_00_model_states.pt"
OPTIM_FILE = "{}zero_pp_rank_{}_mp_rank_00_optim_states.pt"
_OPTIM = re.compile(r"^(bf16_)?zero_pp_rank_(\d+)_mp_rank_00_optim_states\.pt$")
#: the keys of a model-states file that are DeepSpeed's own; the others are client state
ENGINE_KEYS = frozenset((
    "module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes",
    "shared_params", "frozen_param_fragments", "lr_scheduler", "data_sampler", "random_ltd",
    "sparse_tensor_module_names", "skipped_steps", "global_steps", "global_samples",
    "dp_world_size", "mp_world_size", "checkpoint_parallel_dimensions", "ds_config",
    "ds_version", "num_experts"))
_ADAM_KEYS = ("exp_avg", "exp_avg_sq")


class DeepSpeedRecord(Record):
    """Stands in for a small DeepSpeed class a checkpoint pickles (its fields kept)."""

    fields: Dict[str, Any]


def _record(name: str) -> type:
    return type(name, (DeepSpeedRecord,), {"kind": name})


def _stage(value: Any = 0) -> int:
    """Stands in for ``ZeroStageEnum(value)``: the stage as an int."""
    if type(value) is not int or not 0 <= value <= 3:
        raise TypeError(f"ZeroStageEnum({value!r}) is not a ZeRO stage")
    return value


class TensorType(Sealed):
    """Stands in for ``torch.Tensor`` and ``torch.nn.Parameter`` as classes named by
    ``_rebuild_from_type_v2`` (the type of a rebuilt tensor)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


def _rebuild_from_type(func: Any, new_type: Any, args: Any, state: Any) -> Any:
    """Stands in for ``torch._tensor._rebuild_from_type_v2``: a tensor rebuilt by an admitted
    function; its Python attributes (stage 3 tags its partitions with ``ds_id``) may only be
    plain scalars, and are dropped."""
    if not isinstance(new_type, TensorType) or not isinstance(func, StandIn) or \
            not isinstance(args, tuple) or not isinstance(state, (dict, type(None))) or \
            not all(type(v) in (str, int, float, bool) for v in (state or {}).values()):
        raise TypeError("_rebuild_from_type_v2 is admitted only for tensors with plain "
                        "attributes")
    return func(*args)


#: what a ZeRO checkpoint may name beyond tensors and plain containers, and why
ADMITTED = {
    # the loss scaler of the optimizer state (fp32 and bf16: LossScaler; fp16: Dynamic)
    "deepspeed.runtime.fp16.loss_scaler.LossScaler": _record("LossScaler"),
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler": _record("DynamicLossScaler"),
    # the stage in the optimizer state: an int enum
    "deepspeed.runtime.zero.config.ZeroStageEnum": StandIn(_stage),
    # (numel, start) of a parameter's slice in a rank's partition (stages 1 and 2)
    "deepspeed.utils.tensor_fragment.fragment_address": _record("fragment_address"),
    # stage 3 saves its flat partitions as tensors of a named type
    "torch._tensor._rebuild_from_type_v2": StandIn(_rebuild_from_type),
    "torch.Tensor": TensorType("torch.Tensor"),
    "torch.nn.parameter.Parameter": TensorType("torch.nn.parameter.Parameter"),
}


def is_zero_directory(path: Path) -> bool:
    """A ZeRO checkpoint root (``latest``) or tag directory (model states)."""
    return (path / LATEST).is_file() or (path / MODEL_FILE).is_file() or \
        (path / STAGE3_MODEL.format(0)).is_file()


def tag_directory(path) -> Path:
    """The tag directory of a root (by its ``latest``) or the tag directory itself."""
    p = Path(path)
    if (p / MODEL_FILE).is_file() or (p / STAGE3_MODEL.format(0)).is_file():
        return p
    latest = p / LATEST
    if not latest.is_file():
        raise CheckpointNotFoundError(
            f"{str(p)!r} has neither {LATEST} nor {MODEL_FILE} (a DeepSpeed checkpoint root "
            "or its global_stepN directory)", path=str(p),
            hint="pass the directory given to engine.save_checkpoint, or one of its "
                 "global_stepN directories")
    raf = RandomAccessFile(latest, follow=False)
    try:
        tag = raf.pread(min(raf.size, 256), 0).decode("utf-8", "replace").strip()
    finally:
        raf.close()
    if not tag or "/" in tag or "\\" in tag or tag in (".", "..") or tag.startswith("."):
        raise CorruptCheckpointError(f"{str(latest)!r} names the tag {tag!r}, which is not a "
                                     "directory of the checkpoint", path=str(latest))
    d = p / tag
    if not d.is_dir():
        raise CheckpointNotFoundError(f"{str(latest)!r} names {tag!r}, but {str(d)!r} does "
                                      "not exist", path=str(d),
                                      hint="pass an existing global_stepN directory instead")
    return d


def _load(path: Path, tree: Tree) -> Any:
    if not path.is_file():
        raise CheckpointNotFoundError(f"{str(path)!r} is missing from the DeepSpeed checkpoint",
                                      path=str(path), hint="copy every rank's files of the "
                                      "tag, or pass another global_stepN directory")
    raf = RandomAccessFile(path, follow=False)
    tree.closers.append(raf.close)
    raw, _, archive = load_archive(raf, extra=ADMITTED)
    tree.closers.append(archive.close)
    if not isinstance(raw, dict):
        raise CorruptCheckpointError(f"{str(path)!r} holds no dict", path=str(path))
    return raw


def _need(d: Any, key: str, where: str) -> Any:
    if not isinstance(d, dict) or key not in d:
        raise CorruptCheckpointError(f"{where}: {key!r} is missing; not a DeepSpeed ZeRO "
                                     "checkpoint file", path=where)
    return d[key]


class Flat:
    """One rank-concatenated vector: per rank, the 1-D tensors that follow each other."""

    def __init__(self, pieces: List[List[Leaf]], where: str) -> None:
        for rank in pieces:
            for leaf in rank:
                if not isinstance(leaf, Leaf) or len(leaf.shape) != 1:
                    raise CorruptCheckpointError(f"{where}: a flat partition is not a 1-D "
                                                 "tensor", path=where)
        self.pieces, self.where = pieces, where
        self.dtype = pieces[0][0].dtype if pieces and pieces[0] else "float32"

    def rank_size(self, rank: int) -> int:
        return sum(leaf.shape[0] for leaf in self.pieces[rank])

    def leaf(self, spans: Sequence[Tuple[int, int, int]], shape: Tuple[int, ...]) -> Leaf:
        """A leaf of ``shape`` made of ``(rank, start, count)`` spans, in order."""
        count = sum(n for _, _, n in spans)
        if count != math.prod(shape):
            raise CorruptCheckpointError(f"{self.where}: the partitions do not cover a "
                                         f"tensor of shape {shape}", path=self.where)
        for rank, start, n in spans:
            if start + n > self.rank_size(rank):
                raise CorruptCheckpointError(f"{self.where}: a parameter lies beyond rank "
                                             f"{rank}'s partition", path=self.where)

        def read() -> np.ndarray:
            out = np.empty(count, dtype=dtypes.to_numpy(self.dtype))
            at = 0
            for rank, start, n in spans:
                at = self._copy(rank, start, n, out, at)
            return out.reshape(shape)

        return Leaf(self.dtype, shape, read)

    def _copy(self, rank: int, start: int, n: int, out: np.ndarray, at: int) -> int:
        base = 0
        for leaf in self.pieces[rank]:
            size = leaf.shape[0]
            lo, hi = max(start, base), min(start + n, base + size)
            if lo < hi:  # only the parameter's elements, where the file can (contiguous)
                out[at:at + hi - lo] = leaf.span(lo - base, hi - lo) if leaf.span else \
                    leaf.read()[lo - base:hi - base]
                at += hi - lo
            base += size
        return at


def _zero12_spans(flat: Flat, numels: List[int], paddings: List[int]
                  ) -> List[List[Tuple[int, int, int]]]:
    """Spans of each parameter in a group's partitions (stages 1, 2): the ranks' partitions
    concatenated form the group's flat vector; rank r's partition starts at r * size."""
    size = flat.rank_size(0)
    out, offset = [], 0
    for numel, pad in zip(numels, paddings):
        spans, at, left = [], offset, numel
        while left:
            rank, start = divmod(at, size) if size else (0, at)
            n = min(left, size - start)
            spans.append((rank, start, n))
            at, left = at + n, left - n
        out.append(spans)
        offset += numel + pad
    return out


def _zero3_spans(numels: List[int], world: int) -> List[List[Tuple[int, int, int]]]:
    """Spans of each parameter (stage 3): ``ceil(numel / world)`` from each rank, in turn."""
    out, offset = [], 0
    for numel in numels:
        part = math.ceil(numel / world)
        spans, left = [], numel
        for rank in range(world):
            n = min(part, left)
            if n:
                spans.append((rank, offset, n))
            left -= n
        out.append(spans)
        offset += part
    return out


def read(path, fmt: str = "deepspeed") -> Tree:
    directory = tag_directory(path)
    with reading(fmt) as tree:
        optim_names = _optim_files(directory)
        optims = [_need(_load(directory / n, tree), "optimizer_state_dict", str(directory / n))
                  for n in optim_names]
        first = str(directory / optim_names[0])
        stage = _need(optims[0], "zero_stage", first)
        world = _need(optims[0], "partition_count", first)
        world = max(world) if isinstance(world, list) and world else world
        if type(world) is int and world > len(optims):
            _optim_files(directory, world)  # names the missing ranks
        if type(stage) is not int or type(world) is not int or world != len(optims):
            raise CorruptCheckpointError(f"{first}: stage {stage!r} of {world!r} ranks, but "
                                         f"{len(optims)} optimizer files", path=first)
        model_name = STAGE3_MODEL.format(0) if stage == 3 else MODEL_FILE
        models = [_load(directory / (STAGE3_MODEL.format(r) if stage == 3 else MODEL_FILE), tree)
                  for r in range(world if stage == 3 else 1)]
        where = str(directory / model_name)
        groups = _need(models[0], "param_shapes", where)
        if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
            raise CorruptCheckpointError(f"{where}: param_shapes is malformed", path=where)
        names = [[str(k) for k in g] for g in groups]
        numels = [[math.prod(_shape(s, where)) for s in g.values()] for g in groups]
        shapes = [[_shape(s, where) for s in g.values()] for g in groups]
        if stage == 3:
            spans = _zero3_spans([n for g in numels for n in g], world)
            flats: Dict[str, Any] = {"fp32": _stage3_flat(optims, "fp32_flat_groups", None,
                                                          first)}
            for key in _ADAM_KEYS:
                flats[key] = _stage3_flat(optims, None, key, first)
            per_group = _split(spans, numels)
        else:
            paddings = optims[0].get("param_alignment_paddings") or [[0] * len(n) for n in numels]
            fp32 = [Flat([[o["single_partition_of_fp32_groups"][g]] for o in optims], first)
                    for g in range(len(groups))]
            per_group = [_zero12_spans(fp32[g], numels[g], paddings[g])
                         for g in range(len(groups))]
            flats = {"fp32": fp32}  # per group
            for key in _ADAM_KEYS:
                flats[key] = _stage12_state(optims, key, len(groups), first)
        model: Dict[str, Any] = {}
        module = _need(models[0], "module", where)
        for name in _need(models[0], "buffer_names", where) or []:
            model[name] = _as_float32(module[name])
        state: Dict[str, Any] = {}
        steps = _steps(optims, stage, len(groups), first)
        for g, group_names in enumerate(names):
            for i, name in enumerate(group_names):
                spans_i = per_group[g][i]
                model[name] = _flat_of(flats["fp32"], g, stage).leaf(spans_i, shapes[g][i])
                entry: Dict[str, Any] = {}
                if steps[g] is not None:
                    entry["step"] = steps[g]
                for key in _ADAM_KEYS:
                    if flats[key] is not None:
                        entry[key] = _flat_of(flats[key], g, stage).leaf(spans_i, shapes[g][i])
                state[name] = entry
        _frozen(models, stage, world, model, where)
        for alias, name in (models[0].get("shared_params") or {}).items():
            if name in model:
                model[alias] = model[name]
        tree.root = _root(models[0], optims, stage, world, model, state, names, where, tree)
    return tree


def _optim_files(directory: Path, world: Optional[int] = None) -> List[str]:
    """The ranks' optimizer files, in rank order; every rank below ``world`` (or below the
    highest found) must have one."""
    found: Dict[int, str] = {}
    for entry in directory.iterdir():
        m = _OPTIM.match(entry.name)
        if m:
            found[int(m.group(2))] = entry.name
    if not found:
        raise CheckpointNotFoundError(
            f"{str(directory)!r} has no *zero_pp_rank_*_mp_rank_00_optim_states.pt files",
            path=str(directory), hint="copy the ranks' optimizer files next to the model "
                                      "states, or convert a checkpoint saved with ZeRO")
    count = max(world or 0, max(found) + 1)
    missing = [r for r in range(count) if r not in found]
    if missing:
        prefix = found[max(found)].split("zero_pp")[0]
        raise CheckpointNotFoundError(
            f"{str(directory)!r}: the optimizer states of rank(s) {missing} are missing "
            f"({OPTIM_FILE.format(prefix, missing[0])})", path=str(directory),
            hint="copy every rank's optim_states.pt of this tag")
    return [found[r] for r in sorted(found)]


def _shape(s: Any, where: str) -> Tuple[int, ...]:
    if not isinstance(s, (tuple, list)) or not all(type(d) is int and d >= 0 for d in s):
        raise CorruptCheckpointError(f"{where}: a parameter shape is malformed", path=where)
    return tuple(s)


def _split(spans: List[Any], numels: List[List[int]]) -> List[List[Any]]:
    out, at = [], 0
    for g in numels:
        out.append(spans[at:at + len(g)])
        at += len(g)
    return out


def _flat_of(flat: Any, g: int, stage: int) -> Flat:
    return flat if stage == 3 else flat[g]


def _stage3_flat(optims: List[Any], fp32_key: Optional[str], state_key: Optional[str],
                 where: str) -> Optional[Flat]:
    ranks = []
    for o in optims:
        if fp32_key is not None:
            ranks.append(list(_need(o, fp32_key, where)))
            continue
        inner = _need(_need(o, "optimizer_state_dict", where), "state", where)
        if not all(state_key in inner[k] for k in inner):
            return None
        ranks.append([inner[k][state_key] for k in sorted(inner)])
    return Flat(ranks, where)


def _stage12_state(optims: List[Any], key: str, groups: int, where: str) -> Optional[List[Flat]]:
    out = []
    for g in range(groups):
        ranks = []
        for o in optims:
            base = _need(o, "base_optimizer_state", where)
            group = base["state"][g] if isinstance(base, dict) else base[g]
            if key not in group:
                return None
            ranks.append([group[key]])
        out.append(Flat(ranks, where))
    return out


def _steps(optims: List[Any], stage: int, groups: int, where: str) -> List[Any]:
    o = optims[0]
    if stage == 3:  # one sub-group per group (see _stage3_flat)
        inner = _need(_need(o, "optimizer_state_dict", where), "state", where)
        return [(inner.get(g) or {}).get("step") for g in range(groups)]
    base = _need(o, "base_optimizer_state", where)
    if isinstance(base, dict):
        return [base["state"].get(g, {}).get("step") for g in range(groups)]
    step = o.get("base_optimizer_state_step")
    return [step] * groups


def _as_float32(leaf: Any) -> Any:
    """A buffer as ``zero_to_fp32`` gives it: floating ones as float32."""
    if not isinstance(leaf, Leaf) or leaf.dtype == "float32" or \
            not leaf.dtype.startswith(("float", "bfloat")):
        return leaf
    return Leaf("float32", leaf.shape, lambda: leaf.read().astype(np.float32))


def _frozen(models: List[Any], stage: int, world: int, model: Dict[str, Any],
            where: str) -> None:
    shapes = models[0].get("frozen_param_shapes") or {}
    for name, shape in shapes.items():
        shape = _shape(shape, where)
        if stage != 3:
            model[name] = models[0]["frozen_param_fragments"][name]
            continue
        frags = [m["frozen_param_fragments"][name] for m in models]
        flat = Flat([[f] for f in frags], where)
        part = frags[0].shape[0]
        numel, spans = math.prod(shape), []
        for rank in range(world):
            n = min(part, numel - rank * part)
            if n > 0:
                spans.append((rank, 0, n))
        model[name] = flat.leaf(spans, shape)


def _root(model_states: Dict[str, Any], optims: List[Any], stage: int, world: int,
          model: Dict[str, Any], state: Dict[str, Any], names: List[List[str]], where: str,
          tree: Tree) -> Dict[str, Any]:
    o = optims[0]
    inner = o.get("optimizer_state_dict") if stage == 3 else o.get("base_optimizer_state")
    groups = inner.get("param_groups") if isinstance(inner, dict) else None
    param_groups = []
    for g, group_names in enumerate(names):
        hyper = dict(groups[g]) if groups and g < len(groups) else {}
        hyper["params"] = list(group_names)
        param_groups.append(hyper)
    scaler = o.get("loss_scaler")
    meta: Dict[str, Any] = {
        "zero_stage": stage, "world_size": world, "ds_version": model_states.get("ds_version"),
        "ds_config": model_states.get("ds_config"),
        "buffer_names": list(model_states.get("buffer_names") or []),
        "bf16": any(n.startswith("bf16_") for n in _optim_files(Path(where).parent))}
    if isinstance(scaler, DeepSpeedRecord):
        meta["loss_scaler"] = {"class": scaler.kind, **scaler.fields}
    plain = {
        "lr_scheduler": model_states.get("lr_scheduler"),
        "global_steps": model_states.get("global_steps"),
        "skipped_steps": model_states.get("skipped_steps"),
        "global_samples": model_states.get("global_samples"),
        "client_state": {k: v for k, v in model_states.items() if k not in ENGINE_KEYS},
        "deepspeed": meta,
    }
    groups_plain = normalize(param_groups, ["optimizer", "param_groups"], tree.extras)
    return {"model": model, "optimizer": {"state": state, "param_groups": groups_plain},
            **{k: normalize(v, [k], tree.extras) for k, v in plain.items()}}
