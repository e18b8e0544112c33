"""Round trips of plain NumPy/Python state through the core (no framework needed)."""
import collections
import math
import random

import ml_dtypes
import numpy as np
import pytest

import uckpt

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", "complex64", "complex128"]


def _array(dtype, shape, seed=0):
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * np.dtype(dtype).itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(shape)  # every bit pattern, NaN payloads included


def assert_bitwise(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("dtype", DTYPES + ["bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_every_dtype_bitwise(tmp_path, dtype):
    np_dtype = getattr(ml_dtypes, dtype) if dtype.startswith(("bfloat", "float8")) else np.dtype(dtype)
    arr = _array(np_dtype, (5, 7))
    uckpt.save(tmp_path / "c", {"x": arr})
    assert_bitwise(uckpt.load(tmp_path / "c")["x"], arr)


def test_plain_values_and_containers(tmp_path):
    state = {"epoch": 3, "lr": 0.1, "name": "run/1~x", "flag": True, "none": None,
             "nan": float("nan"), "inf": float("inf"), "ninf": float("-inf"),
             "big": 2 ** 100, "tuple": (1, (2.5, "a")), "list": [np.arange(3), {"k": [1, 2]}],
             "ints": {0: np.zeros(2), 7: "seven"}, "bytes": b"\x00\xff",
             "scalar": np.float32(1.25), "zero_d": np.array(4, dtype=np.int16),
             "empty": np.zeros((0, 5), np.float32), "slash/key": {"~tilde": np.ones(1)}}
    uckpt.save(tmp_path / "c", state, step=9, metadata={"note": "hi"})
    out = uckpt.load(tmp_path / "c")
    assert out["epoch"] == 3 and out["lr"] == 0.1 and out["name"] == "run/1~x"
    assert out["flag"] is True and out["none"] is None and out["big"] == 2 ** 100
    assert math.isnan(out["nan"]) and out["inf"] == math.inf and out["ninf"] == -math.inf
    assert out["tuple"] == (1, (2.5, "a"))
    assert isinstance(out["list"], list) and out["list"][1] == {"k": [1, 2]}
    assert_bitwise(out["list"][0], np.arange(3))
    assert set(out["ints"]) == {0, 7} and out["ints"][7] == "seven"
    assert out["bytes"] == b"\x00\xff"
    assert isinstance(out["scalar"], np.float32) and out["scalar"] == np.float32(1.25)
    assert_bitwise(out["zero_d"], np.array(4, dtype=np.int16))
    assert out["empty"].shape == (0, 5) and out["empty"].dtype == np.float32
    assert_bitwise(out["slash/key"]["~tilde"], np.ones(1))
    m = uckpt.manifest(tmp_path / "c")
    assert m.step == 9 and m.metadata == {"note": "hi"} and m.world_size == 1


def test_non_contiguous_and_big_endian(tmp_path):
    base = np.arange(24, dtype=np.float64).reshape(4, 6)
    state = {"t": base.T, "strided": base[:, ::2], "be": base.astype(">f4")}
    uckpt.save(tmp_path / "c", state)
    out = uckpt.load(tmp_path / "c")
    np.testing.assert_array_equal(out["t"], base.T)
    np.testing.assert_array_equal(out["strided"], base[:, ::2])
    assert out["be"].dtype == np.dtype("<f4")
    np.testing.assert_array_equal(out["be"], base.astype("f4"))


def test_chunked_arrays_roundtrip(tmp_path, small_chunks):
    arr = _array(np.float32, (100, 9), seed=1)
    uckpt.save(tmp_path / "c", {"a": arr, "v": _array(np.int64, (1000,), 2)},
               options=small_chunks)
    m = uckpt.manifest(tmp_path / "c")
    assert len(m.arrays["a"].chunks) > 5
    out = uckpt.load(tmp_path / "c")
    assert_bitwise(out["a"], arr)
    # in place into an existing array, too
    dest = np.zeros_like(arr)
    uckpt.load(tmp_path / "c", {"a": dest}, strict=False)
    assert_bitwise(dest, arr)


def test_shared_arrays_stored_once(tmp_path):
    w = np.arange(1000, dtype=np.float32)
    uckpt.save(tmp_path / "c", {"enc": {"w": w}, "dec": {"w": w}, "view": w[:10]})
    m = uckpt.manifest(tmp_path / "c")
    assert list(m.arrays) == ["enc/w", "view"]  # dec/w refers to enc/w
    out = uckpt.load(tmp_path / "c")
    assert out["dec"]["w"] is out["enc"]["w"]


def test_load_into_numpy_in_place(tmp_path):
    src = {"a": np.arange(6.0).reshape(2, 3), "nested": {"b": np.ones(4, np.int32)}, "epoch": 5}
    uckpt.save(tmp_path / "c", src)
    a = np.zeros((2, 3))
    b_base = np.zeros(8, np.int32)
    b = b_base[::2]  # not contiguous: loaded then copied
    out = uckpt.load(tmp_path / "c", {"a": a, "nested": {"b": b}, "epoch": None})
    assert out["epoch"] == 5
    np.testing.assert_array_equal(a, src["a"])
    np.testing.assert_array_equal(b, src["nested"]["b"])


def test_python_and_numpy_generators(tmp_path):
    r, g, legacy = random.Random(5), np.random.default_rng(7), np.random.RandomState(9)
    for _ in range(3):
        r.random(), g.random(), legacy.rand()
    uckpt.save(tmp_path / "c", {"r": r, "g": g, "legacy": legacy})
    expect = (r.random(), g.random(3), legacy.rand(3))
    r2, g2, legacy2 = random.Random(0), np.random.default_rng(0), np.random.RandomState(0)
    uckpt.load(tmp_path / "c", {"r": r2, "g": g2, "legacy": legacy2})
    assert r2.random() == expect[0]
    assert_bitwise(g2.random(3), expect[1])
    assert_bitwise(legacy2.rand(3), expect[2])


def test_random_state_captures_global_generators(tmp_path):
    random.seed(1)
    np.random.seed(2)
    uckpt.save(tmp_path / "c", {"rng": uckpt.RandomState()})
    expect = (random.random(), np.random.rand(4))
    random.seed(99)
    np.random.seed(99)
    uckpt.load(tmp_path / "c", {"rng": uckpt.RandomState()})
    assert random.random() == expect[0]
    assert_bitwise(np.random.rand(4), expect[1])


def test_stateful_protocol_objects(tmp_path):
    class Counter:
        def __init__(self):
            self.n, self.hist = 0, np.zeros(3)

        def state_dict(self):
            return {"n": self.n, "hist": self.hist}

        def load_state_dict(self, sd):
            self.n, self.hist = sd["n"], sd["hist"].copy()

    c = Counter()
    c.n, c.hist[:] = 4, [1, 2, 3]
    uckpt.save(tmp_path / "c", {"counter": c})
    c2 = Counter()
    uckpt.load(tmp_path / "c", {"counter": c2})
    assert c2.n == 4 and c2.hist.tolist() == [1, 2, 3]


def test_registered_adapter_takes_precedence(tmp_path):
    class Box:
        def __init__(self, v):
            self.v = v

    class BoxAdapter(uckpt.Adapter):
        name = "test.box"

        def handles(self, obj):
            return isinstance(obj, Box)

        def extract(self, obj):
            return {"v": np.asarray(obj.v)}

        def restore(self, obj, tree):
            obj.v = tree["v"].tolist()

    uckpt.register_adapter(BoxAdapter())
    uckpt.save(tmp_path / "c", {"box": Box([1, 2])})
    b = Box(None)
    uckpt.load(tmp_path / "c", {"box": b})
    assert b.v == [1, 2]
    assert uckpt.manifest(tmp_path / "c").tree["items"]["box"]["adapter"] == "test.box"


class Frozen:
    """An object that cannot be changed, as a jax.Array: its adapter returns a new one."""

    __slots__ = ("v",)

    def __init__(self, v):
        self.v = v


class FrozenAdapter(uckpt.Adapter):
    name = "test.frozen"

    def handles(self, obj):
        return isinstance(obj, Frozen)

    def extract(self, obj):
        return {"v": obj.v}

    def restore(self, obj, tree):
        return Frozen(tree["v"])


Pair = collections.namedtuple("Pair", "a b")


def test_objects_restore_returns_are_put_into_the_state_and_returned(tmp_path):
    adapter = FrozenAdapter()
    uckpt.register_adapter(adapter)
    try:
        uckpt.save(tmp_path / "c", {
            "x": Frozen(np.arange(3)), "pair": Pair(Frozen(np.ones(2)), 5),
            "seq": [Frozen(np.zeros(1)), (Frozen(np.full(2, 7)), "s")], "plain": Pair(1, 2)})
        old, seq = Frozen(np.zeros(3)), [Frozen(np.ones(1)), (Frozen(np.zeros(2)), "t")]
        state = {"x": old, "pair": Pair(Frozen(np.zeros(2)), 0), "seq": seq,
                 "plain": Pair(0, 0)}
        out = uckpt.load(tmp_path / "c", state)
    finally:
        uckpt.registry.unregister_adapter(adapter)
    assert state["x"] is not old and state["x"].v.tolist() == [0, 1, 2] and out["x"] is state["x"]
    assert type(state["pair"]) is Pair and state["pair"].b == 5
    assert state["pair"].a.v.tolist() == [1, 1] and out["pair"].a is state["pair"].a
    assert state["seq"] is seq and seq[0].v.tolist() == [0] and seq[1][1] == "s"
    assert seq[1][0].v.tolist() == [7, 7] and out["seq"][1][0] is seq[1][0]
    assert type(state["plain"]) is Pair and state["plain"] == (1, 2)
    assert type(out["plain"]) is Pair


def test_partial_restore_needs_strict_false(tmp_path):
    uckpt.save(tmp_path / "c", {"a": np.ones(2), "b": np.zeros(2)})
    a = np.zeros(2)
    with pytest.raises(uckpt.errors.KeyMismatchError, match="(?s)unexpected in the checkpoint.*b"):
        uckpt.load(tmp_path / "c", {"a": a})
    assert a.tolist() == [0, 0]  # refused before anything was read
    uckpt.load(tmp_path / "c", {"a": a}, strict=False)
    assert a.tolist() == [1, 1]
