"""A Horovod data-parallel training run that checkpoints with every rank and resumes.

usage: horovod_train.py {full,resume} ROOT
Run under mpiexec by tests/test_horovod_train.py. ``full`` trains steps 0..11,
saving after step 5 (asynchronously, every rank writing its part); ``resume``
restores that checkpoint on every rank (no broadcast from rank 0) and trains
steps 6..11. Each rank prints ``RESULT <json>`` with its losses as float32 bits.
"""
import json
import sys

import numpy as np
import torch
import horovod.torch as hvd

import uckpt

SAVE_AT, STEPS = 5, 12


def report(**kw):
    print("\nRESULT " + json.dumps(kw), flush=True)


def main():
    mode, root = sys.argv[1], sys.argv[2]
    hvd.init()
    rank = hvd.rank()
    torch.manual_seed(0)  # the same initial model on every rank ...
    model = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                                torch.nn.Linear(32, 1))
    torch.manual_seed(100 + rank)  # ... but each rank's own dropout masks
    data = torch.Generator().manual_seed(1000 + rank)  # and its own batches
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    state = {"model": model, "optimizer": opt, "step": 0,
             "rank": uckpt.PerRank({"rng": uckpt.RandomState(), "data": data})}
    losses = {}
    with uckpt.CheckpointManager(root, comm=hvd, async_save=True) as manager:
        start = 0
        if mode == "resume":
            assert manager.restore(state) == SAVE_AT
            start = state["step"] + 1
        for step in range(start, STEPS):
            x = torch.randn(16, 10, generator=data)
            loss = (model(x) - x.sum(1, keepdim=True)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()  # gradients averaged over the ranks by Horovod
            losses[step] = int(np.float32(loss.item()).view(np.uint32))
            if mode == "full" and step == SAVE_AT:
                state["step"] = step
                manager.save(step, state)
    params = hvd.allgather_object(float(sum(p.double().sum() for p in model.parameters())))
    report(rank=rank, size=hvd.size(), losses=losses, params_equal=len(set(params)) == 1)


if __name__ == "__main__":
    main()
