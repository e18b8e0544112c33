"""Run under mpiexec or as torch.distributed ranks by tests/test_comm.py.

usage: comm_worker.py {mpi,torch} {basic,fail2,to_root,die3,...} TIMEOUT
Prints one ``RESULT <json>`` line per rank.
"""
import json
import os
import signal
import sys
import time

#: seconds the ranks may start apart (a loaded machine imports torch slowly): the process
#: group's own timeout, which bounds its rendezvous, and the first barrier's of the
#: die/hang scenarios; what they test runs under the communicator's TIMEOUT
STARTUP = 60


def report(**kw):
    print("\nRESULT " + json.dumps(kw), flush=True)


def main():
    backend, scenario, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
    from uckpt.comm import (CollectiveTimeoutError, DistributedError, get_communicator,
                            make_communicator)

    if backend == "torch":
        from datetime import timedelta

        import torch.distributed as dist
        dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=STARTUP))
    else:
        from mpi4py import MPI  # noqa: F401  (detection: mpi4py imported -> MPI)
    c = get_communicator(None, timeout=timeout)  # detected
    rank = c.rank

    if scenario == "basic":
        c.barrier()
        gathered = c.all_gather({"rank": rank, "data": list(range(rank)), "s": "é" * rank})
        b0 = c.broadcast({"step": 7, "who": rank} if rank == 0 else None)
        b1 = c.broadcast(["from", rank] if rank == 1 else "ignored", root=1)
        c.check(None)
        c.barrier()
        report(rank=rank, size=c.size, cls=type(c).__name__, gathered=gathered, b0=b0, b1=b1)
    elif scenario == "fail2":
        err = None
        try:
            if rank == 2:
                raise ValueError("disk full on rank two")
        except ValueError as e:
            err = e
        try:
            c.check(err, what="save")
            report(rank=rank, raised=None)
        except DistributedError as e:
            after = c.all_gather(rank)  # still usable after a reported failure
            report(rank=rank, raised=type(e).__name__, msg=str(e),
                   failures={str(k): v for k, v in e.failures.items()},
                   cause=type(e.__cause__).__name__ if e.__cause__ else None, after=after)
    elif scenario == "to_root":  # gather, all_reduce_minmax and their failure-reporting forms
        def failing(value):
            def fn():
                if rank == 2:
                    raise ValueError("disk full on rank two")
                return value
            return fn

        out = {"gathered": c.gather({"rank": rank, "s": "é" * rank}, root=1),
               "minmax": c.all_reduce_minmax([rank, -rank, 7, 2 ** 62 * (rank % 2)]),
               "outcomes": c.gather_outcomes_to(lambda: rank * 10, root=3, what="write"),
               "agreed": c.agree_outcomes(lambda: [rank, 5], 2, what="plan"),
               "scattered": c.scatter([{"to": r, "s": "é" * r} for r in range(c.size)]
                                      if rank == 2 else None, root=2)}
        for name, call in (("to_failed", lambda: c.gather_outcomes_to(failing(rank), 0, "save")),
                           ("agree_failed", lambda: c.agree_outcomes(failing([rank]), 1, "save"))):
            try:
                call()
                out[name] = None
            except DistributedError as e:
                out[name] = {"raised": type(e).__name__, "msg": str(e),
                             "failures": {str(k): v for k, v in e.failures.items()},
                             "cause": type(e.__cause__).__name__ if e.__cause__ else None}
        out["after"] = c.all_gather(rank)  # still usable after a reported failure
        report(rank=rank, **out)
    elif scenario == "let_go":  # torch: after each call, gloo's threads hold none of its tensors
        given = []  # every tensor handed to torch.distributed (a reference here adds no use)

        def spy(fn):
            def call(*args, **kw):
                for x in [*args, *kw.values()]:
                    given.extend(t for t in (x if isinstance(x, list) else [x])
                                 if hasattr(t, "_use_count"))
                return fn(*args, **kw)
            return call
        for name in ("all_gather", "gather", "broadcast", "all_reduce", "isend", "irecv"):
            setattr(dist, name, spy(getattr(dist, name)))
        held, calls = 0, 0
        n, nxt, prev = c.size, (rank + 1) % c.size, (rank - 1) % c.size
        for i in range(int(os.environ.get("ROUNDS", "100"))):
            for call in (lambda: c.all_gather([rank, i]), lambda: c.broadcast(i, root=i % n),
                         lambda: c.gather(rank, root=i % n),
                         lambda: c.all_reduce_minmax([rank, i]),
                         lambda: c.exchange({nxt: bytes(1 + i % 5)}, [prev])):
                call()
                calls += 1
                held += sum(t._use_count() > 1 for t in given)  # still held by gloo
                given.clear()
        report(rank=rank, held=held, calls=calls)
    elif scenario.startswith(("die", "hang")):
        # die3 / die0: that rank SIGKILLs itself; hang3 / hang0: it is stuck (sleeps),
        # then exits. "_gather" suffix: survivors are in all_gather, "_reduce" in
        # all_reduce_minmax, else in barrier.
        make_communicator(None, timeout=STARTUP).barrier()
        victim = int(scenario.split("_")[0][-1])
        if rank == victim:
            if scenario.startswith("die"):
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(timeout + max(1.0, 0.1 * timeout) + 3)
            os._exit(0)
        t0 = time.monotonic()
        try:
            if scenario.endswith("_reduce"):
                c.all_reduce_minmax([rank])
            elif not scenario.endswith("_gather"):
                c.barrier()
            else:
                c.all_gather({"rank": rank})
            report(rank=rank, raised=None)
        except DistributedError as e:
            report(rank=rank, raised=type(e).__name__, timeout=isinstance(e, CollectiveTimeoutError),
                   missing=getattr(e, "missing", None), msg=str(e), elapsed=time.monotonic() - t0)
        sys.stdout.flush()
        time.sleep(1.0)  # let the other survivors receive rank 0's notice before the job ends
        os._exit(0)  # the job is broken; MPI_Finalize / gloo teardown could wait for the dead rank
    if backend == "torch":
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
