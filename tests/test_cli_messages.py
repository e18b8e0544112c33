"""What the ``uckpt`` command says when it is used the wrong way: each message names what
is wrong and a remedy that exists on that command (issue 30, "a newcomer's first hour")."""
import re
import zipfile
from pathlib import Path

import numpy as np
import pytest

import uckpt
from uckpt.cli.main import build_parser
from uckpt.conversion import detect
from test_cli import assert_error, run_cli

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def manager_root(tmp_path):
    root = tmp_path / "root"
    with uckpt.CheckpointManager(root) as manager:
        for step in (1, 2):
            manager.save(step, {"a": np.arange(3)})
    return root


@pytest.mark.parametrize("command", ["verify", "inspect"])
def test_manager_root_named_as_a_checkpoint(manager_root, command):
    """A manager's root is not "an interrupted save": the message says what it is, and the
    hint names `uckpt ls` and `verify --all` on that root."""
    proc = run_cli(command, manager_root)
    assert_error(proc, f"'{manager_root}' is a root of checkpoints (2 committed: step_00000001, "
                 "step_00000002), not one checkpoint", f"uckpt ls {manager_root}",
                 f"uckpt verify --all {manager_root}", str(manager_root / "step_00000002"))
    assert "interrupted" not in proc.stderr


def test_directory_where_a_file_format_is_named(tmp_path):
    """A directory read as a file format: no word of blocking, the directory formats named."""
    (tmp_path / "d").mkdir()
    proc = run_cli("convert", tmp_path / "d", tmp_path / "out.npz", "--from", "npz")
    assert_error(proc, "d is a directory, not a file",
                 "hint: the directory formats are uckpt, dcp, hf, tf, deepspeed and orbax: "
                 "leave out")
    assert "block" not in proc.stderr


def test_bad_duration_hint_on_its_own_line():
    proc = run_cli("advise", "root", "--mtbf", "soon")
    assert proc.returncode == 2
    assert "cannot read 'soon' as a duration\n  hint: write a positive number" in proc.stderr
    assert "durationhint" not in proc.stderr and "duration hint" not in proc.stderr


@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_zip_without_arrays_read_as_npz_fails(tmp_path, command):
    """A zip archive none of whose members is an array is not an empty NPZ: refused, naming
    why, instead of exit 0 with 0 leaves."""
    path = tmp_path / "model.pt"
    with zipfile.ZipFile(path, "w") as z:  # the member layout of a torch.save file
        z.writestr("model/data.pkl", b"\x80\x02}q\x00.")
        z.writestr("model/version", b"3\n")
    proc = run_cli(command, path, "--from", "npz")
    assert_error(proc, "model.pt is a zip archive but not an NPZ: none of its 2 members is a "
                 ".npy array (the first is 'model/data.pkl')", "--from pickle")
    empty = tmp_path / "empty.npz"
    np.savez(empty)  # an NPZ of no arrays is still one
    assert run_cli(command, empty).returncode == 0


def test_source_hints_name_no_target_option(tmp_path):
    """inspect, verify and diff have no --to: their hints name the options they have."""
    unknown = tmp_path / "notes.txt"
    unknown.write_text("not a checkpoint")
    for args in (["inspect", unknown], ["verify", unknown]):
        proc = run_cli(*args)
        assert_error(proc, "cannot tell the format", "name one with --from")
        assert "--to" not in proc.stderr
    proc = run_cli("diff", unknown, unknown)
    assert proc.returncode == 2 and "--format-a / --format-b" in proc.stderr
    assert "--to" not in proc.stderr


def test_diff_help_names_every_format():
    proc = run_cli("diff", "--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    listed = re.search(r"of different formats \(([^;]*);", text).group(1)
    assert listed.split(", ") == list(detect.FORMATS)
    assert "keras" in listed and "hf" in listed


def test_install_hints_are_quoted_for_zsh():
    """`pip install uckpt[convert]` unquoted is a glob in zsh ("no matches found"): every
    message and document quotes the requirement."""
    unquoted = re.compile(r"pip install (?!['\"])[\w.-]+\[")
    found = [f"{p.relative_to(REPO)}:{n}" for p in
             [REPO / "README.md", *(REPO / "docs").rglob("*.md"), *(REPO / "src").rglob("*.py"),
              *(REPO / "adapters").rglob("*.py"), *(REPO / "scripts").glob("*.sh")]
             for n, line in enumerate(p.read_text().splitlines(), 1) if unquoted.search(line)]
    assert found == []
    from uckpt.conversion.errors import INSTALL_HINT
    assert INSTALL_HINT == "pip install 'uckpt[convert]'"


def test_readme_command_list_names_every_subcommand():
    """The README's command line section shows every subcommand the parser has."""
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    commands = set(sub.choices)
    section = (REPO / "README.md").read_text().split("\n## Command line\n")[1].split("\n## ")[0]
    shown = set(re.findall(r"^uckpt (\w+)", section, re.M))
    assert commands <= shown, sorted(commands - shown)
    assert shown <= commands, sorted(shown - commands)
