"""The seam's run schema: what `gridrun run <run_dir>` reads from a cell's `config.yaml`.

A cell's `config.yaml` is fully resolved (no interpolation, no defaults list): the grid
side composes it with Hydra and validates it here at plan time, before anything is written;
the trainer only parses it into these dataclasses. Unknown keys and wrong types are rejected
with an error that names the key and the closest valid one, because a typo'd key silently
falling back to a default would train the wrong cell.

The workflow, task and engine nodes are each the params dataclass of the option they name,
taken from its registry (gridrun/registry.py): `workflow.rounds` exists on an eval_opt
config only. The dataclass defaults are the only defaults; the dumped config.yaml, and the
fingerprint hashed from it, holds every field with its default filled in.

It sits beside `rundir.py`, not in either half, because both halves import it: it imports
only the standard library (no torch, no Hydra; tests/test_seam.py checks). Left out: the
composition itself (gridrun/grid/compose.py) and what each field does at run time.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

from gridrun import registry
from gridrun.registry import ConfigError as ConfigError  # noqa: PLC0414 - re-exported: both halves catch it here
from gridrun.registry import EngineParams, OptionParams, TaskParams, WorkflowParams

T = TypeVar("T")
P = TypeVar("P", bound=OptionParams)


@dataclass
class CellSpec:
    id: str
    # shuffled: the reward control, trained as its train (or sa_rl, workflow single) twin with
    # each step's episode rewards permuted across the step's episodes.
    kind: Literal["train", "sa_rl", "base", "transfer", "shuffled"] = "train"
    seed: int = 0


@dataclass
class ToySpec:
    """Recipe of the embedded toy world; its hash keys the build cache. These defaults are the
    recipe's only values: conf/scale/toy.yaml takes them from here (through Hydra's store)."""

    # Seed of the toy model's build, not the cell's: every cell shares one base model, so that
    # each training cell's step 0 equals its base control.
    seed: int = 0
    # Warm-start stops at the first evaluation whose greedy generator accuracy reaches this.
    target_accuracy: float = 0.3
    # Upper bound on warm-start steps.
    max_warm_steps: int = 600


@dataclass
class ModelSpec:
    # "toy" for the embedded world, else a hub id (Qwen/Qwen3-1.7B) or a local directory.
    name_or_path: str
    # pretrained: load the weights; random: the published architecture of name_or_path with
    # random weights and the toy tokenizer mapped into its vocabulary (no hub needed).
    init: Literal["pretrained", "random"] = "pretrained"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    # Qwen3's chat template flag; the paper trains with thinking disabled.
    enable_thinking: bool = False
    # The toy world's recipe: present exactly when name_or_path is "toy" (scale=toy sets both).
    toy: ToySpec | None = None

    def __post_init__(self) -> None:
        if self.name_or_path == "toy" and self.toy is None:
            raise ConfigError(
                "model.name_or_path=toy needs the toy world's recipe under model.toy: pick the model with "
                "scale=toy (it sets both) instead of overriding model.name_or_path"
            )
        if self.name_or_path != "toy" and self.toy is not None:
            raise ConfigError(
                f"model.toy is the toy world's recipe, but model.name_or_path is '{self.name_or_path}': pick the "
                "model with scale=<0.6b|1.7b|4b> instead of overriding model.name_or_path, or drop model.toy"
            )


@dataclass
class LengthSpec:
    max_prompt_tokens: int = 512
    max_response_tokens: int = 48


@dataclass
class PolicySpec:
    # shared: one adapter for every role; isolated: one per role type; transfer: a trained
    # adapter plugged (frozen) into one role, other roles on the base model.
    name: Literal["shared", "isolated", "transfer"] = "shared"
    # transfer only: the finished run dir whose adapter serves transfer_role (its newest
    # complete checkpoint's, resolved at run time), or a peft adapter dir; a relative path
    # is taken from this cell's run dir (the grid writes ../<sa_rl cell id>).
    transfer_adapter: str | None = None
    transfer_role: str = "generator"


@dataclass
class LoraSpec:
    """The LoRA adapters every trained role gets, under Shared- and Isolated-Policy alike (a
    transfer cell's adapter brings its own)."""

    # The paper's rank (the toy world's 1M-parameter model uses 16: conf/scale/toy.yaml).
    rank: int = 64
    # The update is scaled by alpha / rank (the paper's 32).
    alpha: int = 32
    # Dropout on each adapter's input (the paper's none).
    dropout: float = 0.0
    # Every linear module of the base model (peft leaves lm_head out).
    target_modules: str = "all-linear"


@dataclass
class SamplingSpec:
    """Rollout sampling, whichever engine generates."""

    # The paper's rollout temperature.
    temperature: float = 0.7
    # Nucleus sampling (1.0 = off).
    top_p: float = 1.0
    # Validation samples like training (0 = greedy): with greedy decoding Voting's three
    # generators would answer identically and pass@k would be meaningless. Validation draws
    # from a fixed seed, so it is repeatable and step 0 equals the base control exactly.
    val_temperature: float = 0.7


@dataclass
class GRPOSpec:
    """GRPO as in the paper: no KL, group-relative advantages, asymmetric clipping. The keys on
    which the paper's code and text differ are set by the conf/grpo/ preset (released here)."""

    # Rollouts (episodes) per problem: the group size.
    n: int = 8
    # Which reading of the paper this cell trains under (conf/grpo/): "released" (its code)
    # or "as_written" (its text); the keys below are what the preset sets.
    preset: Literal["released", "as_written"] = "released"
    # Advantage rows and groups. "problem_trajectory": one row per role turn, grouped by
    # (problem, trajectory name) (released). "problem": one row per episode, grouped by
    # problem, its advantage copied to every turn (as_written).
    group_key: Literal["problem_trajectory", "problem"] = "problem_trajectory"
    # Advantage = (r - mean) / (std + adv_eps) within a group (GRPO); false keeps only the
    # centring (Dr. GRPO style).
    norm_by_std: bool = True
    adv_eps: float = 1e-6
    # PPO ratio clip below 1 (1 - 0.2).
    clip_low: float = 0.2
    # PPO ratio clip above 1 (1 + 0.28), the DAPO-style higher clip.
    clip_high: float = 0.28
    # Dual-clip: a negative-advantage token's loss is capped at -clip_ratio_c * A (None: off).
    clip_ratio_c: float | None = 3.0
    # Clamp of the log-ratio log(pi/pi_old) (and of the KL's log(ref/pi)) before exp (None: off).
    log_ratio_clamp: float | None = 20.0
    # Clamp of the per-token k3 KL to [-kl_clamp, kl_clamp] (None: off).
    kl_clamp: float | None = 10.0
    # Order of an adapter's sequences before the mini-batch cut: "balanced" (by sequence
    # length, consecutive cuts; verl's balance_batch) or "shuffled".
    minibatch_order: Literal["balanced", "shuffled"] = "balanced"
    # A short last mini-batch: "scaled" by rows / mini-batch size (verl), or weighed "full".
    partial_minibatch: Literal["scaled", "full"] = "scaled"
    # Loss aggregation: mean over each sequence's tokens, then over sequences.
    loss_agg: Literal["seq-mean-token-mean", "token-mean"] = "seq-mean-token-mean"
    # Passes over a step's rollouts.
    ppo_epochs: int = 1
    # PPO's "old" log-probs: recomputed by the trainer before the update (verl's default),
    # or the rollout engine's own (saves a forward; trusts the engine's numerics).
    old_logprobs: Literal["recompute", "rollout"] = "recompute"
    # Per-role KL-to-base coefficients (k3 estimator), e.g. {generator: 0.01}; keys must be
    # roles of the workflow; empty = no KL, as in the paper.
    kl_beta: dict[str, float] = field(default_factory=dict)


@dataclass
class OptimSpec:
    """AdamW on the LoRA adapters (the base model is frozen)."""

    # Peak learning rate.
    lr: float = 2e-5
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    # Decoupled weight decay.
    weight_decay: float = 0.01
    # Linear warmup steps before the decay.
    warmup_steps: int = 15
    # LR schedule over train.total_steps (past its end it holds its floor).
    schedule: Literal["cosine", "constant"] = "cosine"
    # Floor of the cosine schedule, as a fraction of lr.
    min_lr_ratio: float = 0.0
    # Gradient-norm clip per adapter and optimizer step.
    grad_clip: float = 1.0
    # When the schedule advances. "per_step" (both presets): once per training step,
    # identical under SP and IP, the paper's intent and a controlled comparison.
    # "per_update": once per adapter update, as upstream verl 0.6.1 steps its scheduler once
    # per update_actor call; a released trainer that calls it once per agent under IP would
    # then advance k times per step (2 for Eval-Opt and Voting, 3 for Orch-Workers). Not
    # known without the fork's exact branch: whether it did, and whether it ran a constant LR
    # after warmup (its config sets only the deprecated warmup_style).
    lr_advance: Literal["per_step", "per_update"] = "per_step"


@dataclass
class TrainSpec:
    """The training loop."""

    # Training steps per cell.
    total_steps: int = 500
    # Problems per training step (each rolled out grpo.n times).
    batch_problems: int = 64
    # Problems per PPO mini-batch: an adapter's sequences split into chunks of
    # ppo_mini_batch * n, one optimizer step each (64 x n = one per adapter and step).
    ppo_mini_batch: int = 64
    # Per-GPU token budget of one micro-batch (prompt + response tokens, padded); conf sets
    # it from the (scale, gpu) row of conf/tables.yaml.
    micro_token_budget: int = 40960
    # Recompute each decoder layer's activations in the backward pass instead of keeping
    # them (verl's default): activation memory of a micro-batch drops ~layers-fold.
    gradient_checkpointing: bool = True
    # Validate every this many steps (step 0 is the base model).
    val_every: int = 10
    # Checkpoint every this many steps (resume takes the newest complete one).
    save_every: int = 5
    # Complete checkpoints kept on disk (older ones are deleted).
    keep_checkpoints: int = 2
    # Limit validation to the first N problems (None: the whole split).
    val_problems: int | None = None
    # Validation episodes whose every turn goes to samples/step_XXXXXX.jsonl.
    val_samples: int = 8


@dataclass
class LoggingSpec:
    """Experiment tracking: wandb runs offline inside the cell dir (`wandb sync` later)."""

    wandb_mode: Literal["offline", "online", "disabled"] = "offline"
    wandb_project: str = "gridrun"


@dataclass
class RunConfig:
    cell: CellSpec
    # The toy world with its default recipe.
    model: ModelSpec = field(default_factory=lambda: ModelSpec(name_or_path="toy", toy=ToySpec()))
    # Each node: the params of the option it names (gridrun/registry.py), e.g. voting's
    # n_voters; absent, the option below with its defaults.
    workflow: WorkflowParams = field(default_factory=lambda: _default_option(WorkflowParams, "workflow", "single"))
    task: TaskParams = field(default_factory=lambda: _default_option(TaskParams, "task", "arith"))
    lengths: LengthSpec = field(default_factory=LengthSpec)
    policy: PolicySpec = field(default_factory=PolicySpec)
    lora: LoraSpec = field(default_factory=LoraSpec)
    engine: EngineParams = field(default_factory=lambda: _default_option(EngineParams, "engine", "hf"))
    sampling: SamplingSpec = field(default_factory=SamplingSpec)
    grpo: GRPOSpec = field(default_factory=GRPOSpec)
    optim: OptimSpec = field(default_factory=OptimSpec)
    train: TrainSpec = field(default_factory=TrainSpec)
    logging: LoggingSpec = field(default_factory=LoggingSpec)

    def __post_init__(self) -> None:
        self._check()

    def _check(self) -> None:
        if self.cell.kind == "sa_rl" and self.workflow.name != "single":
            raise ConfigError(
                f"cell.kind=sa_rl runs workflow 'single', got '{self.workflow.name}': "
                "set workflow.name=single"
            )
        if self.cell.kind == "train" and self.workflow.name == "single":
            raise ConfigError("workflow 'single' trains as cell.kind=sa_rl, not train")
        if (self.cell.kind == "transfer") != (self.policy.name == "transfer"):
            raise ConfigError(
                f"cell.kind={self.cell.kind} with policy.name={self.policy.name}: a transfer cell evaluates a "
                "transplanted adapter and nothing else does; set both to transfer or neither"
            )
        if self.policy.name == "transfer" and not self.policy.transfer_adapter:
            raise ConfigError("policy.name=transfer needs policy.transfer_adapter=<run dir of a finished sa_rl cell>")
        if self.cell.kind == "transfer" and self.workflow.name == "single":
            raise ConfigError("a transfer cell plugs an adapter into a multi-agent workflow: set workflow.name to one")
        if self.grpo.clip_low <= 0 or self.grpo.clip_high <= 0:
            raise ConfigError("grpo.clip_low and grpo.clip_high must be > 0")
        for name in ("total_steps", "batch_problems", "ppo_mini_batch", "val_every", "save_every"):
            if getattr(self.train, name) < 1:
                raise ConfigError(f"train.{name} must be >= 1")
        if self.grpo.n < 1:
            raise ConfigError("grpo.n must be >= 1")
        if self.model.init == "random" and self.engine.name == "vllm":
            raise ConfigError("model.init=random builds its weights in memory, which vLLM cannot load: set engine=hf")
        if self.grpo.clip_ratio_c is not None and self.grpo.clip_ratio_c <= 1.0:
            raise ConfigError("grpo.clip_ratio_c must be > 1 (verl uses 3.0), or null to turn dual-clip off")
        workflow = self.workflow_entry()
        roles = workflow.roles
        for role in self.grpo.kl_beta:
            if role not in roles:
                close = difflib.get_close_matches(role, roles, n=1)
                hint = f"did you mean '{close[0]}'?" if close else f"roles of {self.workflow.name}: {', '.join(roles)}"
                raise ConfigError(f"grpo.kl_beta: '{role}' is not a role of {self.workflow.name} ({hint})")
        task = registry.task(self.task.name, self.task.plugin)
        missing = [p for p in workflow.prompt_names() if p not in task.prompt_names()]
        if missing:
            raise ConfigError(
                f"task '{task.name}' has no prompt for role '{missing[0]}' of workflow '{workflow.name}': add a "
                f"'{missing[0]}' method to {task.prompts.__name__} or call gridrun.registry.add_prompts"
                f"('{task.name}', {missing[0]}=...) in the workflow's module"
            )

    def workflow_entry(self) -> registry.Workflow:
        """This cell's workflow: its roles, parallel role and program."""
        return registry.workflow(self.workflow.name, self.workflow.plugin)

    @property
    def parallel_slots(self) -> int:
        """Same-role multiplicity of the workflow's parallel role (voters, workers), else 1."""
        return self.workflow_entry().slots(self.workflow)

    @property
    def shuffles_rewards(self) -> bool:
        return self.cell.kind == "shuffled"

    @property
    def trains(self) -> bool:
        """Base and transfer cells only evaluate (step 0, n = 1)."""
        return self.cell.kind not in ("base", "transfer")

    @property
    def steps_to_train(self) -> int:
        """GRPO steps this cell runs: train.total_steps, or 0 for a cell that only evaluates
        (the one place that says so: the trainer's loop, state.json and the plan's estimate)."""
        return self.train.total_steps if self.trains else 0

    def to_dict(self) -> dict[str, Any]:
        """config.yaml's tree (and the fingerprint's): model.toy only where the model is the toy world."""
        tree = dataclasses.asdict(self)
        if tree["model"]["toy"] is None:
            del tree["model"]["toy"]
        return tree


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _default_option(base: type[P], kind: str, name: str) -> P:
    params = registry.params_class(kind, {"name": name})(name=name)
    assert isinstance(params, base)
    return params


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check `value` against the annotation `tp`, building nested dataclasses."""
    origin = get_origin(tp)
    if isinstance(tp, type) and issubclass(tp, OptionParams):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {type(value).__name__}")
        return _build(registry.params_class(key, value), value, f"{key}.")
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {type(value).__name__}")
        return _build(tp, value, f"{key}.")
    if origin in (typing.Union, types.UnionType):
        options = get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, key)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if errors else f"{key}: invalid value {value!r}")
    if origin is Literal:
        allowed = get_args(tp)
        if value not in allowed:
            raise ConfigError(f"{key}: {value!r} is not one of {list(allowed)}")
        return value
    if tp is Any:
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        (item_tp,) = get_args(tp)
        return [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {type(value).__name__}")
        key_tp, val_tp = get_args(tp)
        return {
            _coerce(k, key_tp, f"{key}.<key>"): _coerce(v, val_tp, f"{key}.{k}")
            for k, v in value.items()
        }
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if tp in (str, bool):
        if not isinstance(value, tp):
            raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
        return value
    raise ConfigError(f"{key}: unsupported type {_type_name(tp)}")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _build(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    hints = _hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in names and issubclass(cls, OptionParams):
            own = [n for n in names if n not in ("name", "plugin")]
            close = difflib.get_close_matches(str(key), own, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"its keys: {', '.join(own) or 'none'}"
            raise ConfigError(f"{prefix.rstrip('.')} {data['name']} has no key '{key}' ({hint})")
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f" (did you mean '{prefix}{close[0]}'?)" if close else f" (valid: {', '.join(names)})"
            raise ConfigError(f"unknown config key '{prefix}{key}'{hint}")
    kwargs = {k: _coerce(v, hints[k], f"{prefix}{k}") for k, v in data.items()}
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.name not in kwargs
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"missing config key '{prefix}{missing[0]}'")
    return cls(**kwargs)


def run_defaults() -> dict[str, Any]:
    """The schema's defaults of every run node that does not depend on a chosen option: what
    conf/ composes on top of (gridrun/grid/compose.py), so that conf/ sets only what differs.
    Left out: the cell node (the grid's), the model's identity (scale/ names it) and the
    workflow, task and engine nodes, whose keys depend on the option each names."""
    defaults = RunConfig(cell=CellSpec(id="", kind="base")).to_dict()
    for node in ("cell", "workflow", "task", "engine"):
        del defaults[node]
    for key in ("name_or_path", "toy"):
        defaults["model"].pop(key, None)
    return defaults


def from_dict(cls: type[T], data: dict[str, Any], prefix: str = "") -> T:
    """Build dataclass `cls` from a mapping by the run schema's rules (unknown keys named with
    their closest valid one, types checked, nested dataclasses built); `prefix` is where the
    mapping sits in its tree (`grid.cluster.`). The grid root's schema uses it too."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'the config'}: expected a mapping, got {data!r}")
    built: T = _build(cls, data, prefix)
    return built


def config_from_dict(data: dict[str, Any]) -> RunConfig:
    """Build and validate a RunConfig; raises ConfigError naming the offending key."""
    return from_dict(RunConfig, data)


def load_config(path: Path) -> RunConfig:
    if not path.is_file():
        raise ConfigError(f"{path} does not exist: plan the cell with `gridrun plan` first")
    import yaml  # here, not at import time: `gridrun status` imports this module for nothing else

    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML ({err.__class__.__name__}): re-plan the cell") from err
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of config groups")
    try:
        return config_from_dict(data)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None


def dump_config(config: RunConfig) -> str:
    import yaml

    return yaml.safe_dump(config.to_dict(), sort_keys=False)
