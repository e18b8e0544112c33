"""Run under mpiexec by tests/test_horovod_comm.py: uckpt.comm over horovod.torch.

usage: horovod_worker.py {hvd_first,mpi4py_first} TIMEOUT
``mpi4py_first`` imports mpi4py (which initializes MPI) before ``hvd.init()``;
``hvd_first`` lets Horovod initialize MPI. Prints one ``RESULT <json>`` line per rank.
"""
import json
import sys


def report(**kw):
    print("\nRESULT " + json.dumps(kw), flush=True)


def main():
    order, timeout = sys.argv[1], float(sys.argv[2])
    if order == "mpi4py_first":
        from mpi4py import MPI  # noqa: F401
    import torch
    import horovod.torch as hvd

    from uckpt.comm import DistributedError, get_communicator

    try:
        get_communicator(hvd)
        before_init = None
    except ValueError as e:
        before_init = str(e)

    hvd.init()
    c = get_communicator(hvd, timeout=timeout)
    from mpi4py import MPI
    rank = c.rank
    out = dict(rank=rank, size=c.size, hvd=[hvd.rank(), hvd.size()],
               world=[MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()],
               mpi_enabled=hvd.mpi_enabled(), cls=type(c).__name__, before_init=before_init)

    out["gathered"] = c.all_gather({"rank": rank, "s": "é" * rank})
    out["b0"] = c.broadcast({"step": 7, "who": rank} if rank == 0 else None)
    out["b1"] = c.broadcast(["from", rank] if rank == 1 else "ignored", root=1)

    # Horovod's own collectives interleaved with uckpt's: the usual Horovod resume
    # (rank 0 loads, then broadcasts the model and optimizer state).
    torch.manual_seed(rank)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * (rank + 1), momentum=0.9)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    momentum = opt.state[model.weight]["momentum_buffer"]
    out["model"] = c.all_gather([model.weight.flatten().tolist(), opt.param_groups[0]["lr"],
                                 momentum.flatten().tolist()])
    out["allreduce"] = hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Sum).item()

    err = ValueError("disk full on rank two") if rank == 2 else None
    try:
        c.check(err, what="save")
        out["raised"] = None
    except DistributedError as e:
        out.update(raised=type(e).__name__, msg=str(e),
                   failures={str(k): v for k, v in e.failures.items()},
                   cause=type(e.__cause__).__name__ if e.__cause__ else None)
    out["after"] = c.all_gather(rank)  # still usable after a reported failure
    c.barrier()
    report(**out)


if __name__ == "__main__":
    main()
