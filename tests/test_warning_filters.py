"""pyproject.toml's pytest ``filterwarnings`` hide the deprecation warnings third-party
packages raise in their own code, and never a warning of uckpt, its adapters or the tests."""
import tomllib
import warnings
from pathlib import Path

import pytest
from _pytest.config import parse_warning_filter

REPO = Path(__file__).resolve().parent.parent
FILTERS = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"][
    "ini_options"].get("filterwarnings", [])


def shown(category, module, message="a warning"):
    """Whether a warning of ``category`` issued in ``module`` passes the configured filters."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for spec in FILTERS:
            warnings.filterwarnings(*parse_warning_filter(spec, escape=False))
        warnings.warn_explicit(message, category, f"{module.replace('.', '/')}.py", 1,
                               module=module, registry={})
    return len(caught) == 1


@pytest.mark.parametrize("module", ["tensorflow.python.util.deprecation", "keras.src.ops",
                                    "tf_keras.src.engine", "chainer.functions.array",
                                    "torch.serialization", "horovod.common.util",
                                    "jax._src.numpy", "google.protobuf.internal.builder",
                                    "lightning.pytorch.trainer", "transformers.modeling_utils"])
@pytest.mark.parametrize("category", [DeprecationWarning, PendingDeprecationWarning,
                                      FutureWarning])
def test_third_party_deprecations_are_filtered(module, category):
    assert not shown(category, module)


@pytest.mark.parametrize("module", ["uckpt", "uckpt.conversion.npz", "uckpt_tf.keras",
                                    "uckpt_torch", "uckpt_chainer.compat", "test_cli",
                                    "__main__", "torchlike", "kerasx"])
@pytest.mark.parametrize("category", [DeprecationWarning, FutureWarning, UserWarning])
def test_uckpt_and_test_warnings_stay_visible(module, category):
    assert shown(category, module)


def test_third_party_user_warnings_stay_visible():
    """Only deprecations are filtered: a framework's other warnings may matter to a user."""
    assert shown(UserWarning, "torch.serialization")
    assert shown(RuntimeWarning, "tensorflow.python.framework")


def test_chainers_pkg_resources_notice_is_filtered_by_its_message():
    notice = "pkg_resources is deprecated as an API. See https://setuptools.pypa.io/"
    assert not shown(UserWarning, "chainer._environment_check", notice)
    assert shown(UserWarning, "uckpt_chainer.compat", notice)
    assert shown(UserWarning, "chainer._environment_check")
