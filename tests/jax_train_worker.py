"""A small Flax NNX + Optax training loop with dropout, checkpointed every step by a
``CheckpointManager`` (asynchronous saves), for tests/test_jax_resume.py.

usage: jax_train_worker.py ROOT STEPS KILL_AT OUT DEVICES

The parent sets ``XLA_FLAGS=--xla_force_host_platform_device_count=DEVICES`` before this
process imports JAX. With DEVICES > 1 the model's kernels and the optimizer state are
sharded over a 2 x (DEVICES // 2) mesh (``NamedSharding``), the batch over its first axis.
The run restores the newest step in ROOT (if any), then trains and saves up to STEPS.
With KILL_AT >= 0 it sends itself SIGKILL right after starting the save of step KILL_AT
(that save in flight, the one before committed). Otherwise it writes OUT (an ``.npz``):
``resumed/*``, the state after STEPS, and ``fresh/*``, the state after STEPS steps of an
uninterrupted run in this process; with DEVICES > 1 also ``four/*``, the checkpoint of
step STEPS loaded onto a 2 x 2 mesh of 4 devices (ShapeDtypeStruct targets).
"""
import os
import signal
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import uckpt  # noqa: E402
from jax_common import ensure_registered, host  # noqa: E402

ensure_registered()


class Net(nnx.Module):
    def __init__(self, rngs):
        self.hidden = nnx.Linear(8, 16, rngs=rngs)
        self.drop = nnx.Dropout(0.3, rngs=rngs)
        self.out = nnx.Linear(16, 4, rngs=rngs)

    def __call__(self, x):
        return self.out(self.drop(nnx.relu(self.hidden(x))))


def build(mesh):
    model = Net(nnx.Rngs(0, dropout=1))
    optimizer = nnx.Optimizer(model, optax.adamw(optax.cosine_decay_schedule(1e-2, 20)),
                              wrt=nnx.Param)
    if mesh is not None:
        def place(x):
            if isinstance(x, jax.Array) and x.ndim == 2:
                return jax.device_put(x, NamedSharding(mesh, P("a", "b")))
            return jax.device_put(x, NamedSharding(mesh, P())) if isinstance(x, jax.Array) \
                else x
        state = nnx.state((model, optimizer))
        nnx.update((model, optimizer), jax.tree_util.tree_map(place, state))
    return model, optimizer


@nnx.jit
def train_step(model, optimizer, x, y):
    def loss(m):
        return ((m(x) - y) ** 2).mean()

    grads = nnx.grad(loss)(model)
    optimizer.update(model, grads)


def batch(step, mesh):
    k = jax.random.fold_in(jax.random.key(7), step)
    x = jax.random.normal(k, (8, 8))
    y = jnp.tanh(x[:, :4] * x[:, 4:])
    if mesh is not None:
        x = jax.device_put(x, NamedSharding(mesh, P("a")))
        y = jax.device_put(y, NamedSharding(mesh, P("a")))
    return x, y


def run(root, steps, kill_at, mesh):
    model, optimizer = build(mesh)
    state = {"model": model, "optimizer": optimizer}
    manager = uckpt.CheckpointManager(root, async_save=True)
    start = manager.restore(state)
    start = 0 if start is None else start
    for step in range(start + 1, steps + 1):
        train_step(model, optimizer, *batch(step, mesh))
        manager.save(step, {"model": model, "optimizer": optimizer})
        if step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
    manager.close()
    return model, optimizer


def flat(prefix, tree):
    """``prefix + key path`` -> NumPy array of every leaf of ``tree`` (NNX objects as
    their pure dicts, so that all three runs name their leaves alike)."""
    if isinstance(tree, tuple) and isinstance(tree[0], nnx.Module):
        tree = nnx.to_pure_dict(nnx.state(tree))
    return {prefix + jax.tree_util.keystr(p): host(x)
            for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def main():
    root, steps, kill_at, out, devices = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
        sys.argv[4], int(sys.argv[5])
    assert len(jax.devices()) == devices, jax.devices()
    mesh = Mesh(np.array(jax.devices()).reshape(2, devices // 2), ("a", "b")) \
        if devices > 1 else None
    model, optimizer = run(root, steps, kill_at, mesh)
    arrays = flat("resumed", (model, optimizer))
    fresh_model, fresh_opt = build(mesh)
    for step in range(1, steps + 1):
        train_step(fresh_model, fresh_opt, *batch(step, mesh))
    arrays.update(flat("fresh", (fresh_model, fresh_opt)))
    if mesh is not None:
        assert model.hidden.kernel[...].sharding.spec == P("a", "b")
        four = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("x", "y"))
        target = jax.tree_util.tree_map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(
                four, P(None, "x") if x.ndim == 2 else P())), nnx.to_pure_dict(
                nnx.state((model, optimizer))))
        loaded = {"model": target[0], "optimizer": target[1]}
        reader = uckpt.CheckpointManager(root)
        assert reader.restore(loaded) == steps  # the new arrays are put into `loaded`
        reader.close()
        kernel = loaded["model"]["hidden"]["kernel"]
        assert kernel.sharding.mesh.devices.size == 4 and len(kernel.addressable_shards) == 4
        arrays.update(flat("four", (loaded["model"], loaded["optimizer"])))
    np.savez(out, **arrays)


if __name__ == "__main__":
    main()
