"""The layout of src/uckpt (docs/architecture.md, "Layers"): a module imports from its own
package and from the layers below it, never from a layer above (a save goes down the
layers and does not climb back up)."""
import ast
from pathlib import Path

import uckpt

#: bottom to top; a name is a subpackage or a top-level module of uckpt
LAYERS = [
    ["errors", "knobs", "_version"],
    ["runtime"],
    ["codecs"],
    ["options", "dtypes", "adapter"],
    ["format"],
    ["storage"],
    ["comm"],
    ["levels"],
    ["plugins", "rng", "builtin_adapters", "registry"],
    ["tree"],
    ["loading"],
    ["saving"],
    ["manager"],
    ["conversion", "testing", "api"],
    ["cli", "torch", "keras", "chainer", "lightning", "horovod", "__init__", "__main__"],
]
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}
ROOT = Path(uckpt.__file__).parent


def _imports(path: Path, package: str):
    """The uckpt modules that the file at ``path`` (in ``package``) imports."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.split(".")[0] == "uckpt")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base.split(".")[0] == "uckpt":
                yield from (f"{base}.{a.name}" for a in node.names)


def _unit(module: str) -> str:
    """The layer's name for a module path: its subpackage, or the top-level module."""
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def test_every_module_has_a_layer_and_no_import_climbs_up():
    units, climbs = set(), []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        module = ".".join(rel.parts)
        package = module.rsplit(".", 1)[0] if path.name != "__init__.py" else module[:-9]
        units.add(_unit(module.removesuffix(".__init__")))
        for target in _imports(path, package):
            if _unit(target) in RANK and RANK[_unit(target)] > RANK[_unit(module)]:
                climbs.append(f"{module} imports {target}")
    assert sorted(units - set(RANK)) == [], "a module or package outside every layer"
    assert climbs == []
