"""The tree is the map: the package's import graph has no circle and no import up its layers,
and every package's `__init__` names each of its modules (docs/design.md maps the root)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import gridrun

PACKAGE = Path(gridrun.__file__).parent
ROOT = PACKAGE.parent

# Bottom to top: a module imports only from its own layer or those below (lazy imports inside
# functions included). The published architectures (JSON) check the seam's model node; the seam is what both halves share; the training half sits below the
# run entry; the grid never reaches the trainer (tests/test_seam.py); the analysis reads what
# the grid wrote; the command line and the results API sit on top.
LAYERS = (
    ("arch",),
    ("seam",),
    ("arch", "engine_params", "workflows", "tasks", "modelfiles", "adapters", "export", "memory"),
    ("train",),
    ("toy",),
    ("cellrun",),
    ("grid",),
    ("analysis",),
    ("cli", "results"),
)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports() -> dict[str, set[str]]:
    """Module -> the gridrun modules it imports, anywhere in its code."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + [base]).strip(".")
                targets = [f"{base}.{a.name}" for a in node.names] + [base]
            else:
                continue
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target.startswith("gridrun.") and target != name:
                    found.add(target)
        graph[name] = found
    return graph


def layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else ""
    return next((i for i, names in enumerate(LAYERS) if top in names), -1)


def test_every_module_has_a_layer() -> None:
    assert sorted(m for m in imports() if m != "gridrun" and layer(m) < 0) == []


def test_no_import_runs_up_the_layers() -> None:
    up = sorted(f"{a} -> {b}" for a, targets in imports().items() for b in targets
                if b != "gridrun" and layer(b) > layer(a))
    assert up == []


def test_the_import_graph_has_no_circle() -> None:
    graph = imports()
    # Packages' own __init__ re-exports aside, a circle is a module reachable from itself.
    circles = []
    for start in graph:
        seen, stack = set(), [*graph[start]]
        while stack:
            node = stack.pop()
            if node == start:
                circles.append(start)
                break
            if node not in seen:
                seen.add(node)
                stack.extend(graph.get(node, ()))
    assert circles == []


def test_every_package_init_names_each_of_its_modules() -> None:
    unnamed = []
    for init in PACKAGE.rglob("__init__.py"):
        folder = init.parent
        if folder == PACKAGE:
            continue  # the root's map is docs/design.md (below)
        docstring = ast.get_docstring(ast.parse(init.read_text())) or ""
        for child in sorted(folder.iterdir()):
            if child.suffix == ".py" and child.name != "__init__.py" and child.name not in docstring:
                unnamed.append(str(child.relative_to(ROOT)))
            if (child / "__init__.py").is_file() and f"{child.name}/" not in docstring:
                unnamed.append(f"{child.relative_to(ROOT)}/")
    assert unnamed == []


def test_the_design_map_names_each_root_module_and_package() -> None:
    design = (ROOT / "docs" / "design.md").read_text()
    package_map = design.split("## Package map", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"[\w.]+(?:\.py|/)", package_map))
    missing = [child.name + ("/" if child.is_dir() else "") for child in sorted(PACKAGE.iterdir())
               if (child.suffix == ".py" and child.name != "__init__.py" and child.name not in named)
               or ((child / "__init__.py").is_file() and f"{child.name}/" not in named)]
    assert missing == []


def test_every_file_of_the_package_ships_in_its_wheel() -> None:
    """What the package reads, it ships: a file under gridrun/ that is not Python (an
    architecture, the measured rates, a config, a sweep, the node script, the toy world) is
    matched by pyproject.toml's package-data, or a wheel lacks what the checkout has."""
    import tomllib

    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    shipped = {path for package, patterns in package_data.items() for pattern in patterns
               for path in (ROOT / package.replace(".", "/")).glob(pattern)}
    files = {path for path in PACKAGE.rglob("*")
             if path.is_file() and path.suffix not in (".py", ".pyc") and "__pycache__" not in path.parts}
    assert sorted(str(path.relative_to(ROOT)) for path in files - shipped) == []
