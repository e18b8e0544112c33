"""The import graph inside ``src/uckpt`` and inside each adapter package has no circles.

Every import counts, including those inside functions (which hide a circle at import
time but still tie the modules together); only ``if TYPE_CHECKING:`` blocks are left
out. A failure names each circle, module by module.
"""
import ast
from pathlib import Path
from typing import Dict, List, Set

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = [("uckpt", REPO / "src" / "uckpt"),
            ("uckpt_torch", REPO / "adapters" / "uckpt_torch"),
            ("uckpt_tf", REPO / "adapters" / "uckpt_tf"),
            ("uckpt_chainer", REPO / "adapters" / "uckpt_chainer"),
            ("uckpt_jax", REPO / "adapters" / "uckpt_jax")]


def modules(package: str, root: Path) -> Dict[str, Path]:
    """Dotted module name -> file, for every module of a package."""
    out = {}
    for f in sorted(root.rglob("*.py")):
        parts = list(f.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join([package] + parts)] = f
    return out


def _type_checking_only(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _imports(tree: ast.AST):
    stack = [tree]
    while stack:
        node = stack.pop()
        if _type_checking_only(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def imported(name: str, path: Path, known: Dict[str, Path]) -> Set[str]:
    """The modules of ``known`` that module ``name`` (file ``path``) imports."""
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out: Set[str] = set()

    def add(dotted: str) -> None:
        parts = dotted.split(".")
        while parts and ".".join(parts) not in known:
            parts.pop()
        if parts:
            out.add(".".join(parts))

    for node in _imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
            continue
        base = node.module or ""
        if node.level:
            base = ".".join(here[:len(here) - node.level + 1] + ([base] if base else []))
        for alias in node.names:  # `from pkg import submodule` imports the submodule
            full = f"{base}.{alias.name}"
            add(full if full in known else base)
    out.discard(name)
    return out


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components with more than one module (Tarjan), each as
    one circle through it, sorted."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(_circle(graph, set(component)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _circle(graph: Dict[str, Set[str]], component: Set[str]) -> List[str]:
    """One shortest circle through the smallest module of ``component`` (breadth first)."""
    start = min(component)
    previous = {start: None}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v] & component):
            if w == start:
                path = [v]
                while previous[path[-1]] is not None:
                    path.append(previous[path[-1]])
                return list(reversed(path)) + [start]
            if w not in previous:
                previous[w] = v
                queue.append(w)
    return sorted(component)


def graph_of(package: str, root: Path) -> Dict[str, Set[str]]:
    known = modules(package, root)
    return {name: imported(name, path, known) for name, path in known.items()}


@pytest.mark.parametrize("package,root", PACKAGES, ids=[p for p, _ in PACKAGES])
def test_no_import_circles(package, root):
    found = cycles(graph_of(package, root))
    assert not found, f"{package}: import circles (function-level imports included):\n" + \
        "\n".join("  " + " -> ".join(c) for c in found)


def test_the_checker_finds_a_circle_through_a_function_level_import(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from .c import g\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nimport pkg.a as a\n"
                              "if TYPE_CHECKING:\n    from . import d\n")
    (pkg / "d.py").write_text("from .c import x\n")
    assert cycles(graph_of("pkg", pkg)) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]
