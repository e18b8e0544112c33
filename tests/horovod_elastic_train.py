"""A Horovod elastic (gloo) training job whose state is kept by uckpt.horovod.ElasticState,
run by tests/test_horovod_elastic.py under ``horovodrun -np 4 --min-np 3`` with a host
discovery script that prints HOSTS_FILE.

usage: horovod_elastic_train.py SHM_NAME DURABLE HOSTS_FILE HOSTS OUT

HOSTS: the four host names of HOSTS_FILE (names of this machine, one slot each), comma
separated. Each worker is a simulated node: ``UCKPT_NODE=node<i>``, i the index of its
Horovod host (``HOROVOD_HOSTNAME``) in HOSTS. Tiers: ``shm://SHM_NAME-{node}`` (keep=1,
``redundancy="partner"``) and the directory DURABLE. The state: a small model and its
``hvd.DistributedOptimizer`` (SGD with momentum: replicated, spread over the ranks'
files) and a ``uckpt.PerRank`` array ``1000 * rank + step``.

Steps 0..STEPS-1 on 4 ranks; after step SAVE_AT every rank commits (a synchronous save,
then ``manager.wait()``: the copy to DURABLE done too) and the ranks meet once more. At
step KILL_AT the worker of node LOST moves DURABLE away (``DURABLE.away``: the durable
tier out of reach), drops its host from HOSTS_FILE, removes its node's memory area and
SIGKILLs itself. The other three fail in that step's allreduce
(``HorovodInternalError``); Horovod resets them as 3 ranks, and ElasticState restores step
SAVE_AT from the memory level, resharded onto 3 ranks, node LOST's share rebuilt from its
partner copy. Each survivor writes ``OUT/restored-<node>.npz`` (the restored model and
momentum), ``OUT/restored-<node>.json`` (rank, size, step, its PerRank value, uckpt's log
lines about the restore), trains on to STEPS, and writes ``OUT/done-<node>.json``.
"""
import json
import os
import shutil
import signal
import sys

import numpy as np
import torch
import horovod.torch as hvd

from shm_worker import kept_logs

SAVE_AT, KILL_AT, STEPS, LOST = 3, 4, 7, 2


def main():
    shm_name, durable, hosts_file, hosts, out = sys.argv[1:6]
    hosts = hosts.split(",")
    node = hosts.index(os.environ["HOROVOD_HOSTNAME"])
    os.environ["UCKPT_NODE"] = f"node{node}"
    logs = kept_logs()

    import uckpt
    import uckpt.horovod

    hvd.init()
    torch.manual_seed(0)  # the same initial model on every rank
    model = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=model.named_parameters())
    seen = np.zeros(4, dtype=np.int64)
    state = uckpt.horovod.ElasticState(
        {"model": model, "optimizer": opt, "rank": uckpt.PerRank({"seen": seen})},
        tiers=[uckpt.Tier(f"shm://{shm_name}-{{node}}", keep=1, redundancy="partner"), durable],
        timeout=60)

    def write(name, obj):
        with open(os.path.join(out, f"{name}-node{node}.json"), "w") as f:
            json.dump(obj, f)

    def die():
        os.rename(durable, durable + ".away")
        with open(hosts_file + ".tmp", "w") as f:
            f.write("".join(f"{h}:1\n" for i, h in enumerate(hosts) if i != node))
        os.replace(hosts_file + ".tmp", hosts_file)
        # the node's memory is lost: its shm:// root, /dev/shm/uckpt/SHM_NAME-node<i>
        shutil.rmtree(os.path.dirname(state.manager.path(SAVE_AT)))
        os.kill(os.getpid(), signal.SIGKILL)

    @hvd.elastic.run
    def train(state):
        if state.step is not None:  # restored after the reset
            np.savez(os.path.join(out, f"restored-node{node}.npz"),
                     **{f"model/{k}": v.numpy() for k, v in model.state_dict().items()},
                     **{f"optimizer/state/{i}/momentum_buffer": s["momentum_buffer"].numpy()
                        for i, s in opt.state_dict()["state"].items()})
            write("restored", {"rank": hvd.rank(), "size": hvd.size(), "step": state.step,
                               "seen": state.state["rank"].value["seen"].tolist(),
                               "logs": [m for m in logs if m.startswith(("step ", "restored"))]})
        for step in range(0 if state.step is None else state.step + 1, STEPS):
            if step == KILL_AT and node == LOST and hvd.size() == 4:
                die()
            data = torch.Generator().manual_seed(1000 * step + hvd.rank())
            x = torch.randn(16, 10, generator=data)
            loss = (model(x) - x.sum(1, keepdim=True)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()  # gradients averaged over the ranks by Horovod
            seen[:] = 1000 * hvd.rank() + step
            if step == SAVE_AT and hvd.size() == 4:
                state.step = step
                state.commit()
                state.manager.wait()  # the copy to DURABLE is committed too
                hvd.allreduce(torch.zeros(1), name="flushed")  # ... on every rank

    train(state)
    state.close()
    params = hvd.allgather_object([p.detach().numpy().tobytes().hex() for p in
                                   model.parameters()])
    write("done", {"rank": hvd.rank(), "size": hvd.size(),
                   "params_equal": all(p == params[0] for p in params)})


if __name__ == "__main__":
    main()
