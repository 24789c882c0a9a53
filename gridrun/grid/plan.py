"""Planning: expand a sweep into cells, compose and validate each config, freeze them.

`make_plan` composes every cell (once per group choices; seeds only change `cell`),
splits off the grid-only nodes, and validates the rest against the trainer's schema
(`config_from_dict`) before anything touches the disk. `freeze` then writes each new cell's
config.yaml (the seam: the trainer's schema, fully resolved), cell.json (coordinates, kind,
fingerprint, resources, git commit, package versions) and state.json (`planned`), and
sweep.json. A cell already on disk is left alone when its config is unchanged; when it
changed, the whole plan is refused, naming the keys, unless `replace` moves the old run
aside to replaced/ (never while it is queued or running). A cell folder that holds a run
(state, metrics, checkpoints) but no config.yaml is refused the same way: planning it afresh
would reset its history. A cell whose cell.json or config.yaml is damaged while the other
still vouches for the planned fingerprint is repaired (both written again), and a damaged
sweep.json is moved aside and written again.

The fingerprint is a hash of the resolved config.yaml content. A transfer cell names its
SA-RL cell's run dir relative to its own (`policy.adapters: {generator: ../<sa_rl id>}`), so its
fingerprint does not depend on where the results live; the adapter inside is found when the
cell runs. An eval cell's `policy.adapters` come from the sweep's settings, each with the
cell's coordinates filled in (`{seed}` names the seed's own source). Its sa_rl cell must be in the plan or already in the sweep; `needs` in sweep.json
and cell.json records the dependency for the launchers.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import platform
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import yaml

from gridrun.arch import families
from gridrun.engine_params import VLLMParams
from gridrun.grid import checkout, cost, templates
from gridrun.grid.cells import TOY_SCALE, Cell, expand
from gridrun.grid.compose import Composer
from gridrun.grid.console import track
from gridrun.grid.cost import MeasuredStep
from gridrun.grid.disk import GB, DiskEstimate, cell_disk
from gridrun.grid.errors import GridError
from gridrun.grid.gridconfig import GpuSpec, GridRoot, GridSpec, as_dict, grid_root
from gridrun.grid.launchers.observe import live_state, observe
from gridrun.grid.spec import SweepSpec
from gridrun.grid.sweepdir import PlanEntry, SweepDamaged, SweepDir, sibling_cell
from gridrun.seam import cellstate, registry
from gridrun.seam.cellstate import StateRecord
from gridrun.seam.runconfig import (
    SCHEMA_VERSION,
    CellKind,
    ConfigError,
    RunConfig,
    config_from_dict,
    dump_config,
    load_config,
    migrate,
)
from gridrun.seam.rundir import DamagedFile, RunDir, atomic_write_json, atomic_write_text, config_digest
from gridrun.seam.significance import FALSE_ALARM, POWER, detectable_difference

# Run nodes holding the chosen option's own settings (gridrun/seam/registry.py).
OPTION_NODES = ("workflow", "task", "engine")
VERSIONED = ("gridrun", "torch", "transformers", "peft", "vllm", "hydra-core", "omegaconf")


@dataclass
class PlannedCell:
    cell: Cell
    config: RunConfig
    fingerprint: str
    resources: dict[str, Any]
    est_hours: float
    # Predicted peak GPU memory per GPU (gridrun/memory.py); None on CPU or for models
    # whose architecture is not shipped.
    gpu_mem_gib: float | None = None
    # Seconds of one training step of this cell at its own batch (gridrun/grid/cost.py; the
    # canary's measured step for its shape), and where the update's rate came from.
    est_step_s: float = 0.0
    rate_source: str = "conf: grid.estimate"
    # Predicted disk at its worst moment (gridrun/grid/disk.py); None for an unknown architecture.
    disk: DiskEstimate | None = None
    # The part of est_hours that is its test evaluation (one per cell).
    est_test_hours: float = 0.0

    @property
    def id(self) -> str:
        return self.cell.id

    def total_steps(self) -> int:
        return self.config.steps_to_train

    def entry(self) -> dict[str, Any]:
        """This cell's record in sweep.json (and cell.json)."""
        entry: dict[str, Any] = {
            "id": self.id,
            "kind": self.cell.kind.value,
            "coords": self.cell.coords(),
            "fingerprint": self.fingerprint,
            "total_steps": self.total_steps(),
            "resources": self.resources,
            "est_hours": round(self.est_hours, 3),
            "gpu_mem_gib": None if self.gpu_mem_gib is None else round(self.gpu_mem_gib, 1),
        }
        if self.cell.needs:
            # Cells that must be done before this one starts (dispatch.py holds it back).
            entry["needs"] = [need.id for need in self.cell.needs]
        return entry


@dataclass
class Plan:
    spec: SweepSpec
    cells: list[PlannedCell]
    launcher: dict[str, Any]
    cluster: dict[str, Any]


@dataclass
class Freeze:
    """What `freeze` did (or, for a dry run, would do) to each cell."""

    new: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    # id -> "key: old -> new" lines, for cells whose config changed (or that lost it).
    changed: dict[str, list[str]] = field(default_factory=dict)
    # Unchanged cells whose cell.json or config.yaml is damaged or missing: written again.
    repaired: list[str] = field(default_factory=list)
    # sweep.json exists but is damaged: moved aside and written again.
    sweep_damaged: bool = False


def fingerprint(config: RunConfig) -> str:
    canonical = json.dumps(config.to_dict(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def run_config(tree: dict[str, Any], cell: dict[str, Any]) -> RunConfig:
    """The trainer's part of a composed tree, with its `cell` node: what config.yaml holds."""
    # config_from_dict builds new objects and edits nothing: a cached tree can be shared.
    run_part = {key: value for key, value in tree.items() if key != "grid"}
    run_part["cell"] = cell
    return config_from_dict(run_part)


def make_plan(spec: SweepSpec, composer: Composer, measured: MeasuredStep | None = None) -> Plan:
    """Every cell of the sweep, composed and validated; nothing is written. `measured`: a
    canary's step (gridrun/grid/cost.py), which replaces the cost model's for its cell shape."""
    composed: dict[tuple[tuple[str, ...], tuple[str, ...]], dict[str, Any]] = {}
    roots: dict[tuple[tuple[str, ...], tuple[str, ...]], GridRoot] = {}
    cells: list[PlannedCell] = []
    grid: dict[str, Any] | None = None
    unused = set(spec.settings)
    for cell in expand(spec.axes, spec.restrict, list(spec.variants)):
        choices = (*cell.group_choices(), *spec.gpu_choice(cell.id, composer))
        variant = tuple(spec.variant_settings(cell.variant, cell.policy))
        if (choices, variant) not in composed:
            settings = [*spec.settings, *variant]
            composed[choices, variant], applied = _compose_cell(cell, choices, settings, composer)
            roots[choices, variant] = grid_root(composed[choices, variant]["grid"],
                                                composer.option_files([*choices, *settings]))
            unused -= set(applied)
        tree, root = composed[choices, variant], roots[choices, variant]
        if cell.kind is CellKind.TRANSFER:
            (source,) = cell.needs
            tree = {**tree, "policy": {**tree["policy"], "adapters": {"generator": sibling_cell(source.id)}}}
        elif cell.kind is CellKind.EVAL:
            tree = {**tree, "policy": {**tree["policy"], "adapters": _cell_sources(cell, tree["policy"].get("adapters") or {})}}
        try:
            config = run_config(tree, cell.cell_node())
        except ConfigError as err:
            raise GridError(f"cell {cell.id}: {err}") from None
        _check_toy_pairing(cell, config)
        _check_rows(cell.id, config, root.spec)
        _check_model(cell.id, config)
        config = _size_engine(config, root.spec.gpu)
        this_grid = {"launcher": as_dict(root.launcher), "cluster": as_dict(root.spec.cluster)}
        if grid is None:
            grid = this_grid
        elif this_grid != grid:
            raise GridError(f"cell {cell.id} has another launcher or cluster than the sweep's first cell: set them once")
        hours, step_s, rate_source, test_h = _cost(root.spec, config, measured)
        cells.append(
            PlannedCell(cell, config, fingerprint(config), _resources(root.spec), hours,
                        _fits(cell.id, config, root.spec.gpu), step_s, rate_source,
                        cell_disk(config, max(1, root.spec.gpu.gpus_per_cell)), test_h)
        )
    if unused:
        raise GridError(_unused_message(min(unused), [pc.config for pc in cells], composer))
    assert grid is not None, "expand() yields at least one cell for non-empty axes"
    return Plan(spec=spec, cells=cells, launcher=grid["launcher"], cluster=grid["cluster"])


def _cell_sources(cell: Cell, sources: dict[str, Any]) -> dict[str, str]:
    """An eval cell's adapter sources with its coordinates filled in: one sweep setting
    (`+policy.adapters.all_roles='../../../smoke/cells/{cell}@peak'`) names each cell's own
    source. {cell} is the id of the trained cell at the eval cell's coordinates (train, or
    sa_rl for `single`); {policy} is written as ids write it (ip, sp)."""
    fields = {**cell.coords(), "seed": cell.seed or 0, "policy": cell.policy_tag, "cell": cell.trained_twin().id}
    try:
        return {role: str(source).format(**fields) for role, source in sources.items()}
    except (KeyError, IndexError, ValueError) as err:
        raise GridError(
            f"cell {cell.id}: policy.adapters may name {{cell}}, {{workflow}}, {{policy}}, {{task}}, {{scale}} "
            f"and {{seed}}, not {err}"
        ) from None


def _compose_cell(
    cell: Cell, choices: tuple[str, ...], settings: list[str], composer: Composer
) -> tuple[dict[str, Any], list[str]]:
    """The cell's composed tree and the sweep settings applied to it. A setting of one
    option's own key (`workflow.n_voters=5`, `task.sandbox=none`) applies to the cells of the
    options that have it and is left out of the others (make_plan refuses one that no cell
    has); any other setting applies to every cell, and one that cannot fails naming the cell."""
    try:
        return composer.compose([*choices, *settings]), list(settings)
    except GridError as err:
        failed = err
    scoped = {line: _option_key(composer, line) for line in settings}
    common = [line for line, key in scoped.items() if key is None]
    try:
        tree = composer.compose([*choices, *common])
        kept = [line for line, key in scoped.items()
                if key is None or key[1] in _option_fields(key[0], tree[key[0]])]
        if kept == settings:
            raise failed
        return composer.compose([*choices, *kept]), kept
    except (GridError, ConfigError) as err:
        raise GridError(f"cell {cell.id}: {err}") from None


def _option_key(composer: Composer, line: str) -> tuple[str, str] | None:
    """(node, key) of a setting of an option node's own key (workflow.n_voters), else None."""
    node, _, rest = composer.parse(line).key_or_group.partition(".")
    key = rest.split(".")[0]
    return (node, key) if node in OPTION_NODES and key and key not in ("name", "plugin") else None


def _option_fields(node: str, option: dict[str, Any]) -> set[str]:
    return {f.name for f in dataclasses.fields(registry.params_class(node, option))}


def _unused_message(line: str, configs: list[RunConfig], composer: Composer) -> str:
    node, key = _option_key(composer, line) or ("", "")
    options = {getattr(config, node).name: getattr(config, node) for config in configs}
    keys = sorted({f.name for option in options.values() for f in dataclasses.fields(option)} - {"name", "plugin"})
    close = difflib.get_close_matches(key, keys, n=1)
    hint = f"did you mean '{node}.{close[0]}'?" if close else f"keys of its {node}s: {', '.join(keys) or 'none'}"
    return (f"no cell of the sweep has '{node}.{key}' ({hint}); a setting of one {node}'s own key applies to the "
            f"cells of the {node}s that have it ({', '.join(sorted(options))} planned)")


def _check_toy_pairing(cell: Cell, config: RunConfig) -> None:
    """The toy world's model runs the toy tasks only, and a toy task is no test for Qwen3."""
    if (cell.scale == TOY_SCALE) == registry.task(config.task.name, config.task.plugin).toy:
        return
    toy_tasks = [name for name in registry.task_names() if registry.task(name).toy]
    fix = f"task={'|'.join(toy_tasks)}" if cell.scale == TOY_SCALE else f"scale={TOY_SCALE}"
    raise GridError(f"scale={cell.scale} with task={cell.task}: the toy world pairs scale={TOY_SCALE} with its own "
                    f"tasks ({', '.join(toy_tasks)}) only (the toy model knows nothing else, and they are no test "
                    f"for Qwen3): set {fix}")


def _check_rows(cell_id: str, config: RunConfig, grid: GridSpec) -> None:
    """Refuse a training cell whose longest possible row (one call's prompt plus response
    at its limits) exceeds its micro-batch token budget: the update never splits a row."""
    from gridrun.memory import longest_row

    row, budget = longest_row(config), config.train.micro_token_budget
    if not config.trains or row <= budget:
        return
    # Another GPU class whose budget holds the row (gpu=cpu is no fix for a GPU cell).
    roomier = sorted((int(r["micro_token_budget"]), name) for name, r in grid.scale_gpu.get(grid.scale, {}).items()
                     if name not in (grid.gpu.name, "cpu") and int(r["micro_token_budget"]) >= row)
    fixes = [f"gpu={roomier[0][1]} (budget {roomier[0][0]})"] if roomier else []
    fixes += [f"train.micro_token_budget>={row}", "lower lengths.max_prompt_tokens or lengths.max_response_tokens"]
    raise GridError(
        f"cell {cell_id}: its longest row ({config.lengths.max_prompt_tokens} + {config.lengths.max_response_tokens} = "
        f"{row} tokens) exceeds train.micro_token_budget={budget} ({grid.scale} on {grid.gpu.name}) and a row is "
        f"never split: set {' or '.join(fixes)}"
    )


def _check_model(cell_id: str, config: RunConfig) -> None:
    """Refuse a cell its model cannot run: calls longer than its context window, a
    conversation its family's template refuses, LoRA on a vision tower (gridrun/grid/templates.py,
    gridrun/arch/families.py)."""
    problem = (templates.context_problem(config) or templates.alternation_problem(config)
               or families.lora_scope_problem(config.model.name_or_path, config.lora.target_modules))
    if problem:
        raise GridError(f"cell {cell_id}: {problem}")


def _size_engine(config: RunConfig, gpu: GpuSpec) -> RunConfig:
    """A vLLM cell planned for a GPU class without its own engine.gpu_memory_utilization
    gets the memory model's share beside its trainer (gridrun/memory.py engine_share), so
    that config.yaml holds the number its engine starts with."""
    from gridrun.memory import architecture, engine_share

    engine = config.engine
    if not isinstance(engine, VLLMParams) or engine.gpu_memory_utilization is not None or not gpu.gpus_per_cell:
        return config
    arch = architecture(config)
    if arch is None:
        return config
    share = engine_share(config, gpu.memory_gib, arch)
    # A trainer that leaves the engine nothing is refused by the fit check, naming it.
    return dataclasses.replace(config, engine=dataclasses.replace(engine, gpu_memory_utilization=max(share, 0.0)))


def _fits(cell_id: str, config: RunConfig, gpu: GpuSpec) -> float | None:
    """The largest phase's predicted GiB per GPU; refuses a cell with a phase the card's
    usable memory cannot hold, naming the knob to turn (gridrun/memory.py fit_problem)."""
    from gridrun.memory import GIB, architecture, fit_problem, predict

    arch = architecture(config)
    if not gpu.gpus_per_cell or arch is None:
        return None
    estimate = predict(config, gpu.memory_gib, arch)
    problem = fit_problem(config, estimate)
    if problem:
        raise GridError(f"cell {cell_id} cannot fit on {gpu.name}: {problem}, or pick a larger gpu=")
    return estimate.peak / GIB


def _resources(grid: GridSpec) -> dict[str, Any]:
    gpu, cluster = grid.gpu, grid.cluster
    return {
        "gpu_class": gpu.name,
        "gpus": gpu.gpus_per_cell,
        "gpu_memory_gib": gpu.memory_gib,
        "nodes": 1,
        "cpus": cluster.cpus_per_cell,
        "mem_gb": cluster.mem_gb_per_cell,
        "time_limit_h": cluster.time_limit_h,
        "partition": cluster.partitions.get(gpu.name),
        **({"binding_only": True} if gpu.binding_only else {}),
    }


def _cost(grid: GridSpec, config: RunConfig, measured: MeasuredStep | None) -> tuple[float, float, str, float]:
    """(hours of one attempt, seconds of a training step, the update rate's source, the hours
    of its test evaluation): the cost model's (gridrun/grid/cost.py) with a canary's measured
    step for its shape; conf's rough rates (grid.estimate) where the model has nothing to go
    on (the toy world on CPU)."""
    gpu = grid.gpu
    predicted = cost.step_cost(config, gpu.name, gpu.gpus_per_cell, gpu.memory_gib)
    if predicted is None:
        step_s = grid.estimate.step_s * grid.estimate.relative_cost
        val_h = step_s * grid.estimate.val_cost / 3600
        test_h = cost.TEST_OVER_VAL * val_h
        return step_s * config.steps_to_train / 3600 + config.planned_validations * val_h + test_h, step_s, \
            "conf: grid.estimate", test_h
    if measured is not None:
        predicted = dataclasses.replace(predicted, measured_step=measured.step_for(config, gpu.name))
    return cost.cell_hours(config, predicted), predicted.step_s, predicted.source, cost.test_hours(predicted)


# --- freezing --------------------------------------------------------------------------------
def check(plan: Plan, sweep: SweepDir, replace: bool) -> Freeze:
    """Each cell's fate against what is on disk (new, unchanged, changed, replaced); reads only."""
    result = Freeze()
    planned: list[str] = []
    if sweep.exists():
        try:
            planned = sweep.cell_ids()  # refuses a directory that holds another sweep
        except SweepDamaged:
            result.sweep_damaged = True
    known = set(planned) | {pc.id for pc in plan.cells}
    for pc in plan.cells:
        missing = [need for need in pc.cell.needs if need.id not in known]
        if missing:
            raise GridError(
                f"{pc.id} needs {missing[0].id}, which is neither in this plan nor in sweep '{sweep.name}': "
                f"plan it too (add {missing[0].kind} to kind=)"
            )
    on_disk = {pc.id: sweep.cell(pc.id) for pc in plan.cells if sweep.cell(pc.id).root.is_dir()}
    states = observe({cell_id: live_state(rd) for cell_id, rd in on_disk.items()})
    for pc in plan.cells:
        run_dir = on_disk.get(pc.id)
        if run_dir is None or not any(run_dir.root.iterdir()):
            result.new.append(pc.id)
            continue
        deleted = not run_dir.config_yaml.is_file() and (not _holds_run(run_dir) or not run_dir.cell_json.exists())
        if deleted and not _busy(states[pc.id], run_dir):
            # What a deleted cell leaves (logs, state.json, samples; metric rows a run wrote
            # while `rm -rf` ran, with neither config.yaml nor cell.json to say what it ran):
            # kept, moved aside like a replaced run, and the cell is planned afresh.
            result.replaced.append(pc.id)
            continue
        if not run_dir.config_yaml.is_file():
            # Its history (metrics, checkpoints) would restart under a config never compared
            # with the one it ran: refused like a changed config.
            result.changed[pc.id] = ["config.yaml is missing but the folder holds a run"]
        elif _recorded_fingerprint(run_dir) == pc.fingerprint:
            result.unchanged.append(pc.id)
            if _needs_repair(run_dir):
                result.repaired.append(pc.id)
            continue
        elif _migrated_fingerprint(run_dir) == pc.fingerprint:
            # Planned by an older gridrun, unchanged once read by today's schema: written
            # again in full (config.yaml, cell.json's schema and fingerprint), its run kept.
            result.unchanged.append(pc.id)
            result.repaired.append(pc.id)
            continue
        else:
            result.changed[pc.id] = _differences(run_dir, pc.config)
        if replace and not _busy(states[pc.id], run_dir):
            result.replaced.append(pc.id)
    return result


def _busy(record: StateRecord, run_dir: RunDir) -> bool:
    """Queued or running, as observed; a folder that lost its config.yaml reads missing, and
    then its run lock says whether a process still runs in it."""
    return record.active or run_dir.held()


def _holds_run(run_dir: RunDir) -> bool:
    """Whether a cell folder holds a run's results: metric rows or a checkpoint."""
    return run_dir.metrics_jsonl.exists() or (run_dir.checkpoints_dir.is_dir() and any(run_dir.checkpoints_dir.iterdir()))


def _refuse(result: Freeze, sweep: SweepDir, replace: bool) -> None:
    if result.changed and not replace:
        shown = list(result.changed.items())[:5]
        lines = "\n".join(f"  {cell_id}: {'; '.join(diff[:4]) or 'fingerprint differs'}" for cell_id, diff in shown)
        more = f"\n  ... and {len(result.changed) - len(shown)} more" if len(result.changed) > len(shown) else ""
        raise GridError(
            f"{len(result.changed)} cell(s) of '{sweep.name}' hold a run of another config:\n{lines}{more}\n"
            "re-plan with --replace to move their old runs to replaced/ and start them afresh, "
            "or plan into another --results-dir"
        )
    active = [cell_id for cell_id in result.changed if cell_id not in result.replaced]
    if active:
        raise GridError(
            f"{len(active)} changed cell(s) are queued or running ({', '.join(active[:3])}): cancel them first "
            f"(`gridrun cancel conf={sweep.name} --cells ...`), then re-plan with --replace"
        )


def freeze(plan: Plan, sweep: SweepDir, replace: bool = False) -> Freeze:
    """Write the plan to disk (call under `sweep.lock()`); nothing is written if refused."""
    result = check(plan, sweep, replace)
    _refuse(result, sweep, replace)
    provenance = _provenance()
    now = time.time()
    for pc in track(plan.cells, f"writing {len(plan.cells)} cells"):
        run_dir = sweep.cell(pc.id)
        if pc.id in result.repaired:
            _write_record(run_dir, pc, plan, sweep, now, provenance)
        if pc.id in result.unchanged:
            continue
        if pc.id in result.replaced:
            target = sweep.replaced(pc.id)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(run_dir.root), str(target))
        run_dir.root.mkdir(parents=True, exist_ok=True)
        # state.json last: a cell cut short here (a full disk) has no history and is re-planned.
        _write_record(run_dir, pc, plan, sweep, now, provenance)
        run_dir.record(cellstate.planned(pc.total_steps()))
    if result.sweep_damaged:
        sweep.set_aside_damaged()
    data: dict[str, Any] = (
        sweep.read().to_json() if sweep.exists() else {"name": sweep.name, "created_at": now, "cells": [], "plans": []}
    )
    index = {cell["id"]: i for i, cell in enumerate(data["cells"])}
    for pc in plan.cells:
        if pc.id in index:
            data["cells"][index[pc.id]] = pc.entry()
        else:
            data["cells"].append(pc.entry())
    data.update(source=str(plan.spec.source), launcher=plan.launcher, cluster=plan.cluster, updated_at=now)
    if plan.spec.early_warning is not None:
        data["early_warning"] = plan.spec.early_warning.to_dict()
    if plan.spec.analysis is not None:
        data["analysis"] = plan.spec.analysis.to_dict()
    data["plans"].append({"at": now, "argv": plan.spec.argv, "cells": len(plan.cells), **provenance})
    sweep.write(data)
    return result


def _write_record(
    run_dir: RunDir, pc: PlannedCell, plan: Plan, sweep: SweepDir, now: float, provenance: dict[str, Any]
) -> None:
    """config.yaml and cell.json of a planned cell (with config.yaml's hash, checked by every reader)."""
    text = dump_config(pc.config)
    atomic_write_text(run_dir.config_yaml, text)
    atomic_write_json(
        run_dir.cell_json,
        {**pc.entry(), "sweep": sweep.name, "planned_at": now, "settings": plan.spec.settings,
         "config_sha256": config_digest(text.encode("utf-8")), "schema": SCHEMA_VERSION, **provenance},
    )


def _config_fingerprint(run_dir: RunDir) -> str | None:
    try:
        return fingerprint(load_config(run_dir.config_yaml))
    except (ConfigError, ValueError):  # ValueError: not UTF-8
        return None


def _recorded_fingerprint(run_dir: RunDir) -> str | None:
    """cell.json's fingerprint, else that of the config.yaml on disk (None if neither reads)."""
    try:
        record = run_dir.read_record()
    except DamagedFile:
        record = None
    if record and record.get("fingerprint"):
        return str(record["fingerprint"])
    return _config_fingerprint(run_dir)


def _schema_of(run_dir: RunDir) -> int:
    """The run schema's version a cell was planned under (1: before cell.json recorded it)."""
    try:
        record = run_dir.read_record()
    except DamagedFile:
        return SCHEMA_VERSION
    return int((record or {}).get("schema", 1))


def _migrated_config(run_dir: RunDir) -> RunConfig | None:
    """The config.yaml of a cell planned under an older schema, read as today's schema reads
    it (runconfig.MIGRATIONS); None for a current cell or one whose config does not load."""
    version = _schema_of(run_dir)
    if version >= SCHEMA_VERSION:
        return None
    try:
        tree = yaml.safe_load(run_dir.config_yaml.read_bytes().decode("utf-8"))
        return config_from_dict(migrate(tree, version)) if isinstance(tree, dict) else None
    except (yaml.YAMLError, UnicodeDecodeError, ConfigError):
        return None


def _migrated_fingerprint(run_dir: RunDir) -> str | None:
    config = _migrated_config(run_dir)
    return None if config is None else fingerprint(config)


def _needs_repair(run_dir: RunDir) -> bool:
    """Whether an unchanged cell's cell.json or config.yaml is missing or damaged."""
    try:
        record = run_dir.read_record()
    except DamagedFile:
        return True
    return (record is None or not record.get("fingerprint") or _config_fingerprint(run_dir) != record["fingerprint"]
            or run_dir.config_damage() is not None)


def _differences(run_dir: RunDir, new: RunConfig) -> list[str]:
    """`key: old -> new` for every leaf that differs between the cell's config and `new`."""
    try:
        old = yaml.safe_load(run_dir.config_yaml.read_bytes().decode("utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError):
        return ["config.yaml is damaged (not YAML text)"]
    if not isinstance(old, dict):
        return ["config.yaml is damaged (not a mapping)"]
    migrated = _migrated_config(run_dir)  # an older cell: its keys added since, as it ran them
    old_flat, new_flat = _leaves(old if migrated is None else migrated.to_dict()), _leaves(new.to_dict())
    keys = list(new_flat) + [key for key in old_flat if key not in new_flat]
    return [
        f"{key}: {old_flat.get(key, '<absent>')!r} -> {new_flat.get(key, '<absent>')!r}"
        for key in keys
        if old_flat.get(key, "<absent>") != new_flat.get(key, "<absent>")
    ]


def _leaves(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict) and tree:
        found: dict[str, Any] = {}
        for key, value in tree.items():
            found.update(_leaves(value, f"{prefix}{key}."))
        return found
    return {prefix.rstrip("."): tree}


def _provenance() -> dict[str, Any]:
    """Git commit and package versions, recorded with each cell."""
    repo = checkout()

    def git(*args: str) -> str | None:
        if repo is None:  # installed as a wheel: its version below says which gridrun
            return None
        try:
            out = subprocess.run(
                ["git", "-C", str(repo), *args], check=False, capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in VERSIONED:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"git": {"commit": git("rev-parse", "HEAD"), "dirty": bool(status) if status is not None else None}, "versions": versions}


# --- drawing (rich) ------------------------------------------------------------------------
def plan_table(plan: Plan, preview: Freeze, sweep: SweepDir) -> Any:
    """The dry run's table: each cell, what planning would do to it, its resources and cost
    (s/step at its own batch, the update rate's provenance: m measured, c the canary's step,
    ~ modelled, conf conf/'s rough rate), and the sweep's node-days under the table."""
    from rich.table import Table

    from gridrun.grid.launchers.slurm import requeue_budgets, requeue_lines

    # On a SLURM profile, each cell's segments at the time limit and its requeue budget.
    budgets = requeue_budgets([PlanEntry.from_json(pc.entry()) for pc in plan.cells], plan.cluster, plan.launcher)
    table = Table(title=f"plan of sweep {sweep.name} -> {sweep.root}",
                  caption="\n".join([*cost_lines(plan), *requeue_lines(budgets, plan.cluster), *detector_lines(plan),
                                      *detectable_lines(plan)]),
                  title_justify="left", caption_justify="left")
    numeric = ("cpus", "mem GB", "GPU GiB", "disk GB", "s/step", "hours", "segs", "requeues")
    columns = ("cell", "kind", "plan", "gpus", "partition", "cpus", "mem GB", "GPU GiB", "disk GB", "s/step", "rate",
               "hours", *(("segs", "requeues") if budgets else ()))
    for column in columns:
        table.add_column(column, justify="right" if column in numeric else "left", no_wrap=True)
    for pc in plan.cells:
        if pc.id in preview.replaced:
            fate = "[yellow]replace[/]"
        elif pc.id in preview.changed:
            fate = "[red]changed[/]"
        elif pc.id in preview.unchanged:
            fate = f"keep ({sweep.cell(pc.id).inspect().state})"
        else:
            fate = "[green]new[/]"
        res = pc.resources
        table.add_row(
            pc.id,
            pc.cell.kind,
            fate,
            f"{res['gpus']}x {res['gpu_class']}" if res["gpus"] else "cpu",
            res["partition"] or "",
            str(res["cpus"]),
            str(res["mem_gb"]),
            "" if pc.gpu_mem_gib is None else f"{pc.gpu_mem_gib:.1f}/{res['gpu_memory_gib']}",
            "" if pc.disk is None else f"{pc.disk.results / GB:.1f}",
            f"{pc.est_step_s:,.0f}" if pc.total_steps() else "-",
            _rate_mark(pc.rate_source),
            f"{pc.est_hours:.2f}",
            *((str(budgets[pc.id].segments), str(budgets[pc.id].requeues)) if pc.id in budgets else
              ("", "") if budgets else ()),
        )
    return table


def detector_lines(plan: Plan) -> list[str]:
    """The collapse detector as an option: the share of training steps its stops saved in
    the collapse study (gridrun/grid/detector_savings.json), applied to this plan's trained
    cells' node-days. A toy rate: a sweep's own falls decide what it saves."""
    savings = cost.detector_savings()
    trained = [pc for pc in plan.cells if pc.total_steps() and pc.resources["gpus"]]
    if savings is None or not trained:
        return []
    share = savings["steps_saved"] / savings["steps"]
    days = cost.node_days(pc.est_hours for pc in trained)
    chosen = all(pc.config.train.fall_alert and pc.config.train.on_alert == "stop" for pc in trained)
    how = "chosen (train.fall_alert=true train.on_alert=stop)" if chosen else "option train.fall_alert=true train.on_alert=stop"
    return [(f"{how}: the collapse study's stops saved {100 * share:.1f}% of its training steps ({savings['stopped']} of "
            f"{savings['cells']} toy cells stopped, peak kept in {savings['peaks_kept']}; {savings['source']}): at that "
            f"rate ~{share * days:,.1f} of the trained cells' ~{days:,.1f} node-days (not subtracted above: the "
            "sweep's own falls decide)")]


def detectable_lines(plan: Plan) -> list[str]:
    """With the sweep file's `analysis:`, the smallest difference each of Table 1's seed-level
    comparisons (IP - SP, multi-agent - SA-RL: one cell's seeds against another's) can show
    with this sweep's seeds, and the seeds a target difference needs (significance.py)."""
    analysis = plan.spec.analysis
    if analysis is None:
        return []
    seeds = len(plan.spec.axes["seed"])
    sd = analysis.seed_sd_pp
    how = (f"two-sided {FALSE_ALARM:.0%}, {POWER:.0%} power, a seed-to-seed SD of {sd:g} points per cell assumed in "
           "the sweep's analysis section; collect measures it")
    if seeds > 1:
        # The test collect will run: Student's t over the seeds' spread, measured.
        least = detectable_difference(sd, seeds, measured=True)
        lines = [(f"detectable: IP - SP and multi-agent - SA-RL differences of {least:.1f}+ points with {seeds} seeds "
                 f"per cell ({how})")]
    else:
        # One seed measures no spread: no test over seeds exists, whatever the difference.
        least = detectable_difference(sd, 1, measured=False)
        lines = [(f"detectable: nothing over seeds with 1 seed per cell (one seed measures no spread); were the spread "
                 f"known, IP - SP and multi-agent - SA-RL differences of {least:.1f}+ points ({how})")]
    if analysis.target_pp is not None:
        needed = next((n for n in range(2, 1001) if (d := detectable_difference(sd, n, measured=True)) is not None
                       and d <= analysis.target_pp), None)
        if seeds > 1 and least is not None and least <= analysis.target_pp:
            lines.append(f"  a {analysis.target_pp:g}-point difference: {seeds} seeds per cell can show it")
        else:
            lines.append(f"  a {analysis.target_pp:g}-point difference: {seeds} seed(s) per cell cannot show it; "
                         + (f"{needed} seeds per cell can" if needed else "no count up to 1,000 seeds can"))
    return lines


def _rate_mark(source: str) -> str:
    return {"measured": "m", "canary": "c", "modelled": "~"}.get(source.split(":")[0], "conf")


def cost_lines(plan: Plan) -> list[str]:
    """The plan's cost under the dry run's table: cells, node-days and GPU-hours, the mean
    s/step of the trained cells, and which rates are measured and which modelled."""
    cells = plan.cells
    kinds: dict[str, int] = {}
    for pc in cells:
        kinds[pc.cell.kind] = kinds.get(pc.cell.kind, 0) + 1
    gpu_hours = sum(pc.est_hours * pc.resources["gpus"] for pc in cells)
    days = cost.node_days(pc.est_hours for pc in cells if pc.resources["gpus"])
    trained = [pc for pc in cells if pc.total_steps()]
    if gpu_hours:
        mean = sum(pc.est_step_s for pc in trained) / len(trained) if trained else 0.0
        total = (f"~{days:,.1f} node-days (~{gpu_hours:,.0f} GPU-hours; {len(trained)} trained cells at "
                 f"~{mean:,.0f} s/step on average; the paper: ~{cost.PAPER_NODE_DAYS:.0f} node-days, "
                 f"~{cost.PAPER_STEP_S:.0f} s/step)")
    else:
        cpu_hours = sum(pc.est_hours * pc.resources["cpus"] for pc in cells)
        total = f"~{cpu_hours:,.1f} CPU-hours"
    head = (f"{len(cells)} cells ({', '.join(f'{n} {kind}' for kind, n in kinds.items())}), {total} for one "
            f"attempt each, launcher={plan.launcher['name']}, cluster={plan.cluster['name']}")
    hours = sum(pc.est_hours for pc in cells)
    test = sum(pc.est_test_hours for pc in cells)
    share = (f"  of which the test evaluations (one per cell, the peak's checkpoint on the test split): "
             f"{100 * test / hours:.1f}%")
    lines = [head] + ([share] if hours else [])
    by_source: dict[str, list[str]] = {}
    for pc in cells:
        scale = (pc.cell.coords().get("scale") or "?") + f"/{pc.resources['gpu_class']}"
        if scale not in by_source.setdefault(pc.rate_source, []):
            by_source[pc.rate_source].append(scale)
    for source, scales in sorted(by_source.items(), key=lambda item: _rate_mark(item[0])):
        lines.append(f"  \\[{_rate_mark(source)}] {', '.join(scales)}: {source}")
    if any(source.split(":")[0] != "conf" for source in by_source):
        lines.append("  rollouts everywhere: modelled (decode at the GPU's memory bandwidth, gridrun/grid/cost.py) "
                     "unless a canary measured the cell's shape \\[c]")
    disks = [pc.disk for pc in cells if pc.disk is not None]
    if disks:
        lines.append(f"disk: ~{sum(d.results for d in disks) / GB:,.1f} GB under the results folder with every cell at "
                     f"its worst moment (disk GB: kept checkpoints + the peak's + a save's temporary copy), up to "
                     f"{max(d.tmp for d in disks) / GB:,.1f} GB of TMPDIR per node (vLLM's adapter versions; "
                     f"docs/real-scale.md says where both should live)")
    return lines
