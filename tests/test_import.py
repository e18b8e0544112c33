"""Invariant 1: `import uckpt` imports no deep-learning framework; and it stays fast: it
imports only what defines its light names, the rest on first use."""
import json
import subprocess
import sys

import pytest

FRAMEWORKS = ["torch", "tensorflow", "keras", "chainer", "jax", "cupy", "mpi4py", "horovod"]


def test_import_uckpt_pulls_in_no_framework():
    code = ("import sys, json, uckpt, uckpt.cli.main; "
            f"print(json.dumps(sorted(set({FRAMEWORKS!r}) & set(sys.modules))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_saving_numpy_state_imports_no_framework(tmp_path):
    code = ("import sys, json, numpy as np, uckpt; "
            f"uckpt.save({str(tmp_path / 'c')!r}, {{'a': np.ones(3), 'rng': uckpt.RandomState()}}); "
            f"uckpt.load({str(tmp_path / 'c')!r}); "
            f"print(json.dumps(sorted(set({FRAMEWORKS!r}) & set(sys.modules))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_import_uckpt_leaves_slow_standard_modules_for_first_use():
    """`import uckpt` stays fast: ``importlib.metadata`` (about 10-20 ms) is imported when
    adapters' entry points are first looked up, not before; and with crc32c-rs installed
    the ``crc32c`` package, which imports it, is not imported at all."""
    code = ("import sys, json, uckpt, uckpt.codecs.checksum; "
            "print(json.dumps(['importlib.metadata' in sys.modules, 'crc32c' in sys.modules, "
            "uckpt.codecs.checksum.BACKEND]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    metadata, reference, backend = json.loads(out.stdout.strip().splitlines()[-1])
    assert not metadata
    assert reference == (backend == "crc32c")


def _new_modules(code: str) -> list:
    """The modules ``code`` imports beyond ``import numpy`` (run in a fresh process)."""
    code = ("import sys, json, numpy as np; before = set(sys.modules); " + code +
            "; print(json.dumps(sorted(set(sys.modules) - before)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _hits(modules: list, groups: list) -> list:
    return [m for m in modules if any(m == g or m.startswith(g + ".") for g in groups)]


#: what a NumPy save and load never needs: the manager, levels, other stores, conversion,
#: the CLI, and standard modules used only by them or by failures
NOT_FOR_SAVE = ["uckpt.manager", "uckpt.levels", "uckpt.conversion", "uckpt.cli",
                "uckpt.storage.s3", "uckpt.storage.s3_core", "uckpt.storage.s3_read",
                "uckpt.storage.s3_write", "uckpt.storage.blob.fsspec_store",
                "uckpt.storage.blob.s3",
                "decimal", "fractions", "statistics", "difflib", "secrets", "socket", "selectors"]


def test_import_uckpt_imports_only_what_defines_its_light_names():
    """`import uckpt` stays fast: the saving engine, loading, storage, the manager,
    levels, formats, conversion and the CLI are imported on first use of a name."""
    heavy = ["uckpt.api", "uckpt.saving", "uckpt.loading", "uckpt.storage", "uckpt.format",
             "uckpt.codecs", "uckpt.registry", "uckpt.rng", *NOT_FOR_SAVE]
    assert _hits(_new_modules("import uckpt"), heavy) == []


def test_numpy_save_and_load_import_no_manager_levels_or_rare_modules(tmp_path):
    where = str(tmp_path / "c")
    found = _new_modules(f"import uckpt; uckpt.save({where!r}, {{'a': np.ones(3)}}); "
                         f"assert uckpt.load({where!r})['a'].tolist() == [1.0, 1.0, 1.0]")
    assert _hits(found, NOT_FOR_SAVE) == []


def test_every_public_name_resolves_on_first_use():
    import importlib

    import uckpt
    from uckpt import CheckpointManager, KeepLast, policies, save  # noqa: F401

    assert set(uckpt.__all__) <= set(dir(uckpt))
    assert uckpt.CheckpointManager is importlib.import_module(
        "uckpt.manager.checkpoint_manager").CheckpointManager
    assert uckpt.policies is importlib.import_module("uckpt.manager.policies")
    assert uckpt.open is importlib.import_module("uckpt.loading.lazy").open_checkpoint
    for name in uckpt.__all__:
        assert getattr(uckpt, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        uckpt.nope  # noqa: B018
