""".keras archives, .weights.h5 and legacy .h5 files of keras.applications models (weights=None,
small inputs) through `uckpt convert` both ways (issue 14): Keras' own loaders accept every
result, with the same weights bit for bit."""
import warnings
import zipfile

import numpy as np
import pytest

keras = pytest.importorskip("keras")

from convert_common import assert_error, assert_ok, cli  # noqa: E402
from uckpt.conversion import convert, diff, open_checkpoint  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::uckpt.conversion.ConvertWarning",
                                        "ignore::UserWarning")


def mobilenet():
    return keras.applications.MobileNetV2(weights=None, input_shape=(32, 32, 3), alpha=0.35,
                                          classes=10)


def efficientnet():
    return keras.applications.EfficientNetB0(weights=None, input_shape=(32, 32, 3), classes=10)


def resnet():
    return keras.applications.ResNet50(weights=None, input_shape=(32, 32, 3), classes=10)


MODELS = [pytest.param(mobilenet, id="MobileNetV2"),
          pytest.param(efficientnet, id="EfficientNetB0"),
          pytest.param(resnet, id="ResNet50", marks=pytest.mark.slow)]


def randomized(build):
    """A model whose every weight (moving statistics included) is random, so nothing that
    is left at its initial value could pass for converted."""
    keras.utils.set_random_seed(1)
    model = build()
    rng = np.random.default_rng(0)
    for w in model.weights:
        w.assign(rng.standard_normal(w.shape).astype(w.dtype))
    return model


def assert_same_weights(a, b):
    assert len(a.weights) == len(b.weights)
    for x, y in zip(a.weights, b.weights):
        assert np.array_equal(np.asarray(x), np.asarray(y)), x.path


@pytest.mark.parametrize("build", MODELS)
def test_keras_archive_both_ways(tmp_path, build):
    """.keras -> uckpt -> .keras: load_model gives the same model (config and metadata kept);
    .keras -> .weights.h5 -> load_weights; .weights.h5 -> .keras (weights and metadata only)
    -> load_weights."""
    model = randomized(build)
    model.save(tmp_path / "m.keras")
    convert(tmp_path / "m.keras", tmp_path / "mid")
    convert(tmp_path / "mid", tmp_path / "back.keras")
    assert diff(tmp_path / "m.keras", tmp_path / "back.keras").identical
    with zipfile.ZipFile(tmp_path / "m.keras") as a, zipfile.ZipFile(tmp_path / "back.keras") as b:
        assert a.read("config.json") == b.read("config.json")
        assert a.read("metadata.json") == b.read("metadata.json")
    assert_same_weights(model, keras.saving.load_model(tmp_path / "back.keras"))

    convert(tmp_path / "m.keras", tmp_path / "w.weights.h5")
    again = build()
    again.load_weights(tmp_path / "w.weights.h5")
    assert_same_weights(model, again)

    model.save_weights(tmp_path / "own.weights.h5")
    convert(tmp_path / "own.weights.h5", tmp_path / "out" / "m.keras")
    assert zipfile.is_zipfile(tmp_path / "out" / "m.keras")
    again = build()
    again.load_weights(tmp_path / "out" / "m.keras")
    assert_same_weights(model, again)


@pytest.mark.parametrize("build", MODELS[:1])
def test_legacy_h5_both_ways(tmp_path, build):
    """model.save("m.h5") (legacy HDF5) -> uckpt -> NPZ -> .h5: load_model accepts it."""
    model = randomized(build)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save(tmp_path / "m.h5")
    convert(tmp_path / "m.h5", tmp_path / "mid")
    convert(tmp_path / "mid", tmp_path / "mid.npz")
    convert(tmp_path / "mid.npz", tmp_path / "back.h5")
    assert diff(tmp_path / "m.h5", tmp_path / "back.h5").identical
    assert_same_weights(model, keras.models.load_model(tmp_path / "back.h5", compile=False))


def test_cli_targets_by_name(tmp_path):
    """`uckpt convert m.weights.h5 out/m.keras` writes a real .keras archive; an unknown
    suffix is refused asking for --to; a trailing slash or --to uckpt makes a directory;
    compressed HDF5 and NPZ targets read back identical."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(2)])
    model.save_weights(tmp_path / "m.weights.h5")
    assert_ok(cli("convert", tmp_path / "m.weights.h5", tmp_path / "out" / "m.keras"))
    with zipfile.ZipFile(tmp_path / "out" / "m.keras") as z:
        assert "model.weights.h5" in z.namelist()
    proc = cli("convert", tmp_path / "m.weights.h5", tmp_path / "ck.pth.tar")
    assert_error(proc, "'.tar'", "--to")
    assert not (tmp_path / "ck.pth.tar").exists()
    assert_ok(cli("convert", tmp_path / "m.weights.h5", str(tmp_path / "ck.d") + "/"))
    assert (tmp_path / "ck.d" / "manifest.json").is_file()
    assert_ok(cli("convert", tmp_path / "m.weights.h5", tmp_path / "ck.v", "--to", "uckpt"))
    assert (tmp_path / "ck.v" / "manifest.json").is_file()
    assert_ok(cli("convert", tmp_path / "m.weights.h5", tmp_path / "z.weights.h5", "--compress"))
    assert_ok(cli("convert", tmp_path / "m.weights.h5", tmp_path / "z.npz", "--compress"))
    for out in ("z.weights.h5", "z.npz"):
        assert diff(tmp_path / "m.weights.h5", tmp_path / out).identical
    with zipfile.ZipFile(tmp_path / "z.npz") as z:
        assert {i.compress_type for i in z.infolist()} == {zipfile.ZIP_DEFLATED}
    assert_error(cli("convert", tmp_path / "m.weights.h5", tmp_path / "z.pt", "--compress"),
                 "cannot be compressed")
    with open_checkpoint(tmp_path / "out" / "m.keras") as tree:
        assert tree.format == "keras"


def _legacy_h5(path, maker):
    """A small functional model saved by ``maker``'s ``model.save(path)`` (legacy HDF5;
    not compiled: a legacy file's optimizer weights change nothing here, and fit costs)."""
    if maker == "tf_keras":
        lib = pytest.importorskip("tf_keras")
    else:
        lib = keras
    lib.utils.set_random_seed(0)
    inputs = lib.Input((3,))
    hidden = lib.layers.BatchNormalization()(lib.layers.Dense(4)(inputs))
    model = lib.Model(inputs, lib.layers.Dense(2)(hidden))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "HDF5 ... is considered legacy"
        model.save(path)
    return model


@pytest.mark.parametrize("maker", ["keras", "tf_keras"])
def test_legacy_h5_to_keras_refused(tmp_path, maker):
    """A legacy .h5 (Keras 3's or tf_keras's model.save) cannot become a .keras archive or a
    .weights.h5 file without Keras (its weights are named by layer, its config is in the
    legacy form): refused, directly and through a uckpt checkpoint, with the Keras call that
    does it; that call works. (Issue 30 §2: the archive was written, and no loader took it.)"""
    _legacy_h5(tmp_path / "m.h5", maker)
    assert_error(cli("convert", tmp_path / "m.h5", tmp_path / "m.keras"),
                 "legacy Keras HDF5 file", "keras.models.load_model('m.h5')")
    assert not (tmp_path / "m.keras").exists()
    from uckpt.conversion import KerasLayoutError

    with pytest.raises(KerasLayoutError, match="cannot become a .weights.h5 file"):
        convert(tmp_path / "m.h5", tmp_path / "m.weights.h5")
    convert(tmp_path / "m.h5", tmp_path / "mid")
    with pytest.raises(KerasLayoutError, match="cannot become a .keras archive without Keras"):
        convert(tmp_path / "mid", tmp_path / "m.keras")
    assert not (tmp_path / "m.keras").exists()
    if maker == "keras":  # the hint's remedy
        keras.models.load_model(tmp_path / "m.h5").save(tmp_path / "m.keras")
        assert_same_weights(keras.models.load_model(tmp_path / "m.h5"),
                            keras.models.load_model(tmp_path / "m.keras"))


def test_keras_weights_need_a_weights_h5_name(tmp_path):
    """A Keras model's weights (a live checkpoint, or Keras's own .weights.h5) to `x.h5`:
    refused, naming the rule and `x.weights.h5` (Keras 3's load_weights reads `x.h5` as a
    legacy file and finds 0 layers: issue 30 §2); the name it gives works."""
    import uckpt

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse")
    uckpt.save(tmp_path / "live", {"model": model})
    model.save_weights(tmp_path / "k.weights.h5")
    assert_error(cli("convert", tmp_path / "k.weights.h5", tmp_path / "z.hdf5"),
                 "*.weights.h5", "'z.weights.h5'")
    assert not (tmp_path / "z.hdf5").exists()
    from uckpt.conversion import KerasLayoutError

    with pytest.raises(KerasLayoutError, match=r"reads them only from a file named "
                                               r"\*\.weights\.h5") as e:
        convert(tmp_path / "live", tmp_path / "x.h5")
    assert e.value.hint == "name the target 'x.weights.h5'"
    assert not (tmp_path / "x.h5").exists()
    convert(tmp_path / "live", tmp_path / "x.weights.h5")
    again = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(2)])
    again.load_weights(tmp_path / "x.weights.h5")
    assert_same_weights(model, again)


def test_killed_keras_read_leaves_no_temporary_file(tmp_path):
    """A process reading a .keras archive, SIGKILLed while it holds the weights copied out
    of the zip, leaves nothing in its temporary directory (issue 30 §3: a
    /tmp/uckpt-keras-*.weights.h5 stayed behind). The kill comes at a known point: the
    child reads the archive with hdf5.read wrapped to say so and wait, the tree open."""
    import os
    import signal
    import subprocess
    import sys

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4)])
    model.save(tmp_path / "m.keras")
    temp = tmp_path / "tmp"
    temp.mkdir()
    code = """
import sys, time
import uckpt.conversion.hdf5 as hdf5
from uckpt.conversion import open_checkpoint
real = hdf5.read
def holding(*args, **kwargs):
    tree = real(*args, **kwargs)
    print("holding", flush=True)
    time.sleep(300)
hdf5.read = holding
with open_checkpoint(sys.argv[1]) as tree:
    pass
"""
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "m.keras")],
                            stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, TMPDIR=str(temp)))
    try:
        assert proc.stdout.readline() == "holding\n"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert sorted(os.listdir(temp)) == []
