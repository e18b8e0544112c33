"""What the package declares is true: its license file, the Python versions it supports."""
import re
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

REPO = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def python_set_up():
    """The Python version scripts/setup.sh builds the environment with (and CI tests)."""
    found = re.search(r'"\$version" != "(\d+\.\d+)"', (REPO / "scripts/setup.sh").read_text())
    assert found, "scripts/setup.sh no longer names the Python version it sets up"
    return found.group(1)


def test_license_file_is_the_declared_license():
    assert PROJECT["license"] == "Apache-2.0"
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_the_tests_run_on_the_python_that_setup_provides():
    assert "%d.%d" % sys.version_info[:2] == python_set_up()
    assert SpecifierSet(PROJECT["requires-python"]).contains(python_set_up())


def test_requires_python_admits_no_untested_older_python():
    major, minor = map(int, python_set_up().split("."))
    older = f"{major}.{minor - 1}"
    assert not SpecifierSet(PROJECT["requires-python"]).contains(older)
