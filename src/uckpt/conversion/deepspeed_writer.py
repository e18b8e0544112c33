"""Writing a DeepSpeed ZeRO checkpoint (stages 1, 2 and 3) for any number of ranks, without
torch or DeepSpeed.

The source is the tree :mod:`.deepspeed_zero` reads (``model``, ``optimizer/state``,
``optimizer/param_groups`` naming their parameters, ``lr_scheduler``, ``global_steps``,
``deepspeed/zero_stage``, ...). The target is a checkpoint root: ``latest`` and
``global_step<N>/`` with the files ``engine.load_checkpoint`` reads on ``ranks`` ranks
(``WriteOptions.ranks``; default: the source's), each partitioned as DeepSpeed partitions
for that many ranks (stages 1 and 2: a group's flat vector padded to a multiple of
``2 * ranks`` and cut into equal parts; stage 3: each parameter cut into
``ceil(numel / ranks)`` pieces). The files are written with :mod:`.torch_writer`'s pickle
emitter; beyond tensors and plain containers they name ``torch.Size`` (parameter shapes,
as DeepSpeed writes them) and DeepSpeed's ``LossScaler`` (stage 3 loads it as an object).

Limits: one ZeRO-3 sub-group per parameter group (``sub_group_size`` at least the group's
size, DeepSpeed's default), no frozen parameters, no pipeline or tensor parallelism.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from ..errors import UckptError
from . import skeleton
from .deepspeed_zero import LATEST, MODEL_FILE, OPTIM_FILE, STAGE3_MODEL
from .interchange import Leaf, Tree
from .progress import Progress
from .torch_writer import Emitter, _global, write_archive

_SCALERS = ("LossScaler", "DynamicLossScaler")


class DeepSpeedLayoutError(UckptError, ValueError):
    """A uckpt tree that cannot be written as a DeepSpeed ZeRO checkpoint (a key missing,
    a stage or rank count DeepSpeed cannot load)."""


class Size(tuple):
    """A parameter shape, written as ``torch.Size`` (what ``zero_to_fp32`` expects)."""


class Scaler(dict):
    """A loss scaler's fields, written as a DeepSpeed ``LossScaler`` object."""

    def __init__(self, cls: str, fields: Dict[str, Any]) -> None:
        super().__init__(fields)
        self.cls = cls


class _Emitter(Emitter):
    def value(self, obj: Any, parts: Optional[List[str]]) -> None:
        if isinstance(obj, Size):
            self.out.write(_global("torch", "Size"))
            self.ints(tuple(obj))
            self.out.write(b"\x85R")  # TUPLE1, REDUCE
        elif isinstance(obj, Scaler):
            self.out.write(_global("deepspeed.runtime.fp16.loss_scaler", obj.cls) + b")\x81")
            self.dict(dict(obj), None)
            self.out.write(b"b")  # EMPTY_TUPLE, NEWOBJ; the fields; BUILD
        else:
            super().value(obj, parts)


def _save(path: Path, root: Any, progress: Progress) -> None:
    emitter = _Emitter({})
    write_archive(path, emitter.dump(root), emitter.storages, progress)


def _array(arr: np.ndarray) -> Leaf:
    return Leaf.of(arr)


def _need(root: Any, *keys: str) -> Any:
    node = root
    for i, key in enumerate(keys):
        if not isinstance(node, dict) or key not in node:
            raise DeepSpeedLayoutError(
                f"the checkpoint has no {'/'.join(keys[:i + 1])!r}, which a DeepSpeed ZeRO "
                "checkpoint needs", hint="convert a checkpoint read from DeepSpeed (uckpt "
                "convert global_stepN ckpt), which has model, optimizer and deepspeed keys")
        node = node[key]
    return node


def plan(tree: Tree) -> skeleton.Layout:
    _need(tree.root, "deepspeed", "zero_stage")
    _need(tree.root, "optimizer", "param_groups")
    return skeleton.layout(tree.root)


def write(tree: Tree, lay: skeleton.Layout, path, progress: Progress, options=None) -> None:
    root = tree.root
    meta = _need(root, "deepspeed")
    stage = _need(meta, "zero_stage")
    world = getattr(options, "ranks", None) or _need(meta, "world_size")
    if stage not in (1, 2, 3) or type(world) is not int or world < 1:
        raise DeepSpeedLayoutError(f"cannot write ZeRO stage {stage!r} for {world!r} ranks",
                                   hint="stages 1, 2 and 3 are written, for 1 or more ranks")
    model = _need(root, "model")
    state = _need(root, "optimizer", "state")
    groups = _need(root, "optimizer", "param_groups")
    names = [list(_need(g, "params")) for g in groups]
    arrays = {n: model[n].read() for g in names for n in g}
    tag = f"global_step{root.get('global_steps') or 0}"
    step_dir = Path(path) / tag
    step_dir.mkdir()
    prefix = "bf16_" if meta.get("bf16") else ""
    scaler = dict(meta.get("loss_scaler") or {"class": "LossScaler", "cur_scale": 1.0,
                                              "dynamic": False})
    cls = scaler.pop("class", "LossScaler")
    if cls not in _SCALERS:
        raise DeepSpeedLayoutError(f"unknown loss scaler class {cls!r}",
                                   hint=f"one of {', '.join(_SCALERS)}")
    common = {"loss_scaler": Scaler(cls, scaler), "dynamic_loss_scale": cls != "LossScaler",
              "overflow": False, "ds_version": meta.get("ds_version")}
    for rank in range(world):
        if stage == 3:
            optim = _stage3_optim(arrays, state, groups, names, world, rank, common)
        else:
            optim = _stage12_optim(arrays, state, groups, names, world, rank, stage, common)
        _save(step_dir / OPTIM_FILE.format(prefix, rank),
              {"optimizer_state_dict": optim, "ds_config": meta.get("ds_config"),
               "ds_version": meta.get("ds_version")}, progress)
    for rank in range(world if stage == 3 else 1):
        _save(step_dir / (STAGE3_MODEL.format(rank) if stage == 3 else MODEL_FILE),
              _model_states(root, meta, arrays, names, world, stage), progress)
    (Path(path) / LATEST).write_text(tag)


def _hyper(group: Dict[str, Any], index: int) -> Dict[str, Any]:
    out = {k: v for k, v in group.items() if k != "params"}
    if isinstance(out.get("betas"), list):
        out["betas"] = tuple(out["betas"])
    out["params"] = [index]
    return out


def _flat(values: List[np.ndarray], total: int) -> np.ndarray:
    out = np.zeros(total, dtype=values[0].dtype if values else np.float32)
    at = 0
    for v in values:
        out[at:at + v.size] = v.ravel()
        at += v.size
    return out


def _state_of(state: Dict[str, Any], name: str, key: str) -> Optional[np.ndarray]:
    entry = state.get(name) or {}
    leaf = entry.get(key)
    return None if leaf is None else (leaf.read() if isinstance(leaf, Leaf) else leaf)


def _step(state: Dict[str, Any], names: List[str]) -> Any:
    leaf = (state.get(names[0]) or {}).get("step") if names else None
    return _array(leaf.read()) if isinstance(leaf, Leaf) else leaf


def _adam(state: Dict[str, Any], group: List[str],
          cut: Callable[[List[np.ndarray]], np.ndarray]) -> Dict[str, Any]:
    """The base optimizer's state of one flat group: the first parameter's ``step`` and,
    where every parameter has them, ``exp_avg`` and ``exp_avg_sq`` as ``cut`` lays them
    out for this rank."""
    entry: Dict[str, Any] = {}
    step = _step(state, group)
    if step is not None:
        entry["step"] = step
    for key in ("exp_avg", "exp_avg_sq"):
        values = [v for n in group if (v := _state_of(state, n, key)) is not None]
        if len(values) == len(group):
            entry[key] = _array(cut(values))
    return entry


def _window(padded: int, lo: int, hi: int) -> Callable[[List[np.ndarray]], np.ndarray]:
    """Stages 1, 2: a rank's part ``[lo, hi)`` of the group's flat vector padded to ``padded``."""
    return lambda values: _flat(values, padded)[lo:hi]


def _stage12_optim(arrays, state, groups, names, world, rank, stage, common) -> Dict[str, Any]:
    fp32, base_state, paddings, counts = [], {}, [], []
    for g, group in enumerate(names):
        numel = sum(arrays[n].size for n in group)
        padded = math.ceil(numel / (2 * world)) * (2 * world)
        part = padded // world
        lo, hi = rank * part, (rank + 1) * part
        pad = max(0, hi - max(lo, numel)) if rank == world - 1 else 0
        fp32.append(_array(_flat([arrays[n] for n in group], padded)[lo:hi - pad]))
        base_state[g] = _adam(state, group, _window(padded, lo, hi))
        paddings.append(pad)
        counts.append(world)
    return {**common,
            "base_optimizer_state": {"state": base_state, "param_groups": [
                _hyper(group, g) for g, group in enumerate(groups)]},
            "single_partition_of_fp32_groups": fp32, "zero_stage": stage,
            "group_paddings": paddings,
            "param_alignment_paddings": [[0] * len(group) for group in names],
            "partition_count": counts}


def _pieces(values: List[np.ndarray], world: int, rank: int) -> np.ndarray:
    parts = []
    for v in values:
        pn = math.ceil(v.size / world)
        padded = np.zeros(pn * world, dtype=v.dtype)
        padded[:v.size] = v.ravel()
        parts.append(padded[rank * pn:(rank + 1) * pn])
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)


def _stage3_optim(arrays, state, groups, names, world, rank, common) -> Dict[str, Any]:
    flats, inner = [], {}
    for g, group in enumerate(names):
        flats.append(_array(_pieces([arrays[n] for n in group], world, rank)))
        inner[g] = _adam(state, group, lambda v: _pieces(v, world, rank))
    return {"zero_stage": 3, **common, "partition_count": world,
            "optimizer_state_dict": {"state": inner, "param_groups": [
                _hyper(group, g) for g, group in enumerate(groups)]},
            "fp32_flat_groups": flats}


def _model_states(root, meta, arrays, names, world, stage) -> Dict[str, Any]:
    model = root["model"]
    buffers = list(meta.get("buffer_names") or [])
    params = {n for g in names for n in g}
    module: Dict[str, Any] = {}
    for name, leaf in model.items():
        if name in params and stage == 3:
            module[name] = _array(np.zeros(0, dtype=arrays[name].dtype))
        elif name in params:
            module[name] = _array(arrays[name])
        else:
            module[name] = leaf
    out: Dict[str, Any] = {
        "module": module, "buffer_names": buffers, "optimizer": None,
        "param_shapes": [{n: Size(arrays[n].shape) for n in g} for g in names],
        "frozen_param_shapes": {}, "shared_params": {}, "frozen_param_fragments": {},
        "lr_scheduler": root.get("lr_scheduler"), "data_sampler": None, "random_ltd": None,
        "skipped_steps": root.get("skipped_steps") or 0,
        "global_steps": root.get("global_steps") or 0,
        "global_samples": root.get("global_samples") or 0,
        "dp_world_size": world, "mp_world_size": 1, "ds_config": meta.get("ds_config"),
        "ds_version": meta.get("ds_version")}
    for key, value in (root.get("client_state") or {}).items():
        out.setdefault(key, value)
    return out
