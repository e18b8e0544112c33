"""The JAX adapters (adapters/uckpt_jax) in one process on one device: pytrees of every
kind, Flax NNX and Linen, Optax states, PRNG keys, low-precision dtypes, targets given as
ShapeDtypeStructs, the errors, the asynchronous snapshot, and the conformance suite."""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen, nnx, struct

import uckpt
from uckpt.errors import (DtypeMismatchError, KeyMismatchError, ShapeMismatchError,
                          StateMismatchError, UnsupportedObjectError)
from uckpt.testing.adapters import AdapterCase, AdapterConformance
from jax_common import ensure_registered, same_bits

ensure_registered()


class Pair(NamedTuple):
    first: jax.Array
    second: tuple


@struct.dataclass
class Holder:
    weights: jax.Array
    scale: jax.Array
    name: str = struct.field(pytree_node=False, default="holder")


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Registered:
    a: jax.Array
    b: list


def _pytree(seed: int):
    k = jax.random.key(seed)
    k1, k2, k3 = jax.random.split(k, 3)
    params = {"w": jax.random.normal(k1, (4, 3)), "b": jnp.zeros(3, jnp.bfloat16)}
    tx = optax.chain(optax.clip_by_global_norm(1.0),
                     optax.adamw(optax.exponential_decay(1e-2, 10, 0.5)))
    opt_state = tx.init(params)
    _, opt_state = tx.update(params, opt_state, params)
    return {
        "params": params,
        "opt_state": opt_state,
        "pair": Pair(jnp.arange(5, dtype=jnp.int32) + seed, (jnp.ones(2, jnp.float16), 7)),
        "holder": Holder(jax.random.uniform(k2, (2, 2)), jnp.float32(seed)),
        "registered": Registered(jnp.full((3,), seed, jnp.uint8), [jnp.ones(1), 2.5]),
        "key": k3,
        "keys": jax.random.split(k3, 4),
        "raw_key": jax.random.PRNGKey(seed),
        "rbg_key": jax.random.key(seed, impl="rbg"),
        "f8": jnp.linspace(0, 1, 6).astype(jnp.float8_e4m3fn),
        "list": [jnp.ones(2) * seed, {"deep": jnp.eye(2) * seed}],
        "host": np.arange(3) + seed,
        "step": seed,
    }


def _zeroed(tree):
    return jax.tree_util.tree_map(
        lambda x: jax.random.wrap_key_data(jnp.zeros_like(jax.random.key_data(x)),
                                           impl=jax.random.key_impl(x))
        if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
        else jnp.zeros_like(x) if isinstance(x, jax.Array) else x, tree)


def test_pytree_round_trip_bit_for_bit_returns_and_puts_new_arrays(tmp_path):
    saved = _pytree(0)
    uckpt.save(tmp_path / "c", saved)
    state = _zeroed(_pytree(1))
    state["step"] = 1
    state["host"] = np.zeros(3, np.int64)
    out = uckpt.load(tmp_path / "c", state)
    assert same_bits(out, saved)
    assert same_bits(state, saved)  # the new arrays are put into the state too
    assert type(out["opt_state"][1][0]).__name__ == "ScaleByAdamState"
    assert isinstance(out["holder"], Holder) and out["holder"].name == "holder"
    assert isinstance(out["registered"], Registered)
    assert jax.random.key_impl(out["rbg_key"]) == jax.random.key_impl(saved["rbg_key"])
    assert out["params"]["b"].dtype == jnp.bfloat16 and out["f8"].dtype == jnp.float8_e4m3fn


def test_shape_dtype_structs_give_arrays_placed_on_their_sharding(tmp_path):
    saved = _pytree(0)
    uckpt.save(tmp_path / "c", saved)
    device = jax.devices()[-1]
    sharding = jax.sharding.SingleDeviceSharding(device)
    abstract = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
        if isinstance(x, jax.Array) else x, saved)
    out = uckpt.load(tmp_path / "c", abstract)
    assert same_bits(out, saved)
    assert out["params"]["w"].sharding == sharding
    assert out["opt_state"][1][0].mu["w"].sharding == sharding
    without = uckpt.load(tmp_path / "c")  # no target: NumPy, as for every checkpoint
    assert isinstance(without["params"]["w"], np.ndarray)
    assert without["key"]["impl"] == "threefry2x32"


class Net(nnx.Module):
    def __init__(self, rngs: nnx.Rngs, width: int = 4):
        self.linear = nnx.Linear(3, width, rngs=rngs)
        self.norm = nnx.BatchNorm(width, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)

    def __call__(self, x):
        return self.drop(self.norm(self.linear(x)))


def _nnx(seed: int, width: int = 4):
    model = Net(nnx.Rngs(seed, dropout=seed + 1), width)
    return model, nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)


def _nnx_step(model, optimizer):
    x = jnp.ones((2, 3))

    def loss(m):
        return (m(x) ** 2).mean()

    grads = nnx.grad(loss)(model)
    optimizer.update(model, grads)


def test_nnx_model_and_optimizer_restore_in_place_with_dropout_keys(tmp_path):
    model, opt = _nnx(0)
    _nnx_step(model, opt)
    uckpt.save(tmp_path / "c", {"model": model, "optimizer": opt})
    want = nnx.state((model, opt))
    model2, opt2 = _nnx(5)
    out = uckpt.load(tmp_path / "c", {"model": model2, "optimizer": opt2})
    assert same_bits(nnx.state((model2, opt2)), want)
    assert isinstance(out["model"]["linear"]["kernel"], np.ndarray)  # in place: as loaded
    # the same next step: dropout draws from the restored key
    _nnx_step(model, opt)
    _nnx_step(model2, opt2)
    assert same_bits(nnx.state((model2, opt2)), nnx.state((model, opt)))


def test_linen_variables_round_trip(tmp_path):
    class Mlp(linen.Module):
        @linen.compact
        def __call__(self, x, train: bool = False):
            x = linen.Dense(4)(x)
            x = linen.BatchNorm(use_running_average=not train)(x)
            return linen.Dropout(0.5, deterministic=not train)(x)

    net = Mlp()
    variables = net.init(jax.random.key(0), jnp.ones((2, 3)))
    variables = {**variables, "params": jax.tree_util.tree_map(lambda v: v + 1,
                                                               variables["params"])}
    uckpt.save(tmp_path / "c", {"variables": variables})
    other = net.init(jax.random.key(1), jnp.ones((2, 3)))
    state = {"variables": other}
    uckpt.load(tmp_path / "c", state)
    assert same_bits(state["variables"], variables)
    y = net.apply(state["variables"], jnp.ones((2, 3)))
    assert np.array_equal(np.asarray(y), np.asarray(net.apply(variables, jnp.ones((2, 3)))))


def test_mismatches_are_refused_naming_the_path_and_change_nothing(tmp_path):
    saved = _pytree(0)
    uckpt.save(tmp_path / "c", saved)
    state = _zeroed(_pytree(1))
    state["params"] = {"w": jnp.zeros((5, 3)), "b": state["params"]["b"]}
    before = state["params"]["w"]
    with pytest.raises(ShapeMismatchError,
                       match=r"(?s)'params/w'.*shape \[4, 3\], the state \[5, 3\]"):
        uckpt.load(tmp_path / "c", state)
    assert state["params"]["w"] is before
    state["params"] = {"w": jnp.zeros((4, 3), jnp.float16), "b": state["params"]["b"]}
    with pytest.raises(DtypeMismatchError,
                       match=r"(?s)'params/w'.*holds float32, the state float16"):
        uckpt.load(tmp_path / "c", state)
    state = _zeroed(_pytree(1))
    state["rbg_key"] = jax.random.key(0)
    with pytest.raises(StateMismatchError,
                       match=r"(?s)'rbg_key'.*holds rbg keys, the state threefry2x32"):
        uckpt.load(tmp_path / "c", state)
    state = _zeroed(_pytree(1))
    state["holder"] = {"weights": jnp.zeros((2, 2))}
    with pytest.raises(StateMismatchError, match="holder"):
        uckpt.load(tmp_path / "c", state)
    state = _zeroed(_pytree(1))
    state["registered"] = Registered(state["registered"].a, [jnp.ones(1)])
    with pytest.raises(StateMismatchError,
                       match=r"(?s)'registered'.*'b': the state holds a sequence of 1"):
        uckpt.load(tmp_path / "c", state)


def test_nnx_module_of_another_width_is_refused(tmp_path):
    model, _ = _nnx(0)
    uckpt.save(tmp_path / "c", {"model": model})
    other, _ = _nnx(1, width=6)
    with pytest.raises(ShapeMismatchError,
                       match=r"(?s)'model'.*'linear/kernel'.*shape \[3, 4\]"):
        uckpt.load(tmp_path / "c", {"model": other})


def test_shape_dtype_struct_cannot_be_saved(tmp_path):
    with pytest.raises(UnsupportedObjectError, match="ShapeDtypeStruct.*no values"):
        uckpt.save(tmp_path / "c", {"w": jax.ShapeDtypeStruct((2,), jnp.float32)})


def test_async_save_holds_arrays_deleted_right_after_it_returns(tmp_path):
    """A jitted step that donates its input frees the old buffers as soon as ``save``
    returns: the snapshot has copied them by then."""
    params = {"w": jnp.arange(1 << 16, dtype=jnp.float32), "b": jnp.ones(7)}
    want = {k: np.asarray(v).copy() for k, v in params.items()}
    handle = uckpt.save(tmp_path / "c", {"params": params}, blocking=False)
    for leaf in params.values():
        leaf.delete()  # what donation does to the old state
    handle.wait()
    got = uckpt.load(tmp_path / "c")["params"]
    assert all(np.array_equal(got[k], want[k]) for k in want)


def test_key_errors_of_a_pytree_node_name_both_sides(tmp_path):
    uckpt.save(tmp_path / "c", {"h": Holder(jnp.ones(2), jnp.float32(1))})
    with pytest.raises(KeyMismatchError, match=r"missing.*'a'.*only.*'scale'"):
        uckpt.load(tmp_path / "c", {"h": Registered(jnp.ones(2), [])})


# --- the conformance suite --------------------------------------------------------------------
def _array(seed):
    return jax.random.normal(jax.random.key(seed), (4, 8)).astype(jnp.bfloat16)


def _holder(seed):
    return Holder(jax.random.normal(jax.random.key(seed), (3, 2)), jnp.float32(seed))


def _bump_nnx(model):
    nnx.update(model, jax.tree_util.tree_map(lambda v: v + 1, nnx.state(model, nnx.Param)))


ONE = jax.sharding.SingleDeviceSharding(jax.devices()[0])

CASES = [
    AdapterCase("jax.array", make=_array, mutate=lambda x: x + 1,
                make_mismatched=lambda: jnp.zeros((3, 8), jnp.bfloat16),
                make_unbuilt=lambda: jax.ShapeDtypeStruct((4, 8), jnp.bfloat16, sharding=ONE)),
    AdapterCase("jax.prng_key", make=lambda s: jax.random.key(s),
                mutate=lambda k: jax.random.split(k)[0],
                make_mismatched=lambda: jax.random.split(jax.random.key(0), 2),
                make_unbuilt=lambda: jax.eval_shape(lambda: jax.random.key(0))),
    AdapterCase("flax.struct", make=_holder,
                mutate=lambda h: h.replace(weights=h.weights * 2, scale=h.scale + 1),
                make_mismatched=lambda: Holder(jnp.zeros((2, 2)), jnp.float32(0)),
                make_unbuilt=lambda: jax.eval_shape(lambda: _holder(0))),
    AdapterCase("flax.nnx", make=lambda s: _nnx(s)[0], mutate=_bump_nnx,
                make_mismatched=lambda: _nnx(0, width=6)[0]),
]


class TestJaxConformance(AdapterConformance):
    cases = CASES
