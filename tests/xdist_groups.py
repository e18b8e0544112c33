"""A pytest plugin (loaded by tests/conftest.py) that keeps ``--dist loadgroup`` working:
tests marked ``@pytest.mark.xdist_group("name")`` run on one worker.

pytest-xdist 3.8 tells its scheduler a test's group by appending ``@name`` to the test's
node id on the worker (``item._nodeid = ...``). pytest 9.2 keeps node ids in a structured
``item._id`` and ignores ``_nodeid``, so the suffix is lost and every grouped test is
scheduled on its own (pytest-xdist issue 1386): a module-scoped launch of several ranks
(tests/test_horovod_tf.py) ran once per worker, each time the whole of it. Where the
suffix is missing after xdist's hook, this plugin sets it on the structured id the way
xdist does on older pytest; where xdist's own one took effect, it does nothing.

It also hands out the modules with a ``slow`` test before the others. xdist orders its
work units by their number of tests (groups first), then in collection order (by file
name), and gives a worker its next unit when it has two or fewer left: a slow test late
in the alphabet (seconds to a minute) could start when the other worker had little left,
which then idled to the end. Slow modules first, the last units are quick tests and both
workers end together. Each module stays in one piece, in its own order (a module-scoped
fixture is made once per worker, as before).
"""
from __future__ import annotations

import pytest


def group_of(item: pytest.Item) -> str | None:
    """The group name xdist gives ``item`` (its ``xdist_group`` marks), or None."""
    names = {str(m.args[0] if m.args else m.kwargs.get("name", "default"))
             for m in item.iter_markers("xdist_group")}
    return "_".join(sorted(names)) if names else None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    if not getattr(config.option, "loadgroup", False):  # set on xdist's workers only
        return
    slow_modules_first(items)
    for item in items:
        group = group_of(item)
        if group is None or item.nodeid.endswith(f"@{group}"):
            continue
        from _pytest.nodeid import NodeId  # pytest >= 9.2, where the suffix was lost

        item._id = NodeId.parse(f"{item.nodeid}@{group}")
        if not item.nodeid.endswith(f"@{group}"):
            raise pytest.UsageError(f"cannot put {item.nodeid} in xdist group {group!r} on "
                                    f"pytest {pytest.__version__}: see tests/xdist_groups.py")


def slow_modules_first(items: list) -> None:
    """Reorder ``items`` in place: the modules holding a test marked ``slow`` (by
    tests/conftest.py, which runs before this plugin's hook) first; a stable sort, so every
    module keeps its place among its kind and its tests their order."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)
