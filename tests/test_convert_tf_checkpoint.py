"""TensorFlow's own checkpoint format in `uckpt convert` (issue 30, section 1): checkpoints of
`tf.train.Checkpoint` / `tf.train.CheckpointManager` and tf_keras `save_weights` read with
TensorFlow's reader, written back with its writer; TF -> uckpt -> TF bit for bit, and
`restore()` of the result resumes training with the same next loss, bit for bit."""
import os

import numpy as np
import pytest

from convert_common import assert_error, assert_ok, cli, cli_without

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import uckpt  # noqa: E402
from uckpt.cli.main import main  # noqa: E402
from uckpt.conversion import convert, diff, open_checkpoint  # noqa: E402
from uckpt.errors import (CheckpointExistsError, CheckpointNotFoundError,  # noqa: E402
                          CorruptCheckpointError)

pytestmark = pytest.mark.filterwarnings("ignore::uckpt.conversion.ConvertWarning",
                                        "ignore::UserWarning", "ignore::DeprecationWarning")

X = np.random.RandomState(0).randn(16, 4).astype(np.float32)
Y = X.sum(axis=1, keepdims=True)
NAME = b"run-\x00\xff"  # a string variable: bytes that are not UTF-8
HALF = np.array([1.5, -2.0, 3.0e-3], dtype=tf.bfloat16.as_numpy_dtype)
WORDS = [[b"a", b"bc", b""], [b"\xff", b"d\x00", b"ef"]]  # a string tensor of shape (2, 3)


def model_and_optimizer():
    """A 2-layer Keras model and its Adam, built (slots made) so restore() can fill them."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(1)])
    opt = keras.optimizers.Adam(1e-2)
    opt.build(model.trainable_variables)
    return model, opt


def train_step(model, opt):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(X) - Y) ** 2)
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    return loss.numpy()


def checkpoint(model, opt):
    return tf.train.Checkpoint(model=model, optimizer=opt,
                               step=tf.Variable(0, dtype=tf.int64),
                               name=tf.Variable(b""), half=tf.Variable(np.zeros_like(HALF)),
                               words=tf.Variable(tf.fill([2, 3], b"")))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A CheckpointManager directory (ckpt-1 after one step, ckpt-2 after two) and the loss
    of the step after ckpt-2."""
    root = tmp_path_factory.mktemp("tf")
    model, opt = model_and_optimizer()
    ck = checkpoint(model, opt)
    ck.name.assign(NAME)
    ck.half.assign(HALF)
    ck.words.assign(WORDS)
    manager = tf.train.CheckpointManager(ck, root / "run", max_to_keep=3)
    for step in (1, 2):
        train_step(model, opt)
        ck.step.assign(step)
        manager.save()
    return {"dir": root / "run", "latest": root / "run" / "ckpt-2",
            "next_loss": train_step(model, opt)}


def tensors(prefix):
    """Every tensor of a TensorFlow checkpoint, as (dtype, bytes)."""
    reader = tf.train.load_checkpoint(str(prefix))
    out = {}
    for key, dtype in reader.get_variable_to_dtype_map().items():
        value = np.asarray(reader.get_tensor(key), dtype=object if dtype == tf.string else None)
        out[key] = (dtype.name, value.shape,
                    value.tolist() if dtype == tf.string else value.tobytes())
    return out


def test_key_mapping_is_one_to_one():
    from uckpt.conversion.tf_names import to_key, to_path

    cases = {"model/layer_with_weights-0/kernel/.ATTRIBUTES/VARIABLE_VALUE":
             "model/layer_with_weights-0/kernel",
             "model/dense/kernel/.OPTIMIZER_SLOT/optimizer/m/.ATTRIBUTES/VARIABLE_VALUE":
             "optimizer/.OPTIMIZER_SLOT/m/model/dense/kernel",
             "a/b/.OPTIMIZER_SLOT/outer/opt/v/.ATTRIBUTES/VARIABLE_VALUE":
             "outer/opt/.OPTIMIZER_SLOT/v/a/b",
             "save_counter/.ATTRIBUTES/VARIABLE_VALUE": "save_counter",
             "gen/.ATTRIBUTES/py_state": "gen/.ATTRIBUTES/py_state"}
    for key, path in cases.items():
        assert "/".join(to_path(key)) == path
        assert to_key(path.split("/")) == key


def test_tf_to_uckpt_to_tf_bit_for_bit(run, tmp_path):
    """The CLI as a user runs it: the manager's directory (its latest) to uckpt, back to a
    TensorFlow prefix; every tensor (variables, Adam's slots, the iteration and step
    counters, the string and bfloat16 variables, the object graph) bit for bit."""
    assert_ok(cli("convert", run["dir"], tmp_path / "u"))
    with open_checkpoint(tmp_path / "u") as tree:
        assert tree.root["step"].dtype == "int64" and tree.root["step"].read() == 2
        assert tree.root["name"] == NAME
        assert tree.root["half"].dtype == "bfloat16" and tree.root["words"] == WORDS
        assert tree.root["optimizer"]["_iterations"].read() == 2
    assert_ok(cli("convert", tmp_path / "u", tmp_path / "out" / "ckpt", "--to", "tf"))
    assert sorted(os.listdir(tmp_path / "out")) == ["ckpt.data-00000-of-00001", "ckpt.index"]
    want = tensors(run["latest"])
    assert "_CHECKPOINTABLE_OBJECT_GRAPH" in want and len(want) > 15
    assert tensors(tmp_path / "out" / "ckpt") == want
    # a target is never replaced without --force; named by its .index file too
    with pytest.raises(CheckpointExistsError, match=r"ckpt\.index' already exists"):
        convert(tmp_path / "u", tmp_path / "out" / "ckpt", dst_format="tf")
    convert(run["latest"], tmp_path / "out" / "ckpt.index", force=True)
    assert tensors(tmp_path / "out" / "ckpt") == want
    assert not [n for n in os.listdir(tmp_path / "out") if "uckpt-tmp" in n]


def test_restore_of_the_round_trip_resumes_bitwise(run, tmp_path):
    """tf.train.Checkpoint.restore of TF -> uckpt -> TF into a fresh model and optimizer
    matches every object, and the next step's loss is the original's, bit for bit."""
    convert(run["latest"], tmp_path / "u")
    convert(tmp_path / "u", tmp_path / "back", dst_format="tf")
    model, opt = model_and_optimizer()
    ck = checkpoint(model, opt)
    ck.restore(str(tmp_path / "back")).assert_consumed()
    assert int(opt.iterations.numpy()) == 2 and ck.name.numpy() == NAME
    assert ck.half.numpy().tobytes() == HALF.tobytes() and ck.words.numpy().tolist() == WORDS
    assert train_step(model, opt).tobytes() == run["next_loss"].tobytes()


def test_manager_directory_means_its_latest(run):
    with open_checkpoint(run["dir"]) as tree:
        assert tree.root["save_counter"].read() == 2
    assert diff(run["dir"], run["latest"]).identical
    assert not diff(run["dir"], run["dir"] / "ckpt-1").identical


def test_tf_keras_save_weights_tf_format(tmp_path):
    """tf_keras save_weights in TF format (legacy Adam: slots under .OPTIMIZER_SLOT) reads
    with readable keys; written back, tf_keras load_weights reads it."""
    tk = pytest.importorskip("tf_keras")

    def build():
        tk.utils.set_random_seed(0)
        m = tk.Sequential([tk.layers.Dense(3, input_shape=(4,)), tk.layers.Dense(1)])
        m.compile(tk.optimizers.legacy.Adam(0.01), "mse")
        return m

    model = build()
    model.fit(X, Y, batch_size=8, epochs=1, verbose=0)
    model.save_weights(str(tmp_path / "w" / "weights"))
    with open_checkpoint(tmp_path / "w" / "weights") as tree:
        assert np.array_equal(tree.root["layer_with_weights-0"]["kernel"].read(),
                              model.layers[0].kernel.numpy())
        slot = tree.root["optimizer"][".OPTIMIZER_SLOT"]["m"]["layer_with_weights-0"]["kernel"]
        assert np.array_equal(slot.read(), model.optimizer.get_slot(
            model.layers[0].kernel, "m").numpy())
    convert(tmp_path / "w", tmp_path / "u")
    convert(tmp_path / "u", tmp_path / "out" / "w.index")
    fresh = build()
    fresh.load_weights(str(tmp_path / "out" / "w")).expect_partial()
    for a, b in zip(model.weights, fresh.weights):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes(), a.name


def test_a_tree_without_an_object_graph_restores_by_its_paths(tmp_path):
    """A uckpt checkpoint of plain arrays written as a TensorFlow checkpoint: the object
    graph is built from the paths, so restore() finds each variable by its path."""
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    uckpt.save(tmp_path / "plain", {"net": {"w": w}, "step": np.int64(9)})
    convert(tmp_path / "plain", tmp_path / "tf" / "ckpt", dst_format="tf")
    net = tf.train.Checkpoint(w=tf.Variable(np.zeros_like(w)))
    ck = tf.train.Checkpoint(net=net, step=tf.Variable(0, dtype=tf.int64))
    ck.read(str(tmp_path / "tf" / "ckpt")).assert_consumed()  # read: no save_counter
    assert np.array_equal(net.w.numpy(), w) and int(ck.step.numpy()) == 9


def test_written_in_parts_merged_into_shards(run, tmp_path, monkeypatch):
    """Tensors are written in parts of at most GROUP_BYTES (memory holds one part), merged
    into the shards of one prefix that TensorFlow reads and restores from."""
    from uckpt.conversion import tf_checkpoint

    monkeypatch.setattr(tf_checkpoint, "GROUP_BYTES", 100)
    convert(run["latest"], tmp_path / "out" / "ckpt", dst_format="tf")
    shards = [n for n in os.listdir(tmp_path / "out") if ".data-" in n]
    assert len(shards) > 5 and f"ckpt.data-00000-of-{len(shards):05d}" in shards
    assert tensors(tmp_path / "out" / "ckpt") == tensors(run["latest"])
    model, opt = model_and_optimizer()
    checkpoint(model, opt).restore(str(tmp_path / "out" / "ckpt")).assert_consumed()
    assert train_step(model, opt).tobytes() == run["next_loss"].tobytes()


def test_inspect_verify_diff_accept_a_prefix(run, tmp_path, capsys):
    """The commands' own code in this process (TensorFlow is imported once)."""
    convert(run["latest"], tmp_path / "u")
    assert main(["inspect", str(run["latest"])]) == 0
    out = capsys.readouterr().out
    assert "format       tf" in out and "optimizer/_iterations" in out
    assert main(["verify", str(run["dir"])]) == 0  # a CheckpointManager directory: its latest
    assert "OK: tf: 17 arrays" in capsys.readouterr().out  # string tensors are values
    assert main(["diff", str(run["latest"]), str(tmp_path / "u")]) == 0
    assert "identical" in capsys.readouterr().out


def test_refused_without_tensorflow(run, tmp_path):
    """TensorFlow that cannot be imported (a real ImportError): a uckpt error with the
    install hint, exit status 1, nothing written."""
    proc = cli_without(["tensorflow"], "convert", run["latest"], tmp_path / "u")
    assert_error(proc, "needs TensorFlow", "pip install tensorflow-cpu")
    assert os.listdir(tmp_path) == []


def copy_of(run, tmp_path):
    d = tmp_path / "c"
    d.mkdir()
    for name in os.listdir(run["dir"]):
        if name.startswith("ckpt-2"):
            (d / name).write_bytes((run["dir"] / name).read_bytes())
    return d / "ckpt-2"


def test_missing_index(run, tmp_path):
    prefix = copy_of(run, tmp_path)
    os.unlink(f"{prefix}.index")
    with pytest.raises(CorruptCheckpointError, match=r"ckpt-2\.index: missing.*no index"):
        convert(prefix, tmp_path / "u")
    assert not (tmp_path / "u").exists()


def test_truncated_data_shard(run, tmp_path):
    prefix = copy_of(run, tmp_path)
    os.truncate(f"{prefix}.data-00000-of-00001", 40)
    with pytest.raises(CorruptCheckpointError,
                       match=r"ckpt-2\.data-00000-of-00001: reading .* failed.*truncated"):
        convert(prefix, tmp_path / "u")
    assert not (tmp_path / "u").exists()


def test_missing_data_shard(run, tmp_path):
    prefix = copy_of(run, tmp_path)
    os.unlink(f"{prefix}.data-00000-of-00001")
    with pytest.raises(CorruptCheckpointError, match=r"data-00000-of-NNNNN: missing"):
        convert(prefix, tmp_path / "u")


def test_wrong_prefix_names_the_checkpoints_there(run, tmp_path):
    with pytest.raises(CheckpointNotFoundError, match=r"ckpt-9.*no ckpt-9\.index") as e:
        convert(run["dir"] / "ckpt-9", tmp_path / "u", src_format="tf")
    assert "ckpt-1, ckpt-2" in e.value.hint
    proc = cli("convert", run["dir"] / "ckpt", tmp_path / "u")
    assert_error(proc, "does not exist", "ckpt-1, ckpt-2")


def test_target_that_is_a_directory_is_refused(run, tmp_path):
    with pytest.raises(CheckpointExistsError, match="is a directory"):
        convert(run["latest"], tmp_path, dst_format="tf")
