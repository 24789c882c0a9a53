"""Hydra composition of one cell's config from conf/, cached across cells, with errors that
name the fix.

`Composer.compose(overrides)` returns the same tree as `hydra.compose("config", overrides)`
minus the `hydra` node, resolved to plain Python (grid.data_root made absolute). It takes Hydra's
own steps (ConfigLoaderImpl._load_configuration_impl) with Hydra's and OmegaConf's own code:
the defaults list (`create_defaults_list`), each entry loaded at its package, OmegaConf's
merge in the list's order, the settings applied in struct mode as Hydra applies command-line
overrides, and OmegaConf's resolution. What cells share is kept between calls: each parsed
file, each loaded entry, and the defaults list of each set of group choices. A plain
hydra.compose rebuilds all of that, and Hydra's own config, on every call: 4.5 s of CPU for
the full matrix's 48 group combinations against the composer's 1.05 s (bench/composition.py),
and a 3 s budget for the whole dry run (bench/plan.py).

The workflow, task and engine nodes are each the chosen option's params dataclass
(gridrun/seam/registry.py): its fields at their defaults are stored with Hydra's ConfigStore as
schema/<group>/<option> and placed under the option's file by conf/config.yaml, so the file
holds only what differs. A plugin's option is stored once chosen, from the module its file
names in `plugin:`. The launcher node (grid.launcher) likewise: each registered launcher's
settings dataclass (beside it in gridrun/grid/launchers/), placed by its option file's own
defaults list, so a copy of the file under another name keeps it.

Errors are worked out from structured data, never from Hydra's English: a missing option
file from the exception's path; a pair of choices without a row in conf/tables.yaml from the
table itself; a setting that cannot be applied from its parsed key and the keys of the tree
it was applied to.

The steps live in `hydra._internal` (written against hydra-core 1.3, pinned for it);
tests/grid/test_compose.py checks the result against hydra.compose on every group combination
of the full matrix.

Left out: Hydra's own config and app runtime (the `hydra` node, working-dir changes, logging
setup, launchers); sweeping is the grid's job (gridrun/grid/spec.py), not Hydra's sweeper.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import yaml
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.config_repository import CachingConfigRepository, ConfigRepository
from hydra._internal.defaults_list import create_defaults_list
from hydra._internal.utils import create_config_search_path
from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.config_store import ConfigStore
from hydra.core.default_element import ResultDefault
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException, MissingConfigException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from gridrun.grid import checkout, search
from gridrun.grid.errors import GridError, closest
from gridrun.grid.launchers.base import LAUNCHERS, LauncherSettings, launcher_class
from gridrun.grid.userfiles import check_option_files
from gridrun.seam import registry
from gridrun.seam.registry import ConfigError, OptionParams
from gridrun.seam.runconfig import ToySpec, run_defaults

# The shipped groups; a user's own conf/ comes before them (gridrun/grid/search.py).
CONF_DIR = search.SHIPPED_CONF
PRIMARY = "config"
# The tables of conf/tables.yaml: (table, (row group, key naming the row), (column group, key
# naming the column)); the keys are where the chosen options' names land in the tree.
TABLES = (
    ("workflow_task", ("workflow", "workflow.name"), ("task", "task.name")),
    ("scale_gpu", ("scale", "grid.scale"), ("gpu", "grid.gpu.name")),
)

# The run schema's defaults open conf/config.yaml's defaults list (`run_schema`): conf/ sets
# only what differs from them, and any run key is set on the command line without `+`. The
# toy world's recipe likewise: conf/scale/toy.yaml places ToySpec at model.toy. Both come
# through Hydra's own structured-config source, so hydra.compose sees them too.
ConfigStore.instance().store(name="run_schema", node=run_defaults())
ConfigStore.instance().store(group="toy_recipe", name="schema", node=ToySpec)
# Groups whose node is the chosen option's params (gridrun/seam/registry.py). Each option's params
# dataclass is its schema, stored as schema/<group>/<option> (its fields at their defaults);
# conf/config.yaml places the chosen option's schema under its file (`schema/workflow@workflow:
# ${workflow}`), so an option file holds only what differs from the defaults.
OPTION_GROUPS = ("workflow", "task", "engine")
# Likewise each registered launcher's settings dataclass (gridrun/grid/launchers/), stored as
# schema/launcher/<name>: conf/launcher/<name>.yaml places it under itself (its defaults list).
LAUNCHER_GROUP = "launcher"
SCHEMA_GROUP = "schema"


def store_option_schema(group: str, name: str, params: type[OptionParams | LauncherSettings]) -> None:
    """Register one option's params (or a launcher's settings) dataclass as its schema with
    Hydra's ConfigStore. A plain mapping, as run_schema: OmegaConf's structured configs take no
    Literal types; the types are checked when the composed tree is read into the run schema
    (gridrun/seam/runconfig.py) or the grid root's (gridrun/grid/gridconfig.py)."""
    node = {f.name: _field_default(f) for f in dataclasses.fields(params)}
    ConfigStore.instance().store(group=f"{SCHEMA_GROUP}/{group}", name=name, node={**node, "name": name})


def _field_default(f: dataclasses.Field[Any]) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default


class Composer:
    """Composes cell configs from conf/ directories (the first holding a file wins: the user's
    own, then gridrun's shipped one); cheap to call many times."""

    def __init__(self, conf_dir: Path | None = None) -> None:
        # One folder when named (tests, a plugin's conf/); else the search path.
        self.conf_dirs = [conf_dir] if conf_dir else search.conf_dirs(CONF_DIR)
        if search.find(self.conf_dirs, f"{PRIMARY}.yaml") is None:
            raise GridError(f"no {PRIMARY}.yaml in {', '.join(map(str, self.conf_dirs))}: gridrun's shipped conf/ is "
                            "missing, reinstall gridrun from its checkout (pip install -e . there)")
        for own in self.conf_dirs[:-1] if conf_dir is None else []:  # the user's, before Hydra reads them
            check_option_files(own, CONF_DIR)
        # The built-in options' schemas before the repository below, which copies the store;
        # a plugin's once its option is chosen (_merged).
        for group in OPTION_GROUPS:
            for name, params in registry.params_classes(group).items():
                store_option_schema(group, name, params)
        for name in LAUNCHERS:
            store_option_schema(LAUNCHER_GROUP, name, launcher_class(name).settings_type)
        self._search_path = _search_path(self.conf_dirs)
        self._loader = ConfigLoaderImpl(config_search_path=self._search_path)
        self._repo = self._repository()
        self._parser = OverridesParser.create()
        self._parsed: dict[str, Override] = {}
        self._groups = sorted({p.name for d in self.conf_dirs for p in d.iterdir() if p.is_dir()})
        self._options: dict[str, list[str]] = {}
        self._defaults: dict[tuple[str, ...], list[ResultDefault]] = {}
        self._entries: dict[tuple[str | None, str | None], DictConfig] = {}

    def _repository(self) -> CachingConfigRepository:
        # Parses each file once. Hydra makes a new one per compose because it then merges
        # the cached nodes into the result without copying them; here every merge copies.
        # It deep-copies Hydra's ConfigStore: what is stored later needs a new one.
        return CachingConfigRepository(ConfigRepository(config_search_path=self._search_path))

    # --- groups --------------------------------------------------------------------------
    def groups(self) -> list[str]:
        return self._groups

    def options(self, group: str) -> list[str]:
        if group not in self._options:
            self._options[group] = sorted({p.stem for d in self.conf_dirs for p in (d / group).glob("*.yaml")})
        return self._options[group]

    def check_choice(self, group: str, value: str) -> None:
        options = self.options(group)
        if value not in options:
            raise GridError(f"unknown {group} '{value}'{closest(value, options)}; options live in conf/{group}/")

    # --- composition ---------------------------------------------------------------------
    def parse(self, line: str) -> Override:
        override = self._parsed.get(line)
        if override is None:
            try:
                override = self._parser.parse_override(line)
            except HydraException as err:
                raise GridError(f"cannot parse override '{line}': {_first_line(err)}. Hydra's syntax is key=value") from None
            self._parsed[line] = override
        return override

    def _is_group(self, key: str) -> bool:
        """Whether `key` names a config group (Hydra looks for its folder on disk: a key too
        long for a file name names none, and the settings' own checks then name it)."""
        try:
            return bool(self._repo.group_exists(key))
        except OSError:
            return False

    def compose(self, overrides: Sequence[str]) -> dict[str, Any]:
        """The resolved config tree for these overrides (group choices and settings)."""
        parsed = [self.parse(line) for line in overrides]
        for override in parsed:
            if override.key_or_group in self._groups and not override.is_delete():
                self.check_choice(override.key_or_group, str(override.value()))
        # Hydra's own split (Overrides): a key naming a config group chooses an option.
        is_choice = [self._is_group(o.key_or_group) for o in parsed]
        choices = [o for o, choice in zip(parsed, is_choice) if choice]
        cfg = self._merged(self._defaults_list(choices))
        OmegaConf.set_struct(cfg, True)
        for setting in (o for o, choice in zip(parsed, is_choice) if not choice):
            try:
                ConfigLoaderImpl._apply_overrides_to_config([setting], cfg)
            except (HydraException, OmegaConfBaseException) as err:
                raise GridError(self._explain_setting(setting, cfg, err)) from None
        self._check_rows(cfg)
        try:
            cfg.grid.data_root = _absolute(str(cfg.grid.data_root))
            resolved = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
        except OmegaConfBaseException as err:
            where = f"'{err.full_key}'" if getattr(err, "full_key", None) else "the config"
            raise GridError(f"cannot resolve {where}: {_first_line(err)}") from None
        assert isinstance(resolved, dict)
        return cast(dict[str, Any], resolved)

    def option_files(self, overrides: Sequence[str]) -> dict[str, str]:
        """Group -> the option file these overrides compose from (`cluster: conf/cluster/mine.yaml`),
        for errors about a composed node to name the file a user wrote."""
        choices = [o for o in map(self.parse, overrides) if self._is_group(o.key_or_group)]
        files = {}
        for entry in self._defaults_list(choices):
            group, _, option = (entry.config_path or "").rpartition("/")
            path = search.find(self.conf_dirs, f"{group}/{option}.yaml") if group in self._groups else None
            if path is None:
                continue
            # The user's own file by its path; a shipped one as conf/<group>/<option>.yaml.
            shipped = path.parent.parent == self.conf_dirs[-1]
            files[group] = f"{path.parent.parent.name}/{group}/{option}.yaml" if shipped else search.display(path)
        return files

    def _defaults_list(self, choices: list[Override]) -> list[ResultDefault]:
        """Hydra's defaults list for these group choices (made once per choices)."""
        key = tuple(o.input_line or "" for o in choices)
        defaults = self._defaults.get(key)
        while defaults is None:
            try:
                defaults = create_defaults_list(
                    repo=self._repo, config_name=PRIMARY, overrides_list=choices, prepend_hydra=False, skip_missing=False
                ).defaults
            except MissingConfigException as err:
                if not self._store_plugin_schema(err.missing_cfg_file or ""):
                    raise GridError(self._explain_missing(err)) from None
            except HydraException as err:
                raise GridError(f"cannot compose the config: {_first_line(err)}") from None
        for entry in defaults:
            # The one-line notice where a user's file hides a shipped one of the same name.
            if entry.config_path and len(self.conf_dirs) > 1:
                search.find(self.conf_dirs, f"{entry.config_path}.yaml")
        self._defaults[key] = defaults
        return defaults

    def _merged(self, defaults: list[ResultDefault]) -> DictConfig:
        """The defaults list's entries merged in its order: a fresh tree on every call."""
        # OmegaConf.merge copies every node it places, so the cached entries stay as loaded.
        merged = OmegaConf.merge(*(self._entry(entry) for entry in defaults))
        assert isinstance(merged, DictConfig)
        return merged

    def _entry(self, entry: ResultDefault) -> DictConfig:
        """One defaults-list entry's config, placed at its package (loaded once)."""
        key = (entry.config_path, entry.package)
        if key not in self._entries:
            loaded = self._loader._load_single_config(default=entry, repo=self._repo).config
            assert isinstance(loaded, DictConfig)
            self._entries[key] = loaded
        return self._entries[key]

    def _store_plugin_schema(self, missing: str) -> bool:
        """The schema of a chosen option that no loaded module registers: its option file names
        the module (`plugin:`), imported here, whose params become the schema. False when
        `missing` is no option's schema."""
        schema, group, name = (missing.split("/") + ["", ""])[:3]
        if schema != SCHEMA_GROUP or group not in OPTION_GROUPS:
            return False
        path = search.find(self.conf_dirs, f"{group}/{name}.yaml") or self.conf_dirs[-1] / group / f"{name}.yaml"
        try:
            node = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as err:
            raise GridError(f"cannot read {path} ({type(err).__name__}): fix the file") from None
        plugin = node.get("plugin") if isinstance(node, dict) else None
        try:
            params = registry.params_class(group, {"name": name, "plugin": plugin})
        except ConfigError as err:
            raise GridError(f"conf/{group}/{name}.yaml: {err}") from None
        store_option_schema(group, name, params)
        self._repo = self._repository()
        return True

    # --- errors --------------------------------------------------------------------------
    def _explain_missing(self, err: MissingConfigException) -> str:
        if not err.missing_cfg_file or "/" not in err.missing_cfg_file:
            return f"cannot compose the config: {_first_line(err)}"
        group, _, option = err.missing_cfg_file.rpartition("/")
        return f"unknown {group} '{option}'{closest(option, err.options or self.options(group))}"

    def _check_rows(self, cfg: DictConfig) -> None:
        """Refuses a pair of choices that has no row in its table of conf/tables.yaml, naming
        the pairs that do (the rows are looked up by interpolation, whose error names neither)."""
        for table, (row_group, row_key), (column_group, column_key) in TABLES:
            rows = cfg.grid[table]
            row, column = OmegaConf.select(cfg, row_key), OmegaConf.select(cfg, column_key)
            if row in rows and column in rows[row]:
                continue
            pairs = ", ".join(f"{r}-{c}" for r in rows for c in rows[r])
            raise GridError(
                f"{row_group}={row} does not run on {column_group}={column} (no row in conf/tables.yaml's "
                f"{table}): pick another {column_group}=...; valid {row_group}-{column_group} pairs: {pairs}"
            )

    def _explain_setting(self, setting: Override, cfg: DictConfig, err: Exception) -> str:
        key = setting.key_or_group
        if setting.package is not None:
            return f"unknown config group '{key}'{closest(key, self._groups)}; groups live in conf/"
        tree = OmegaConf.to_container(cfg, resolve=False)
        known = _dotted_keys(tree)
        if setting.is_add() and key in known:
            return f"'{key}' exists already: drop the '+' and write {key}=..."
        if key not in known:
            parent = key.rpartition(".")[0]
            adding = parent in known and not setting.is_delete()
            hint = f"; to add a new entry under '{parent}' write +{key}=..." if adding else ""
            return f"unknown config key '{key}'{closest(key, sorted(known))}{hint}"
        return f"cannot apply '{setting.input_line}': {_first_line(err.__cause__ or err)}"


def _dotted_keys(tree: Any, prefix: str = "") -> set[str]:
    """Dotted paths of every node of a nested dict, mappings and leaves alike."""
    keys: set[str] = set()
    if isinstance(tree, dict):
        for key, value in tree.items():
            keys.add(f"{prefix}{key}")
            keys |= _dotted_keys(value, f"{prefix}{key}.")
    return keys


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _absolute(data_root: str) -> str:
    """grid.data_root from the repository root when relative (so cells planned anywhere agree);
    installed as a wheel, from the working directory."""
    path = Path(data_root).expanduser()
    return str(path if path.is_absolute() else (checkout() or Path.cwd()) / path)


def _search_path(conf_dirs: list[Path]) -> ConfigSearchPath:
    # Hydra's default path (which also registers the file:// and pkg:// sources) plus the conf/
    # folders, the first of them searched first.
    search_path = create_config_search_path(None)
    elements = search_path.get_path()
    elements[:] = [e for e in elements if e.provider != "schema"]
    for i, conf_dir in enumerate(conf_dirs):
        search_path.append("main" if i == len(conf_dirs) - 1 else "user", f"file://{conf_dir}")
    # Hydra asserts that the structured-config source comes last.
    search_path.append("schema", "structured://")
    return search_path
