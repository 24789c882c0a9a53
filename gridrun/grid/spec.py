"""A sweep: its file in sweeps/ plus the command line's Hydra overrides -> axes and settings.

    gridrun plan conf=full_matrix 'seed=range(0,3)' scale=1.7b train.total_steps=20

`conf=` names the sweep (sweeps/<name>.yaml: the user's own in the working directory or
--config-dir, else gridrun's shipped one; or a path to a YAML file). An override of an
axis (workflow, task, scale, policy, seed, kind) replaces that axis's values and may use
Hydra's sweep syntax (`a,b`, `range(0,16)`, `glob(*)`, a list `[a,b]`). Every other override
is a setting applied to every cell, in Hydra's syntax (`train.total_steps=20`, `engine=hf`,
`+grpo.kl_beta.generator=0.01`). Sweeping a setting over several values is refused: a
cell's id names only its axes, so two cells differing in a setting would share an id.

`variants` names bundles of overrides and crosses the train cells (and their shuffled twins)
with them, like an axis; each bundle is a list of settings for every cell, or a mapping of
policy -> list (an intervention that takes another form under Isolated- and Shared-Policy):

    variants:
      natural: []
      injected: {isolated: [+optim.role_lr_scale.parallel=3.0], shared: [+grpo.role_weight.parallel=3.0]}

A mapping names isolated and shared, and any other policy option of the sweep's policy axis
(a grouping, conf/policy/<name>.yaml) whose cells it crosses.

A variant's settings apply after the sweep's (file and command line): the variant is what
its cells differ by. `variant=natural,injected` on the command line plans some of them.

`restrict` plans one kind at fewer values of an axis, in the sweep file
(`restrict: {transfer: {scale: [1.7b]}}`) or on the command line
(`restrict.transfer.scale=1.7b,4b`, which replaces the file's values for that axis).

`cell_gpu` puts a group of cells on another GPU class than their scale's default (a glob on
the cell id -> conf/gpu option, e.g. `'eval_opt-*-0.6b-math-*': h100`); the class also picks
the micro-batch token budget. A `gpu=` on the command line applies to every cell instead.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from hydra.core.override_parser.types import Glob

from gridrun.grid import search
from gridrun.grid.cells import AXES, KINDS, SINGLE_KINDS
from gridrun.grid.compose import Composer
from gridrun.grid.errors import GridError, closest
from gridrun.grid.sweepdir import SWEEP_FILE_SUFFIXES, check_sweep_name
from gridrun.grid.userfiles import read_checked
from gridrun.seam import registry
from gridrun.seam.runconfig import SEED_MAX, ConfigError, from_dict

# A variant's name ends cell ids: no '-' (the ids' separator) and nothing a path refuses,
# short enough that an id (and replaced/<id>-<time>) fits a file name.
VARIANT_NAME = re.compile(r"[A-Za-z0-9_]+")
VARIANT_NAME_MAX = 64


@dataclass
class SweepFile:
    """What a sweep file (sweeps/<name>.yaml) may hold, read by the run schema's typed loader
    (gridrun/seam/runconfig.py's `from_dict`, as config.yaml and the grid root are); an empty
    key is as if absent. What each value means is checked by `load_spec` and the modules
    named below."""

    # axis -> its values (one value: a list of one).
    axes: dict[str, Any] | None = None
    # kind -> axis -> values: the cells of that kind the sweep keeps.
    restrict: dict[str, dict[str, Any]] | None = None
    # Hydra overrides every cell takes.
    overrides: list[str] | None = None
    # name -> settings, or policy -> settings (`_variants`).
    variants: Any = None
    # The early-warning study's plan (EarlyWarningPlan.parse).
    early_warning: Any = None
    # What the sweep's seeds can detect (AnalysisPlan.parse).
    analysis: Any = None
    # glob on cell ids -> GPU class.
    cell_gpu: dict[str, str] | None = None


SWEEP_KEYS = tuple(f.name for f in dataclasses.fields(SweepFile))
# What a key of the wrong shape must look like, said with its file.
SWEEP_SHAPES = {
    "axes": "'axes' must map axis names to lists of values",
    "restrict": "'restrict' must map a kind to axes and their values, e.g. transfer: {scale: [1.7b]}",
    "overrides": "'overrides' must be a list of Hydra overrides such as train.total_steps=20",
    "cell_gpu": "'cell_gpu' must map a glob on cell ids to a GPU class, e.g. 'eval_opt-*-0.6b-math-*': h100",
}
VARIANT_AXIS = "variant"
POLICIES = ("isolated", "shared")
# A variant given as a list: the same settings under every policy.
ANY_POLICY = "*"


@dataclass
class SweepSpec:
    name: str
    source: Path
    # Axis -> values, in the sweep file's order; seeds are ints.
    axes: dict[str, list[Any]]
    # Settings for every cell: the sweep file's, then the command line's (later wins).
    settings: list[str] = field(default_factory=list)
    # kind -> axis -> values: that kind's cells only at these values (see cells.expand).
    restrict: dict[str, dict[str, list[Any]]] = field(default_factory=dict)
    # The command line as given (recorded in sweep.json).
    argv: list[str] = field(default_factory=list)
    # Variant name -> policy -> its settings, in the sweep file's order (ANY_POLICY: a list
    # for every policy); only the variants planned (all of the file's, or those `variant=`
    # names). Empty: a sweep without variants.
    variants: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    # How the alerts' thresholds are chosen and reported (the sweep file's `early_warning:`).
    early_warning: EarlyWarningPlan | None = None
    # The seed-to-seed spread assumed before anything runs (the sweep file's `analysis:`).
    analysis: AnalysisPlan | None = None
    # A glob on the cell id -> the GPU class of those cells (conf/gpu/<name>), in file order;
    # the first match wins and a `gpu=` setting wins over every one (the file's `cell_gpu:`).
    cell_gpu: dict[str, str] = field(default_factory=dict)

    def gpu_choice(self, cell_id: str, composer: Composer) -> tuple[str, ...]:
        """`gpu=<class>` for a cell that cell_gpu names, unless a setting picks the GPU class."""
        if any(composer.parse(line).key_or_group == "gpu" for line in self.settings):
            return ()
        for pattern, gpu in self.cell_gpu.items():
            if fnmatch.fnmatchcase(cell_id, pattern):
                return (f"gpu={gpu}",)
        return ()

    def variant_settings(self, variant: str | None, policy: str | None) -> list[str]:
        """The settings of `variant` for a cell of `policy` (none for a control)."""
        if variant is None:
            return []
        bundle = self.variants[variant]
        policy = policy or "shared"
        if ANY_POLICY in bundle:
            return bundle[ANY_POLICY]
        if policy not in bundle:
            raise GridError(f"{self.source}: variants.{variant} has no settings for policy {policy}: add "
                            f"'{policy}: []' to leave it as it is")
        return bundle[policy]


@dataclass(frozen=True)
class EarlyWarningPlan:
    """A study's calibration, fixed in its sweep file before it runs: the alerts' thresholds
    are chosen on the cells of `fit_seeds` among every combination of `search`'s candidates
    (a Thresholds field -> values) and reported on `held_out_seeds` (gridrun/analysis/
    calibration.py). sweep.json records it, so collect applies the plan the cells ran under."""

    fit_seeds: tuple[int, ...]
    held_out_seeds: tuple[int, ...]
    search: dict[str, tuple[float, ...]]
    # A cliff's fall in standard errors (warning.CLIFF_SE where the file gives none).
    cliff_se: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"fit_seeds": list(self.fit_seeds), "held_out_seeds": list(self.held_out_seeds),
                               "search": {name: list(values) for name, values in self.search.items()}}
        if self.cliff_se is not None:
            out["cliff_se"] = self.cliff_se
        return out

    @classmethod
    def parse(cls, data: Any, where: str) -> EarlyWarningPlan:
        """The plan from a sweep file's (or sweep.json's) mapping; one-line errors naming the fix."""
        from gridrun.seam.mechanisms import Thresholds

        example = "{fit_seeds: [0, 1], held_out_seeds: [2], search: {chi2_factor: [2.0, 3.0]}}"
        if not isinstance(data, dict) or not {"fit_seeds", "held_out_seeds", "search"} <= set(data) <= {
                "fit_seeds", "held_out_seeds", "search", "cliff_se"}:
            raise GridError(f"{where}: 'early_warning' must hold fit_seeds, held_out_seeds and search (and may hold "
                            f"cliff_se), e.g. {example}")
        k = data.get("cliff_se")
        if k is not None and (not isinstance(k, (int, float)) or isinstance(k, bool) or not 0 <= k < math.inf):
            raise GridError(f"{where}: early_warning.cliff_se must be a number of standard errors >= 0, e.g. 2.0")
        seeds = {}
        for key in ("fit_seeds", "held_out_seeds"):
            values = data[key]
            if not isinstance(values, list) or not values or not all(type(v) is int for v in values):
                raise GridError(f"{where}: early_warning.{key} must be a non-empty list of seeds, e.g. [0, 1]")
            twice = [v for i, v in enumerate(values) if v in values[:i]]
            if twice:
                raise GridError(f"{where}: early_warning.{key} lists seed {twice[0]} twice: give each seed once")
            seeds[key] = tuple(values)
        if set(seeds["fit_seeds"]) & set(seeds["held_out_seeds"]):
            raise GridError(f"{where}: early_warning's held-out seeds must not be fit seeds: a seed that chose the "
                            "thresholds cannot report them")
        fields = {f.name: f.type for f in dataclasses.fields(Thresholds)}
        search = data["search"]
        if not isinstance(search, dict) or not search:
            raise GridError(f"{where}: early_warning.search must map Thresholds fields to candidate values, e.g. "
                            "chi2_factor: [2.0, 3.0]")
        out: dict[str, tuple[float, ...]] = {}
        for name, values in search.items():
            if name not in fields:
                raise GridError(f"{where}: early_warning.search.{name} is not a threshold{closest(str(name), list(fields))}")
            whole = fields[name] in (int, "int")
            if (not isinstance(values, list) or not values
                    or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
                    or (whole and not all(type(v) is int for v in values))):
                raise GridError(f"{where}: early_warning.search.{name} must be a non-empty list of "
                                f"{'whole numbers' if whole else 'numbers'}")
            out[name] = tuple(values)
        return cls(seeds["fit_seeds"], seeds["held_out_seeds"], out, None if k is None else float(k))

    def check_seeds(self, planned: list[Any], where: str) -> None:
        """Every fit and held-out seed is one the sweep plans (else it has no cells to score)."""
        for key in ("fit_seeds", "held_out_seeds"):
            for seed in getattr(self, key):
                if seed not in planned:
                    raise GridError(f"{where}: early_warning.{key}: seed {seed} is not on the seed axis "
                                    f"({', '.join(map(str, planned))}): add it to the seeds or drop it from {key}")


@dataclass(frozen=True)
class AnalysisPlan:
    """What a sweep's seeds can detect, sized before anything runs: the seed-to-seed standard
    deviation of a cell's accuracy assumed (points), and optionally the difference the
    researcher wants to see. The dry run turns it into each Table 1 comparison's detectable
    difference (gridrun/seam/significance.py); collect then reports the measured spread beside it."""

    seed_sd_pp: float
    target_pp: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"seed_sd_pp": self.seed_sd_pp, **({} if self.target_pp is None else {"target_pp": self.target_pp})}

    @classmethod
    def parse(cls, data: Any, where: str) -> AnalysisPlan:
        example = "{seed_sd_pp: 2.0, target_pp: 3.0}"
        if not isinstance(data, dict) or "seed_sd_pp" not in data or not set(data) <= {"seed_sd_pp", "target_pp"}:
            raise GridError(f"{where}: 'analysis' must hold seed_sd_pp (and may hold target_pp), e.g. {example}")
        values = {}
        for key in ("seed_sd_pp", "target_pp"):
            v = data.get(key)
            if v is None and key == "target_pp":
                continue
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v < math.inf:
                raise GridError(f"{where}: analysis.{key} must be a number of accuracy points > 0, e.g. {example}")
            values[key] = float(v)
        return cls(values["seed_sd_pp"], values.get("target_pp"))


def available_sweeps() -> list[str]:
    """The sweeps conf=<name> finds: the user's own and gridrun's shipped ones."""
    return sorted({p.stem for d in search.sweep_dirs() for p in d.glob("*.yaml")})


def split_conf(args: Sequence[str]) -> tuple[str | None, list[str]]:
    """Pull `conf=<name>` out of the positional arguments."""
    conf = None
    rest = []
    for arg in args:
        if arg.startswith("conf="):
            conf = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    return conf, rest


def command_line(command: str, conf: str | None, overrides: Sequence[str], **options: str | None) -> str:
    """`gridrun <command> conf=<sweep> <overrides> --<option> <value>`, shell-quoted: a hint
    that repeats the sweep, overrides and folders of the command typed, so that following it
    plans the same cells (options left None are left out)."""
    words = ["gridrun", command, f"conf={conf}", *overrides]
    for name, value in options.items():
        if value:
            words += [f"--{name.replace('_', '-')}", str(value)]
    return shlex.join(words)


def sweep_file(conf: str) -> Path:
    path = Path(conf)
    if path.suffix in SWEEP_FILE_SUFFIXES:
        if not path.is_file() and not path.is_symlink():
            raise GridError(f"sweep file {path} does not exist")
        return path
    broken = [d / f"{conf}.yaml" for d in search.sweep_dirs() if (d / f"{conf}.yaml").is_symlink()
              and not (d / f"{conf}.yaml").is_file()]
    if broken:
        raise GridError(f"{search.display(broken[0])} is not a readable file (a broken link or a symlink loop?): "
                        "fix or remove it")
    dirs = search.sweep_dirs()
    found = search.find(dirs, f"{conf}.yaml")
    if found is None:
        names = available_sweeps()
        where = " or ".join(search.display(d) for d in dirs)
        raise GridError(f"no sweep '{conf}' in {where}{closest(conf, names)}: pass conf=<name> of sweeps/<name>.yaml "
                        "or conf=<path to a sweep file>")
    return found


def load_spec(conf: str | None, overrides: Sequence[str], composer: Composer) -> SweepSpec:
    """Read the sweep file and fold in the command line; validates every axis value."""
    if not conf:
        raise GridError(f"say which sweep: conf=<name> (available: {', '.join(available_sweeps())})")
    path = sweep_file(conf)
    check_sweep_name(path.stem)
    text = read_checked(path)  # within bounds, before anything is constructed from it
    try:
        data = yaml.load(text, Loader=_SweepLoader) or {}  # a SafeLoader
    except _KeyTwice as twice:
        raise GridError(f"{path}: {twice}") from None
    except yaml.YAMLError as err:
        raise GridError(f"{path} is not valid YAML ({err.__class__.__name__}): fix the file") from None
    if not isinstance(data, dict):
        raise GridError(f"{path} must be a mapping with keys {', '.join(SWEEP_KEYS)}")
    for key in data:
        if key not in SWEEP_KEYS:
            raise GridError(f"{path}: unknown key '{key}'{closest(str(key), SWEEP_KEYS)}")
    try:
        written = from_dict(SweepFile, data)
    except ConfigError as err:
        key = re.split(r"[.\[:]", str(err), maxsplit=1)[0]
        raise GridError(f"{path}: {SWEEP_SHAPES.get(key, err)}") from None
    axes_data = written.axes or {}
    axes: dict[str, list[Any]] = {}
    # Unknown names first: a misspelt axis (`tsak:`) is named, not reported as the one missing.
    for axis, values in axes_data.items():
        if axis not in AXES:
            raise GridError(f"{path}: unknown axis '{axis}'{closest(str(axis), AXES)}")
        axes[axis] = list(values) if isinstance(values, list) else [values]
    for axis in AXES:
        if axis not in axes_data:
            raise GridError(f"{path}: axes.{axis} is missing: list its values (e.g. {axis}: [{_example(axis)}])")
    file_settings = written.overrides or []
    restrict_lines: dict[tuple[str, str], Any] = {
        (kind, axis): values for kind, limits in (written.restrict or {}).items() for axis, values in limits.items()
    }
    variants = _variants(path, written.variants, composer)
    cell_gpu = written.cell_gpu or {}
    early = written.early_warning
    early_warning = None if early is None else EarlyWarningPlan.parse(early, str(path))
    analysis = None if written.analysis is None else AnalysisPlan.parse(written.analysis, str(path))
    chosen: list[str] | None = None
    settings = list(file_settings)
    for line in overrides:
        override = composer.parse(line)
        key = override.key_or_group
        if key == VARIANT_AXIS:
            chosen = [str(v) for v in _axis_values(line, composer)]
        elif key in AXES:
            axes[key] = _axis_values(line, composer)
        elif key.startswith("restrict."):
            _, kind, axis = (key.split(".") + ["", ""])[:3]
            restrict_lines[(kind, axis)] = _axis_values(line, composer)
        elif key == "cell" or key.startswith("cell."):
            raise GridError(f"'{line}': cell.* is set by the grid; choose cells with the axes ({', '.join(AXES)})")
        elif key.startswith("hydra"):
            raise GridError(f"'{line}': Hydra's own settings do not apply to a sweep; set the cells' keys instead")
        elif override.is_sweep_override():
            raise GridError(
                f"'{line}': only the axes ({', '.join(AXES)}) can take several values; a cell id names only "
                f"its axes, so sweep {key} with one plan per value, each with its own --results-dir"
            )
        else:
            settings.append(line)
    for axis in AXES:
        axes[axis] = _checked_axis(axis, axes[axis], composer)
    if early_warning is not None:
        early_warning.check_seeds(axes["seed"], str(path))
    restrict: dict[str, dict[str, list[Any]]] = {}
    for (kind, axis), values in restrict_lines.items():
        if kind not in KINDS:
            raise GridError(f"restrict.{kind}: unknown kind '{kind}'{closest(kind, KINDS)}")
        if axis not in AXES or axis == "kind":
            axes_named = [a for a in AXES if a != "kind"]
            raise GridError(f"restrict.{kind}.{axis}: name an axis ({', '.join(axes_named)}){closest(axis, axes_named)}")
        listed = values if isinstance(values, list) else [values]
        # The kinds that add workflow `single` to the sweep's may be restricted to it.
        restrict.setdefault(kind, {})[axis] = _checked_axis(axis, listed, composer, single_ok=kind in SINGLE_KINDS)
    return SweepSpec(
        name=path.stem, source=path, axes=axes, settings=_last_wins(settings, composer), restrict=restrict,
        argv=list(overrides), variants=_chosen_variants(path, variants, chosen), early_warning=early_warning,
        analysis=analysis, cell_gpu=dict(cell_gpu),
    )


def _variants(path: Path, data: Any, composer: Composer) -> dict[str, dict[str, list[str]]]:
    """The sweep file's variants: name -> policy -> settings (a list applies to both policies)."""
    if data is None:
        return {}
    if not isinstance(data, dict) or not data:
        raise GridError(f"{path}: 'variants' must map names to lists of overrides, e.g. natural: []")
    variants: dict[str, dict[str, list[str]]] = {}
    for name, bundle in data.items():
        name = str(name)
        if not VARIANT_NAME.fullmatch(name):
            raise GridError(f"{path}: variant '{name}' must be letters, digits and '_' (it ends cell ids)")
        if len(name) > VARIANT_NAME_MAX:
            raise GridError(f"{path}: variant '{name[:20]}...' is {len(name)} characters: give it a name of at most "
                            f"{VARIANT_NAME_MAX} characters (it ends cell ids, which name folders)")
        if bundle is None or isinstance(bundle, list):
            bundle = {ANY_POLICY: bundle or []}
        if not isinstance(bundle, dict):
            raise GridError(f"{path}: variants.{name} must be a list of overrides or a mapping of policy -> list")
        options = composer.options("policy")
        for policy in bundle:
            if policy not in (*POLICIES, ANY_POLICY) and policy not in options:
                raise GridError(f"{path}: variants.{name}.{policy}: not a policy{closest(str(policy), POLICIES)}")
        missing = [p for p in POLICIES if p not in bundle and ANY_POLICY not in bundle]
        if missing:
            raise GridError(f"{path}: variants.{name} has no settings for policy {missing[0]}: add "
                            f"'{missing[0]}: []' to leave it as it is")
        variants[name] = {}
        for policy in bundle:
            lines = bundle[policy] or []
            if not isinstance(lines, list) or not all(isinstance(line, str) for line in lines):
                raise GridError(f"{path}: variants.{name}.{policy} must be a list of overrides such as grpo.n=4")
            for line in lines:
                _check_variant_line(path, name, line, composer)
            variants[name][policy] = list(lines)
    return variants


def _check_variant_line(path: Path, name: str, line: str, composer: Composer) -> None:
    key = composer.parse(line).key_or_group
    if key in AXES or key == VARIANT_AXIS or key.split(".")[0] in ("cell", "restrict") or key.startswith("hydra"):
        raise GridError(f"{path}: variants.{name}: '{line}' is not a cell setting; a variant sets run keys "
                        "(grpo.*, optim.*, train.*), the axes choose cells")
    if composer.parse(line).is_sweep_override():
        raise GridError(f"{path}: variants.{name}: '{line}' takes one value; make one variant per value")


def _chosen_variants(
    path: Path, variants: dict[str, dict[str, list[str]]], chosen: list[str] | None
) -> dict[str, dict[str, list[str]]]:
    """The variants `variant=` names (all of them without it), refusing an unknown name."""
    if chosen is None:
        return variants
    if not variants:
        raise GridError(f"variant={','.join(chosen)}: {path} names no variants (add a 'variants:' mapping)")
    for name in chosen:
        if name not in variants:
            raise GridError(f"unknown variant '{name}' in variant={','.join(chosen)}{closest(name, list(variants))}: "
                            f"name variants of {path.name}")
    if len(set(chosen)) != len(chosen):
        raise GridError("variant= lists a variant twice: give each once")
    return {name: variants[name] for name in chosen}


def _axis_values(line: str, composer: Composer) -> list[Any]:
    override = composer.parse(line)
    key = override.key_or_group
    if override.is_delete() or override.is_add() or override.is_force_add():
        raise GridError(f"'{line}': an axis takes values, not +/~ (write {key}=a,b)")
    if override.is_interval_sweep():
        raise GridError(f"'{line}': interval() is continuous; give {key} discrete values (a,b or range(0,3))")
    if override.is_sweep_override():
        value = override.value()
        if isinstance(value, Glob):
            return list(value.filter(composer.options(key) if key in composer.groups() else []))
        return list(override.sweep_string_iterator())
    value = override.value()
    if isinstance(value, list):
        return value
    return [value]


def _checked_axis(axis: str, values: list[Any], composer: Composer, single_ok: bool = False) -> list[Any]:
    if not values or values == [""]:
        raise GridError(f"axis '{axis}' is empty: give it at least one value (e.g. {axis}={_example(axis)})")
    checked: list[Any] = []
    for value in values:
        if axis == "seed":
            value = _seed(value)
        elif axis == "kind":
            if value not in KINDS:
                raise GridError(f"unknown kind '{value}'{closest(str(value), KINDS)}")
        else:
            value = str(value)
            composer.check_choice(axis, value)
            if axis == "workflow" and value == registry.single_agent_workflow() and not single_ok:
                raise GridError(
                    f"workflow '{value}' is not a multi-agent workflow: the sa_rl, base, shuffled and eval kinds already "
                    "run it; drop it from workflow="
                )
        if value in checked:
            raise GridError(f"axis '{axis}' lists '{value}' twice: give each value once")
        checked.append(value)
    return checked


def _seed(value: Any) -> int:
    """A seed axis value as the run takes it: an integer (never 1.5 or true read as 1) in range."""
    if type(value) is int or (isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value)):
        seed = int(value)
    else:
        shown = f"'{value}'" if isinstance(value, str) else str(value)
        raise GridError(f"seed {shown} is not an integer: write seed=0,1,2 or 'seed=range(0,3)'")
    if not 0 <= seed <= SEED_MAX:
        raise GridError(f"seed {seed} is out of range: seeds are integers from 0 to {SEED_MAX}")
    return seed


class _KeyTwice(yaml.YAMLError):
    """A mapping of the sweep file gives a key twice (YAML would keep the last one silently)."""


class _SweepLoader(yaml.SafeLoader):
    """SafeLoader refusing a key given twice in one mapping."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
            try:
                again = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: SafeLoader's own error names it
                break
            if again:
                raise _KeyTwice(f"'{key}' is given twice (line {key_node.start_mark.line + 1}): give each key once")
        return super().construct_mapping(node, deep=deep)


def _last_wins(settings: list[str], composer: Composer) -> list[str]:
    """One override per key, the last one given (the command line's over the file's)."""
    by_key: dict[str, str] = {}
    for line in settings:
        by_key.pop(composer.parse(line).key_or_group, None)
        by_key[composer.parse(line).key_or_group] = line
    return list(by_key.values())


def _example(axis: str) -> str:
    return {"workflow": "voting", "task": "math", "scale": "1.7b", "policy": "shared", "seed": "0", "kind": "train"}[axis]
