"""Only committed checkpoints may be bases (docs/format.md section 11.4): a manifest whose base
names a sibling directory without a manifest (a save in progress, an interrupted one, a
stranger's directory) is refused, naming the base, and restore falls back."""
import os
import re
import shutil

import pytest

import uckpt
from uckpt import errors
from incremental_common import check, empty_state, manager, state


def chain(root, steps, **kw):
    with manager(root, incremental=True, **kw) as mgr:
        for s in steps:
            mgr.save(s, state(s))


def test_base_without_manifest_is_refused_and_restore_falls_back(tmp_path):
    chain(tmp_path, range(1, 5), full_every=2)  # 1 full, 2 -> 1, 3 full, 4 -> 3
    base = tmp_path / "step_00000003"
    assert uckpt.manifest(tmp_path / "step_00000004").bases.keys() == {base.name}
    os.rename(base / "manifest.json", tmp_path / "aside.json")  # its data files stay
    message = (rf"the base checkpoint '{re.escape(str(base))}' that the manifest refers to "
               r"is not committed: it has no manifest\.json")
    with pytest.raises(errors.CorruptCheckpointError, match=message):
        uckpt.load(tmp_path / "step_00000004")
    with pytest.raises(errors.CorruptCheckpointError, match=message):
        uckpt.verify(tmp_path / "step_00000004")
    with pytest.warns(RuntimeWarning, match="skipping checkpoint step 4"):
        got = manager(tmp_path).restore(out := empty_state())
    assert got == 2
    check(out, 2)


def test_a_strangers_directory_named_as_base_is_refused(tmp_path):
    """The base is a plain-named sibling holding the very bytes the chunks refer to, but
    it was never committed: it is refused all the same, before anything is read of it."""
    chain(tmp_path, [1, 2])
    shutil.copytree(tmp_path / "step_00000001", tmp_path / "copy")
    (tmp_path / "copy" / "manifest.json").unlink()
    os.rename(tmp_path / "step_00000001", tmp_path / "elsewhere")
    os.rename(tmp_path / "copy", tmp_path / "step_00000001")
    with pytest.raises(errors.CorruptCheckpointError, match=r"step_00000001' that the manifest "
                                                            r"refers to is not committed"):
        uckpt.load(tmp_path / "step_00000002")


def test_base_whose_manifest_is_a_symlink_is_refused(tmp_path):
    chain(tmp_path, [1, 2])
    base = tmp_path / "step_00000001"
    os.rename(base / "manifest.json", tmp_path / "real.json")
    os.symlink(tmp_path / "real.json", base / "manifest.json")
    with pytest.raises(errors.CorruptCheckpointError,
                       match=r"is not committed: manifest .*manifest\.json' is a symbolic link"):
        uckpt.load(tmp_path / "step_00000002")
