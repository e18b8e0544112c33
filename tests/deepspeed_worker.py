"""One rank of a tiny DeepSpeed ZeRO run on CPU (gloo), for tests/test_convert_deepspeed.py.

``train STAGE DIR``: 3 steps, ``save_checkpoint(DIR)``, 2 more steps. ``resume STAGE DIR
AGAIN``: a fresh engine ``load_checkpoint(DIR)``s, saves at once to ``AGAIN`` (what it
loaded, to compare), then the same 2 steps. Every step's global batch (6 samples) is the
same whatever the number of ranks (each rank takes its slice); the loss reported before
each step and at the end is that of the whole global batch, on every rank.
"""
import json
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed  # noqa: E402
import torch  # noqa: E402

# DeepSpeed's CPU accelerator compiles its shared-memory allreduce op (deepspeed_shm_comm) at
# the first init_distributed: minutes of C++ on a fresh machine, and a build killed midway
# leaves a lock in ~/.cache/torch_extensions that makes every later run wait forever (what
# timed out in a full run). These runs use gloo's allreduce instead: the op only speeds up
# the collectives, never what is saved.
deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False

BATCH = 6


def batch(step, rank, world):
    g = torch.Generator().manual_seed(1000 + step)
    x, y = torch.randn(BATCH, 5, generator=g), torch.randn(BATCH, 3, generator=g)
    n = BATCH // world
    return (x, y), (x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n])


def main(mode, stage, ckpt, again=None):
    deepspeed.init_distributed(dist_backend="gloo")
    world, rank = torch.distributed.get_world_size(), torch.distributed.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3))
    cfg = {"train_batch_size": BATCH, "train_micro_batch_size_per_gpu": BATCH // world,
           "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
           "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 5}},
           "zero_optimization": {"stage": int(stage)}, "steps_per_print": 10 ** 6}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=cfg)
    losses, start = [], 0
    if mode == "resume":
        path, client = engine.load_checkpoint(ckpt)
        assert path is not None, "nothing loaded"
        start = engine.global_steps
        engine.save_checkpoint(again, client_state={"epoch": client.get("epoch")})

    def step(i):
        (gx, gy), (x, y) = batch(i, rank, world)
        with torch.no_grad():
            losses.append(torch.nn.functional.mse_loss(engine(gx), gy).item())
        engine.backward(torch.nn.functional.mse_loss(engine(x), y))
        engine.step()

    for i in range(start, 3 if mode == "train" else start + 2):
        step(i)
    if mode == "train":
        engine.save_checkpoint(ckpt, client_state={"epoch": 7})
        losses = []
        for i in range(3, 5):
            step(i)
    (gx, gy), _ = batch(99, rank, world)
    with torch.no_grad():
        losses.append(torch.nn.functional.mse_loss(engine(gx), gy).item())
    print("RESULT", json.dumps({"rank": rank, "losses": [float.hex(v) for v in losses],
                                "steps": engine.global_steps}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
