"""The seam between the halves: only run directories cross it, and the torch-free modules
beside `rundir.py` that own it (the run schema, the cell state, what an accuracy and a peak
are, the mechanism alerts)."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import gridrun
from gridrun.cli import TRAIN_STACK


def modules(package: str) -> list[str]:
    module = __import__(package, fromlist=["_"])
    return [package] + [m.name for m in pkgutil.walk_packages(module.__path__, prefix=f"{package}.")]


def imported_after(names: list[str]) -> set[str]:
    code = (
        "import importlib, sys\n"
        f"for name in {names!r}: importlib.import_module(name)\n"
        "print('\\n'.join(sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return set(out.split())


def test_grid_never_imports_torch() -> None:
    # Nor the rest of the training stack: `pip install gridrun` (no extras) installs none of it,
    # and a login node plans, submits and collects without it (scripts/check_wheel_install.sh).
    loaded = imported_after(modules("gridrun.grid") + modules("gridrun.analysis") + ["gridrun.cli"])
    assert not {m for m in loaded if m.split(".")[0] in TRAIN_STACK}


def test_grid_takes_the_run_schema_from_the_seam_module_only() -> None:
    # The schema once lived in gridrun/train/config.py, which pulled the training package
    # into every grid command; now no grid module loads anything under gridrun.train.
    loaded = imported_after(modules("gridrun.grid") + modules("gridrun.analysis") + ["gridrun.cli"])
    assert "gridrun.seam.runconfig" in loaded
    assert not {m for m in loaded if m.startswith("gridrun.train")}


def test_seam_modules_import_only_the_standard_library() -> None:
    # Every module of the seam package, read from the package itself: a module added there is
    # held to the rule without an edit here.
    seam = modules("gridrun.seam")
    assert len(seam) > 1
    loaded = imported_after(seam)
    assert {m for m in loaded if m.startswith("gridrun.")} == set(seam)
    assert not {m for m in loaded if m.split(".")[0] in ("torch", "hydra", "omegaconf", "yaml", "numpy")}


def test_train_never_imports_hydra_or_the_grid() -> None:
    loaded = imported_after([m for m in modules("gridrun.train") if not m.endswith(".vllm")])
    assert not {m for m in loaded if m.split(".")[0] in ("hydra", "omegaconf") or m.startswith("gridrun.grid")}


def test_train_never_imports_the_toy_world() -> None:
    # The toy world's build uses the trainer's parts (toy -> train); the trainer is handed the
    # toy world's directory by the run entry (gridrun/cellrun.py), so train -> toy would be a cycle.
    loaded = imported_after([m for m in modules("gridrun.train") if not m.endswith(".vllm")])
    assert not {m for m in loaded if m.startswith("gridrun.toy")}
    # ... nor inside a function, where importing the modules would not show it.
    lazy = []
    for path in Path(gridrun.__file__).parent.joinpath("train").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            lazy += [f"{path.name}:{node.lineno}" for n in names if n.startswith("gridrun.toy")][:1]
    assert lazy == []


def test_tasks_import_neither_half() -> None:
    loaded = imported_after(modules("gridrun.tasks"))
    assert not {m for m in loaded if m.startswith(("gridrun.grid", "gridrun.train"))}


def test_the_registries_built_ins_import_neither_half_nor_torch() -> None:
    # The grid checks a workflow, task or engine node at plan time from its registry entry:
    # loading every built-in one must not pull in the trainer (or torch) with it.
    loaded = imported_after(["gridrun.seam.registry", "gridrun.engine_params", *modules("gridrun.workflows")])
    assert not {m for m in loaded if m.startswith(("gridrun.grid", "gridrun.train")) or m.split(".")[0] == "torch"}


def test_package_is_importable() -> None:
    assert gridrun.__name__ == "gridrun"
