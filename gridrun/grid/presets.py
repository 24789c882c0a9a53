"""The whole-run presets seen from the grid: what each sets, and where a cell departs from its own.

A preset is `conf/preset/<name>.yaml` (run keys, at the root) plus, per task it changes,
`conf/preset/task/<name>_<task>.yaml` (that task's keys); conf/config.yaml composes both.
`released` sets nothing but its name: its values are the run schema's and the task params'
defaults. A preset's item is any key some preset sets; a cell departs from its preset where
its value of an item is not the one its preset gives (an override on the command line or in
a sweep), which `gridrun show` lists.

Left out: composing (gridrun/grid/compose.py does it, with Hydra); the presets' meaning (the
parity ledger, docs/fidelity.md).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from gridrun.grid import search
from gridrun.seam import registry
from gridrun.seam.runconfig import run_defaults


def _dirs(conf_dir: Path | None) -> list[Path]:
    """The named conf/ folder, else the search path (the user's own conf/, then gridrun's)."""
    return [conf_dir] if conf_dir else search.conf_dirs()


def preset_names(conf_dir: Path | None = None) -> list[str]:
    return sorted({p.stem for d in _dirs(conf_dir) for p in (d / "preset").glob("*.yaml")})


def dotted(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as dotted key -> leaf value (an empty mapping is a leaf)."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(dotted(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def preset_settings(preset: str, task: str, conf_dir: Path | None = None) -> dict[str, Any]:
    """Dotted key -> value that `preset` sets for a cell of `task` (its name aside)."""
    dirs = _dirs(conf_dir)
    root_file = search.find(dirs, f"preset/{preset}.yaml") or dirs[-1] / "preset" / f"{preset}.yaml"
    root = yaml.safe_load(root_file.read_text()) or {}
    settings = {k: v for k, v in dotted(root).items() if k != "preset"}
    task_file = search.find(dirs, f"preset/task/{preset}_{task}.yaml")
    if task_file is not None:
        settings.update({f"task.{k}": v for k, v in (yaml.safe_load(task_file.read_text()) or {}).items()})
    return settings


def _schema_default(key: str, task: str, plugin: str | None) -> Any:
    if key.startswith("task."):
        params = registry.params_class("task", {"name": task, "plugin": plugin})
        return {f.name: f.default for f in dataclasses.fields(params)}[key.removeprefix("task.")]
    return dotted(run_defaults())[key]


def departures(config: dict[str, Any], conf_dir: Path | None = None) -> list[tuple[str, Any, Any]]:
    """(key, the cell's value, its preset's value) for every preset item where they differ."""
    task, plugin = config["task"]["name"], config["task"].get("plugin")
    own = preset_settings(config["preset"], task, conf_dir)
    items = sorted({key for name in preset_names(conf_dir) for key in preset_settings(name, task, conf_dir)})
    values = dotted(config)
    found = []
    for key in items:
        expected = own[key] if key in own else _schema_default(key, task, plugin)
        if key in values and values[key] != expected:
            found.append((key, values[key], expected))
    return found
