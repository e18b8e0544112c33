"""Sharded arrays of one process holding 8 CPU devices, for tests/test_jax_resume.py.

usage: jax_mesh_worker.py DIR (the parent sets XLA_FLAGS for 8 host devices)

Saves arrays sharded over a 2 x 4 mesh (split on both axes; split on one axis and
replicated on the other; replicated everywhere; typed keys split over devices), then
checks: the manifest stores each array once (its bytes, no replica twice); a load onto a
4-device mesh of another shape, onto 1 device and onto ShapeDtypeStructs gives the same
values with the shardings asked for. Prints "ok" at the end.
"""
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import uckpt
from jax_common import ensure_registered, same_bits

ensure_registered()
directory = sys.argv[1]
assert len(jax.devices()) == 8
mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("a", "b"))
values = {"both": np.arange(8 * 16, dtype=np.float32).reshape(8, 16),
          "rows": np.arange(4 * 6, dtype=np.int32).reshape(4, 6),
          "everywhere": np.linspace(0, 1, 6).astype(jnp.bfloat16)}
specs = {"both": P("a", "b"), "rows": P("a", None), "everywhere": P()}
state = {k: jax.device_put(v, NamedSharding(mesh, specs[k])) for k, v in values.items()}
state["keys"] = jax.device_put(jax.random.split(jax.random.key(3), 8),
                               NamedSharding(mesh, P(("a", "b"))))
assert len([s for s in state["rows"].addressable_shards if s.replica_id == 0]) == 2
uckpt.save(directory, state)

m = uckpt.manifest(directory)
for name, v in values.items():
    entry = m.arrays[name]
    assert sum(c.length for c in entry.chunks) == v.nbytes, (name, entry.chunks)
plain = uckpt.load(directory)
assert all(np.array_equal(plain[k], values[k]) for k in values)

four = Mesh(np.array(jax.devices()[4:]).reshape(2, 2), ("x", "y"))
other = {"both": P(None, ("x", "y")), "rows": P("y", "x"), "everywhere": P("x"),
         "keys": P("x")}
targets = {k: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(four, other[k]))
           for k, a in state.items()}
out = uckpt.load(directory, targets)
assert same_bits(out, state)
for k, a in out.items():
    assert a.sharding == targets[k].sharding, (k, a.sharding)
    assert {d.id for d in a.devices()} <= {4, 5, 6, 7}
one = jax.sharding.SingleDeviceSharding(jax.devices()[2])
live = {k: jax.device_put(jnp.zeros_like(a), one) for k, a in state.items() if k != "keys"}
live["keys"] = jax.device_put(jax.random.split(jax.random.key(0), 8), one)
uckpt.load(directory, live)  # the new arrays are put into `live`
assert same_bits(live, state) and all(a.sharding == one for a in live.values())
print("ok")
