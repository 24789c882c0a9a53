"""Registries of workflows, tasks and engines: each option's name, the settings its config
node takes (a params dataclass) and where its code lives, declared in the option's own module.

The built-in options register themselves when their module is imported: every module in
`gridrun/workflows/`, the tasks of BUILTIN_MODULES (gridrun/tasks/ also holds modules that are
no task) and the engines of `gridrun/engine_params.py`. They are imported on the first lookup, not
with this module, so the seam stays cheap to import. An option from a user's module is found the same way in every process
(the grid at plan time, `gridrun run` in the cell's subprocess): its config node names that
module in `plugin:` (a dotted module name importable there, or an absolute path to a .py
file), which is imported before the node is read and frozen into the cell's config.yaml.

Role prompts are keyed by role name: a task's prompts class has one method per role it knows;
a workflow whose roles a task does not know adds builders for them with `add_prompts`, and a
workflow/task pair with a prompt missing is refused at plan time naming the role.

Standard library only (tests/test_seam.py checks). Left out: running anything (the workflow
programs take duck-typed episodes; the engines' implementations live in gridrun/train/engines/).
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import pkgutil
import sys
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from gridrun.seam.errors import UserError

# Modules holding the built-in tasks and engines, imported on the first lookup with every
# module of the WORKFLOWS_PACKAGE.
WORKFLOWS_PACKAGE = "gridrun.workflows"
BUILTIN_MODULES = (
    "gridrun.tasks.arith",
    "gridrun.tasks.math",
    "gridrun.tasks.code",
    "gridrun.engine_params",
)



class ConfigError(UserError, ValueError):
    """A config that cannot be run; the message names the key and the fix."""


@dataclass
class OptionParams:
    """A workflow, task or engine config node: its option's name, the module that registers
    it when that is not gridrun itself, and (in subclasses) only that option's settings."""

    name: str
    # Module registering this option (dotted name or absolute .py path); null: built in.
    plugin: str | None = None


@dataclass
class WorkflowParams(OptionParams):
    pass


@dataclass
class TaskParams(OptionParams):
    pass


@dataclass
class EngineParams(OptionParams):
    pass


# (llm, episode, task, params, protocol) -> None: the workflow's async program over `llm.chat`;
# protocol is the cell's ProtocolSpec (gridrun/seam/runconfig.py): what roles see, how outputs are read.
Program = Callable[[Any, Any, Any, Any, Any], Coroutine[Any, Any, None]]
# (episodes, correct(turn) -> bool, params) -> validation metrics without the `val/` prefix.
WorkflowMetrics = Callable[[list[Any], Callable[[Any], bool], Any], dict[str, float]]
# (episode, score(turn) -> the task's Score of that answering turn's own text) -> each turn's
# training reward under reward.credit=per_role, in the order of episode.turns.
RoleCredit = Callable[[Any, Callable[[Any], Any]], list[float]]


@dataclass(frozen=True)
class Workflow:
    name: str
    # Role types, in the order their adapters are created under Isolated-Policy.
    roles: tuple[str, ...]
    params: type[WorkflowParams]
    run: Program
    # The role played by several parallel slots (voters, workers), if any, and the params
    # field holding how many.
    parallel_role: str | None = None
    slots_field: str | None = None
    # Whether the parallel slots are distinct trajectories (the released code names Voting's
    # voters generator0/1/2) or one (Orch-Workers' three workers are all `worker`).
    distinct_slots: bool = False
    # Prompt builders it asks the task for; empty: one per role.
    prompts: tuple[str, ...] = ()
    # Roles whose every turn commits to an answer of the task (scored as role/<r>/acc).
    answer_roles: tuple[str, ...] = ()
    # Its own validation metrics (an evaluator's verdict accuracy, ...), if any.
    metrics: WorkflowMetrics | None = None
    # Its per-role rewards (reward.credit=per_role), if it defines them; it may score only
    # turns of answer_roles.
    credit: RoleCredit | None = None
    # The single-agent workflow (one, `single`): the SA-RL control and its base control run
    # it; it trains as kind sa_rl, never train, and has no policy axis.
    single_agent: bool = False

    def slots(self, params: WorkflowParams) -> int:
        """Same-role multiplicity of parallel_role (1 without one)."""
        return int(getattr(params, self.slots_field)) if self.slots_field else 1

    def prompt_names(self) -> tuple[str, ...]:
        return self.prompts or self.roles

    def trajectory_name(self, turn: Any) -> str:
        """The released code's trajectory name of a turn: its advantage group within a problem.

        Every Eval-Opt turn is its own trajectory named after its role, so all of a problem's
        generator turns (every round, every episode) form one group."""
        if self.distinct_slots and turn.role == self.parallel_role:
            return f"{turn.role}{turn.slot}"
        return str(turn.role)


@dataclass(frozen=True)
class Task:
    name: str
    params: type[TaskParams]
    # The task's prompts class: one public method per role (or turn) it writes prompts for.
    prompts: type
    # Builds the task (loads its data) from its params.
    build: Callable[[Any], Any]
    # Whether it runs on the toy world (its text within the toy tokenizer's and model's reach);
    # the grid pairs scale=toy with these tasks only.
    toy: bool = False

    def prompt_names(self) -> set[str]:
        own = {n for n in dir(self.prompts) if not n.startswith("_") and n != "add" and callable(getattr(self.prompts, n))}
        return own | set(_EXTRA_PROMPTS.get(self.name, {}))


@dataclass(frozen=True)
class Engine:
    name: str
    params: type[EngineParams]
    # "module:function" in the train half, called with (config, model, tokenizer, adapters).
    factory: str


EntryT = TypeVar("EntryT", Workflow, Task, Engine)
# A registry of named functions (estimators, policy losses) that `named` resolves.
NamedT = TypeVar("NamedT")


@dataclass
class _Registry(Generic[EntryT]):
    kind: str
    entries: dict[str, EntryT] = field(default_factory=dict)


_WORKFLOWS: _Registry[Workflow] = _Registry("workflow")
_TASKS: _Registry[Task] = _Registry("task")
_ENGINES: _Registry[Engine] = _Registry("engine")
_REGISTRIES: dict[str, _Registry[Any]] = {"workflow": _WORKFLOWS, "task": _TASKS, "engine": _ENGINES}
_EXTRA_PROMPTS: dict[str, dict[str, Callable[..., Any]]] = {}
_loaded_builtins = False
_loaded_plugins: set[str] = set()


def _register(registry: _Registry[EntryT], entry: EntryT) -> EntryT:
    known = registry.entries.get(entry.name)
    if known is not None and known.params.__qualname__ != entry.params.__qualname__:
        raise ConfigError(f"{registry.kind} '{entry.name}' is registered twice ({known.params.__module__} and "
                          f"{entry.params.__module__}): rename one")
    registry.entries[entry.name] = entry
    return entry


def register_workflow(workflow: Workflow) -> Workflow:
    if workflow.parallel_role and workflow.parallel_role not in workflow.roles:
        raise ConfigError(f"workflow '{workflow.name}': parallel_role '{workflow.parallel_role}' is not one of its roles")
    return _register(_WORKFLOWS, workflow)


def register_task(task: Task) -> Task:
    return _register(_TASKS, task)


def register_engine(engine: Engine) -> Engine:
    return _register(_ENGINES, engine)


def add_prompts(task: str, **builders: Callable[..., Any]) -> None:
    """Prompt builders for roles the task's own prompts class does not have (a new
    workflow's roles), keyed by role name."""
    _EXTRA_PROMPTS.setdefault(task, {}).update(builders)


def extra_prompts(task: str) -> dict[str, Callable[..., Any]]:
    return dict(_EXTRA_PROMPTS.get(task, {}))


def _load_builtins() -> None:
    global _loaded_builtins
    if not _loaded_builtins:
        _loaded_builtins = True
        package = importlib.import_module(WORKFLOWS_PACKAGE)
        workflows = [f"{WORKFLOWS_PACKAGE}.{m.name}" for m in pkgutil.iter_modules(package.__path__)]
        for module in [*workflows, *BUILTIN_MODULES]:
            importlib.import_module(module)


def load_plugin(plugin: str) -> None:
    """Import the module that registers an option: a dotted module name, or an absolute path
    to a .py file (loaded once per process). A module that fails to import is a one-line
    ConfigError naming the plugin, and leaves nothing half-loaded in sys.modules."""
    if plugin in _loaded_plugins:
        return
    if plugin.endswith(".py"):
        path = Path(plugin)
        if not path.is_absolute():
            raise ConfigError(f"plugin '{plugin}': give the module file as an absolute path (or a dotted module name)")
        if not path.is_file():
            raise ConfigError(f"plugin '{plugin}' does not exist: fix the path in the option's `plugin:` key")
        name = f"gridrun_plugin_{path.stem}_{hashlib.sha1(plugin.encode()).hexdigest()[:8]}"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except (Exception, SystemExit) as err:  # noqa: BLE001 - any error of a user's module (a sys.exit too) is its own
            del sys.modules[name]
            raise ConfigError(_failed(plugin, err)) from None
    else:
        try:
            importlib.import_module(plugin)
        except ModuleNotFoundError as err:
            if err.name is None or not (plugin == err.name or plugin.startswith(f"{err.name}.")):
                raise ConfigError(_failed(plugin, err)) from None  # a module the plugin imports is missing
            raise ConfigError(f"plugin '{plugin}' cannot be imported ({err}): put it on PYTHONPATH or give "
                              "an absolute path to its .py file") from None
        except (Exception, SystemExit) as err:  # noqa: BLE001 - any error of a user's module (a sys.exit too) is its own
            raise ConfigError(_failed(plugin, err)) from None
    _loaded_plugins.add(plugin)


def check_named(knob: str, name: str, built_in: Sequence[str], kind: str) -> None:
    """Plan time, without importing the module (it may need torch): `name` is a built-in, or
    "<module>:<name>" whose module exists. Whether the module registers `name` is checked
    where it is loaded (`named`), before the model."""
    module, _, short = name.rpartition(":")
    if not module:
        if name not in built_in:
            raise ConfigError(f"{knob}: no {kind} '{name}' (built in: {', '.join(built_in)}); a module's own is "
                              "named <module>:<name>")
        return
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found or not short:
        raise ConfigError(f"{knob}='{name}': module '{module}' cannot be found" if not found else
                          f"{knob}='{name}': name the {kind} after the colon, <module>:<name>")


def named(knob: str, name: str, registered: Mapping[str, NamedT], kind: str, decorator: str) -> NamedT:
    """The entry of `registered` that `name` names: a registered name, or "<module>:<name>",
    whose module is imported first (load_plugin: it registers the entry). One ConfigError line
    otherwise, naming `knob`, what is registered and how to add one (`decorator`)."""
    module, _, short = name.rpartition(":")
    if module:
        try:
            load_plugin(module)
        except ConfigError as err:
            raise ConfigError(f"{knob}='{name}': {err}") from None
    if short not in registered:
        raise ConfigError(f"{knob}: no {kind} '{short}' (registered: {', '.join(sorted(registered))}); add one with "
                          f"@{decorator} and name it <module>:<name>")
    return registered[short]


def _failed(plugin: str, err: BaseException) -> str:
    first = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return f"plugin '{plugin}' failed while importing ({type(err).__name__}: {first}): fix that module"


def _lookup(registry: _Registry[EntryT], name: str, plugin: str | None = None) -> EntryT:
    _load_builtins()
    if plugin:
        load_plugin(plugin)
    entry = registry.entries.get(name)
    if entry is None:
        names = sorted(registry.entries)
        close = difflib.get_close_matches(name, names, n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"registered: {', '.join(names)}"
        raise ConfigError(f"unknown {registry.kind} '{name}' ({hint}); an option from your own module names it "
                          f"in {registry.kind}.plugin")
    return entry


def workflow(name: str, plugin: str | None = None) -> Workflow:
    return _lookup(_WORKFLOWS, name, plugin)


def task(name: str, plugin: str | None = None) -> Task:
    return _lookup(_TASKS, name, plugin)


def engine(name: str, plugin: str | None = None) -> Engine:
    return _lookup(_ENGINES, name, plugin)


def single_agent_workflow() -> str:
    """The name of the single-agent workflow (the entry with `single_agent`)."""
    _load_builtins()
    (name,) = (entry.name for entry in _WORKFLOWS.entries.values() if entry.single_agent)
    return name


def workflow_names() -> list[str]:
    _load_builtins()
    return sorted(_WORKFLOWS.entries)


def task_names() -> list[str]:
    _load_builtins()
    return sorted(_TASKS.entries)


def params_classes(kind: str) -> dict[str, type[OptionParams]]:
    """Every option of a kind loaded so far (the built-ins and the plugins imported), by name."""
    _load_builtins()
    return {name: entry.params for name, entry in _REGISTRIES[kind].entries.items()}


def params_class(kind: str, node: dict[str, Any]) -> type[OptionParams]:
    """The params dataclass of the option a workflow/task/engine config node names."""
    name, plugin = node.get("name"), node.get("plugin")
    if not isinstance(name, str):
        raise ConfigError(f"{kind}.name: expected the name of a {kind}, got {name!r}")
    if plugin is not None and not isinstance(plugin, str):
        raise ConfigError(f"{kind}.plugin: expected a module name or .py path, got {plugin!r}")
    params: type[OptionParams] = _lookup(_REGISTRIES[kind], name, plugin).params
    return params
