"""DTensor and FSDP2 state saved and loaded by torch.distributed (gloo) ranks on the CPU.

usage: dtensor_worker.py save DIR REF BAD
       dtensor_worker.py load DIR PLAIN REF {fresh,running}
Run by tests/test_torch_dtensor.py through tests/multiproc.run_torch; each rank
prints ``RESULT <json>`` lines.

``save`` (4 ranks) trains an FSDP2 (``fully_shard``) model with Adam for two
steps, so that its parameters and Adam's moments are DTensors sharded by rows,
unevenly (10 rows: 3, 3, 3, 1; 3 rows: 1, 1, 1, 0), and saves it with DTensors
of other layouts (a 2-D mesh, Replicate, bfloat16 with empty boxes, a mesh that
leaves rank 3 out). Rank 0 writes every value, gathered with torch's own
``full_tensor()``, to the NumPy file REF: the loaders compare bits with it. A
module holding a ``Partial`` DTensor, then a ``_StridedShard`` DTensor, are
saved to BAD, which must fail.

``load`` (any number of ranks) builds the same kinds of objects sharded over
this job's ranks, with other values and other layouts, loads DIR into them and
compares every ``full_tensor()`` with REF; then, after a training step changed
them, loads PLAIN (the same state saved by one process with plain tensors) and
compares again. With ``running`` the optimizer has stepped before the first load
(its DTensor moments exist and are read into in place), with ``fresh`` it has
no state yet.
"""
import json
import os
import sys
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

IN, HIDDEN, OUT = 6, 10, 3  # weights of 10 rows and of 3 rows: uneven on 4 ranks
#: the extra DTensors: global shape and dtype
EXTRA = {"grid": ((6, 8), torch.float32), "mixed": ((5, 4), torch.float32),
         "rep": ((4,), torch.float64), "bf16": ((7, 2), torch.bfloat16),
         "sub": ((5,), torch.float32)}


def report(**kw):
    print("\nRESULT " + json.dumps(kw), flush=True)


def model_and_optimizer(seed, mesh=None):
    """The network (FSDP2-sharded over ``mesh`` when given) and its Adam optimizer."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(),
                                torch.nn.Linear(HIDDEN, OUT))
    if mesh is not None:
        from torch.distributed.fsdp import fully_shard

        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def train(model, opt, steps, seed):
    g = torch.Generator().manual_seed(seed)  # the same batches on every rank
    for _ in range(steps):
        model(torch.randn(8, IN, generator=g)).square().mean().backward()
        opt.step()
        opt.zero_grad()


def extra_value(name):
    shape, dtype = EXTRA[name]
    rng = np.random.default_rng(sorted(EXTRA).index(name))
    return torch.from_numpy(rng.standard_normal(shape)).to(dtype)


def extras(layouts):
    """DTensors of the values of EXTRA, laid out by ``layouts[name] = (mesh, placements)``."""
    from torch.distributed.tensor import distribute_tensor

    return {name: distribute_tensor(extra_value(name), mesh, placements)
            for name, (mesh, placements) in layouts.items()}


def as_bits(t):
    """A DTensor's (or tensor's) full value as a NumPy array, bfloat16 as its bits."""
    from torch.distributed.tensor import DTensor

    full = t.full_tensor() if isinstance(t, DTensor) else t
    full = full.detach()
    return (full.view(torch.int16) if full.dtype == torch.bfloat16 else full).numpy().copy()


def everything(model, opt, extra):
    """Every value by the name the test uses (collective: full_tensor all-gathers)."""
    out = {f"model/{k}": as_bits(v) for k, v in model.state_dict().items()}
    for index, entries in opt.state_dict()["state"].items():
        for name, v in entries.items():
            out[f"optimizer/state/{index}/{name}"] = as_bits(v)
    out.update({f"extra/{k}": as_bits(v) for k, v in extra.items()})
    return out


def local_pointers(model, opt, extra):
    """Where each DTensor's local memory is (to check a load reads in place)."""
    from torch.distributed.tensor import DTensor

    tensors = dict(model.state_dict())
    for index, p in enumerate(model.parameters()):
        tensors.update({f"{index}/{k}": v for k, v in opt.state.get(p, {}).items()})
    tensors.update(extra)
    return {k: v.to_local().data_ptr() for k, v in tensors.items()
            if isinstance(v, DTensor) and v.to_local().numel()}


def save(directory, ref, bad):
    import uckpt
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (4,))
    grid = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    sub = DeviceMesh("cpu", [0, 1, 2])  # rank 3 holds nothing of what lives on it
    model, opt = model_and_optimizer(0, mesh)
    train(model, opt, 2, seed=1)
    extra = extras({"grid": (grid, [Shard(0), Shard(1)]), "mixed": (grid, [Replicate(), Shard(0)]),
                    "rep": (mesh, [Replicate()]), "bf16": (mesh, [Shard(1)]),
                    "sub": (sub, [Shard(0)])})
    boxes = {k: [list(v.to_local().shape)] for k, v in model.state_dict().items()}
    uckpt.save(directory, {"model": model, "optimizer": opt, "extra": extra, "step": 2}, comm=None)
    values = everything(model, opt, extra)
    if rank == 0:
        np.savez(ref, **values)
    # a pending reduction has no value: refused on every rank, naming the parameter
    bad_model = torch.nn.Linear(4, 2)
    bad_model.weight = torch.nn.Parameter(DTensor.from_local(torch.ones(2, 4), mesh, [Partial()]))
    try:
        uckpt.save(bad, {"bad": bad_model})
        refused = None
    except uckpt.errors.DistributedError as e:
        refused = {"msg": str(e), "unsupported": e.failed_with(uckpt.errors.UnsupportedObjectError)}
    # strided sharding (FSDP2 over tensor parallelism) gives a rank rows that are no box
    from torch.distributed.tensor.placement_types import _StridedShard

    strided = DTensor.from_local(torch.ones(2, 3), mesh, [_StridedShard(0, split_factor=2)],
                                 shape=(8, 3), stride=(3, 1))
    try:
        uckpt.save(bad, {"strided": strided})
        refused_strided = None
    except uckpt.errors.DistributedError as e:
        refused_strided = str(e)
    dist.barrier()
    report(rank=rank, boxes=boxes, refused=refused, refused_strided=refused_strided,
           bad_exists=os.path.exists(bad))


def load(directory, plain, ref, mode):
    import uckpt
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    rank, size = dist.get_rank(), dist.get_world_size()
    want = dict(np.load(ref))
    mesh = init_device_mesh("cpu", (size,))
    model, opt = model_and_optimizer(123, mesh)
    if mode == "running":
        train(model, opt, 1, seed=77)
    layouts = {"grid": (mesh, [Shard(1)]), "mixed": (mesh, [Shard(1)]),
               "rep": (mesh, [Shard(0)]), "bf16": (mesh, [Replicate()]),
               "sub": (DeviceMesh("cpu", list(range(size - 1))), [Shard(0)])}
    extra = {k: DTensor.from_local(_zeros_like(v.to_local(), transposed=k == "grid"),
                                   v.device_mesh, v.placements, shape=v.shape, stride=v.stride())
             for k, v in extras(layouts).items()}
    state = {"model": model, "optimizer": opt, "extra": extra, "step": None}
    before = local_pointers(model, opt, extra)
    copies = count_copies()
    uckpt.load(directory, state, comm=None)
    after = local_pointers(model, opt, extra)
    got = everything(model, opt, extra)
    out = {"rank": rank, "step": state["step"], "keys": sorted(got) == sorted(want),
           "equal": sorted(k for k in want if k in got and _same(got[k], want[k])),
           "kept_memory": sorted(k for k in before if after.get(k) == before[k]),
           "copies": len(copies),
           "moments_are_dtensors": all(isinstance(v, DTensor) for s in opt.state.values()
                                       for n, v in s.items() if n != "step")}
    train(model, opt, 1, seed=5)  # the loaded state trains; then the plain checkpoint loads
    uckpt.load(plain, state, comm=None)
    got = everything(model, opt, extra)
    out["plain_equal"] = sorted(k for k in want if k in got and _same(got[k], want[k]))
    # loading into a pending reduction is refused before anything is read
    partial = DTensor.from_local(torch.zeros(4, dtype=torch.float64), mesh, [Partial()])
    try:
        uckpt.load(directory, {"extra": {"rep": partial}}, strict=False)
        out["partial_load"] = None
    except uckpt.errors.DistributedError as e:
        out["partial_load"] = str(e)
    # the checkpoint's global shape is compared with the DTensor's, not its local shape
    wrong = distribute_tensor(torch.zeros(5, dtype=torch.float64), mesh, [Shard(0)])
    try:
        uckpt.load(directory, {"extra": {"rep": wrong}}, strict=False)
        out["shape_load"] = None
    except uckpt.errors.DistributedError as e:
        out["shape_load"] = str(e)
    report(**out)


def _zeros_like(t, transposed):
    """Zeros of ``t``'s shape; not contiguous (a transposed view) when ``transposed``."""
    if not transposed:
        return torch.zeros_like(t)
    return torch.zeros(tuple(reversed(t.shape)), dtype=t.dtype).t()


def count_copies():
    """Record every array the adapter copies into a DTensor (rather than the core reading
    straight into its memory); empty ones are not counted."""
    import uckpt_torch.dtensor as adapter

    copies, real = [], adapter.from_numpy

    def from_numpy(arr, like=None):
        if arr.size:
            copies.append(arr.shape)
        return real(arr, like=like)

    adapter.from_numpy = from_numpy
    return copies


def _same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def main():
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=60))
    scenario, *args = sys.argv[1:]
    {"save": save, "load": load}[scenario](*args)
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    # Not destroy_process_group() and a normal exit: torch 2.13's gloo worker threads may
    # still hold the last reference to a finished collective's tensors, and dropping it
    # while the interpreter finalizes aborts the process ("terminate called without an
    # active exception"), in about one run of ten. Every result is printed by now.
    os._exit(0)


if __name__ == "__main__":
    main()
