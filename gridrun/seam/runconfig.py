"""The seam's run schema: what `gridrun run <run_dir>` reads from a cell's `config.yaml`.

A cell's `config.yaml` is fully resolved (no interpolation, no defaults list): the grid
side composes it with Hydra and validates it here at plan time, before anything is written;
the trainer only parses it into these dataclasses. Unknown keys and wrong types are rejected
with an error that names the key and the closest valid one, because a typo'd key silently
falling back to a default would train the wrong cell.

The workflow, task and engine nodes are each the params dataclass of the option they name,
taken from its registry (gridrun/seam/registry.py): `workflow.rounds` exists on an eval_opt
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
import math
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

from gridrun.seam import registry
from gridrun.seam.mechanisms import ALERTS, LIVE_ALERTS

# The seeds a run takes: every stream it derives (gridrun/train/seeds.py) stays within torch's
# range, and vLLM seeds numpy, which takes 32 bits.
SEED_MAX = 2**32 - 1
from gridrun.seam.registry import ConfigError as ConfigError  # noqa: PLC0414 - re-exported: both halves catch it here
from gridrun.seam.registry import EngineParams, OptionParams, TaskParams, WorkflowParams

T = TypeVar("T")
P = TypeVar("P", bound=OptionParams)

# The key of a per-role setting that names the workflow's parallel role, whatever it is called.
PARALLEL = "parallel"


class CellKind(StrEnum):
    """What a cell runs. Each kind says here, once, whether it trains, whether its roles run
    on adapters trained elsewhere, and whether a sweep's variants cross it; the grid's ids
    and plans (gridrun/grid/cells.py) and the analysis read these properties."""

    # Multi-agent GRPO: workflow x policy.
    TRAIN = "train"
    # The single-agent RL control (workflow single).
    SA_RL = "sa_rl"
    # The base model evaluated (step 0 only).
    BASE = "base"
    # Table 3's: the SA-RL generator plugged into a workflow, evaluated.
    TRANSFER = "transfer"
    # The reward control: trains as its train (or sa_rl) twin on rewards permuted within each step.
    SHUFFLED = "shuffled"
    # Adapters trained elsewhere (policy.adapters), evaluated in a workflow.
    EVAL = "eval"

    @property
    def trains(self) -> bool:
        """Runs GRPO steps (the others evaluate at step 0 only: no peak checkpoint, no alerts)."""
        return self in (CellKind.TRAIN, CellKind.SA_RL, CellKind.SHUFFLED)

    @property
    def evaluates_adapters(self) -> bool:
        """Its roles run on frozen adapters trained elsewhere (policy.adapters, policy.name=transfer)."""
        return self in (CellKind.TRANSFER, CellKind.EVAL)

    @property
    def crossed_by_variants(self) -> bool:
        """A sweep's variants cross it: the trained multi-agent cells and their reward twins."""
        return self in (CellKind.TRAIN, CellKind.SHUFFLED)

    @property
    def seeded(self) -> bool:
        """Has a seed axis (every kind but the base control)."""
        return self is not CellKind.BASE


# Kinds that train (cells.parquet's `kind` column holds their values).
TRAINED_KINDS = tuple(kind.value for kind in CellKind if kind.trains)
# policy.adapters' key for every role the map does not name.
ALL_ROLES = "all_roles"
# The adapter of policy shared (and of any one-role workflow's trained cell).
SHARED_ADAPTER = "shared"
# A group's name is its adapter's (peft's adapter name, metric keys adapter/<name>/...).
GROUP_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
# An adapter's name is a folder's, in every checkpoint and export: short enough for any file
# system, and none of the names those folders use themselves (peft saves an adapter called
# `default` at the folder's root; `gridrun export --merged` writes merged/), in any case.
ADAPTER_NAME_MAX = 64
# The estimators and policy losses gridrun registers itself (gridrun/train/advantages.py,
# losses.py; a test keeps these equal), so the plan checks a name without importing torch.
BUILT_IN_ESTIMATORS = ("grpo", "per_role")
BUILT_IN_POLICY_LOSSES = ("vanilla",)
RESERVED_ADAPTER_NAMES = ("default", "merged")
# Keys added after the paper's cells were fingerprinted, left out of config.yaml (so of the
# fingerprint) while they hold these defaults: (node, key, default); a whole node goes
# when every key of it is listed and at its default.
OMITTED_AT_DEFAULT: tuple[tuple[str, str, Any], ...] = (
    ("policy", "groups", {}), ("grpo", "estimator", "grpo"), ("reward", "credit", "broadcast"),
    ("train", "val_n", 1), ("train", "on_alert", "warn"), ("train", "alert_signals", list(LIVE_ALERTS)),
    ("model", "arch_overrides", {}), ("train", "fall_alert", False),
)
# The model family's chat conventions (gridrun/arch/families.py), added in schema 3: Qwen3's
# defaults, so a paper cell's config.yaml and fingerprint hold none of them.
FAMILY_KEYS: tuple[tuple[str, str, Any], ...] = (
    ("model", "system_prompt", None), ("model", "template_kwargs", {}), ("model", "message_policy", "keep"),
)
# The run schema's version, recorded in each cell.json (`schema`; a cell without one is 1):
# MIGRATIONS read an older cell's config.yaml as this version would have written it.
SCHEMA_VERSION = 3
# Keys added to the run schema, each with the value every cell planned before it ran with:
# (version that added it, node, key, value). An older config.yaml that lacks one reads it as
# that value, so a started cell keeps its fingerprint's meaning and resumes after an upgrade.
# A new key whose default is not what older cells did needs its old behaviour as `value`.
MIGRATIONS: tuple[tuple[int, str, str, Any], ...] = (
    (2, "optim", "role_lr_ramp", 0), (2, "grpo", "policy_loss", "vanilla"),
    *((2, node, key, default) for node, key, default in OMITTED_AT_DEFAULT),
    *((3, node, key, default) for node, key, default in FAMILY_KEYS),
)


def migrate(tree: dict[str, Any], version: int) -> dict[str, Any]:
    """config.yaml's `tree` of a cell planned under schema `version`, with every key added
    since filled in with the value that cell ran with (a new mapping; `tree` is not edited)."""
    migrated = {node: dict(value) if isinstance(value, dict) else value for node, value in tree.items()}
    for added, node, key, value in MIGRATIONS:
        if added > version and isinstance(migrated.get(node, {}), dict):
            migrated.setdefault(node, {}).setdefault(key, value)
    return migrated


@dataclass
class CellSpec:
    id: str
    # shuffled: the reward control, trained as its train (or sa_rl, workflow single) twin with
    # each step's episode rewards permuted across the step's episodes. transfer and eval
    # evaluate adapters trained elsewhere (policy.adapters): transfer is Table 3's (the SA-RL
    # generator, planned by the grid), eval any adapters a sweep names.
    kind: CellKind = CellKind.TRAIN
    seed: int = 0
    # The sweep's variant this cell trains (a named bundle of overrides, gridrun/grid/spec.py);
    # None (and absent from config.yaml) for controls and sweeps without variants.
    variant: str | None = None

    def __post_init__(self) -> None:
        self.kind = CellKind(self.kind)  # a caller's plain string, checked


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
    # Qwen3's chat template flag; the paper trains with thinking disabled. Other families'
    # templates never see it (gridrun/arch/families.py).
    enable_thinking: bool = False
    # The toy world's recipe: present exactly when name_or_path is "toy" (scale=toy sets both).
    toy: ToySpec | None = None
    # init=random only: published sizes replaced (gridrun/arch RESHAPEABLE), e.g.
    # {num_hidden_layers: 2, hidden_size: 256}: the family's class and vocabulary at a size a CPU
    # trains in seconds (the CPU canary). Absent from config.yaml when empty.
    arch_overrides: dict[str, int] = field(default_factory=dict)
    # A system turn put before every conversation that has none; null: none (a template
    # that writes its own, Qwen2.5's and SmolLM2's, then does: their scale files name that
    # text here, so the prompt is in the config). Absent from config.yaml when null.
    system_prompt: str | None = None
    # Extra keyword arguments of the chat template, e.g. Llama 3.2's pinned date_string (its
    # template writes today's date otherwise). Absent from config.yaml when empty.
    template_kwargs: dict[str, str] = field(default_factory=dict)
    # Consecutive turns of one role (Eval-Opt's answer and critique): keep | merge |
    # critic_as_user (the critique shown as a user turn), for templates that refuse them
    # (Gemma 3). Absent from config.yaml at keep.
    message_policy: Literal["keep", "merge", "critic_as_user"] = "keep"

    def __post_init__(self) -> None:
        if self.name_or_path == "toy" and self.toy is None:
            raise ConfigError(
                "model.name_or_path=toy needs the toy world's recipe under model.toy: pick the model with "
                "scale=toy (it sets both) instead of overriding model.name_or_path"
            )
        if self.name_or_path != "toy" and self.toy is not None:
            raise ConfigError(
                f"model.toy is the toy world's recipe, but model.name_or_path is '{self.name_or_path}': pick the "
                "model with scale= (0.6b, 1.7b, 4b, or another family's, e.g. llama3.2-1b: conf/scale/) instead of "
                "overriding model.name_or_path, or drop model.toy"
            )
        if self.arch_overrides:
            if self.init != "random":
                raise ConfigError(
                    "model.arch_overrides reshapes a randomly initialised model: set model.init=random, or drop them"
                )
            from gridrun.arch import UnknownArchitecture, shaped

            try:
                shaped(self.name_or_path, dict(self.arch_overrides))
            except UnknownArchitecture as err:
                raise ConfigError(str(err)) from None
        from gridrun.arch.families import FamilyError, check_model

        try:
            check_model(self.name_or_path, self.enable_thinking, dict(self.template_kwargs))
        except FamilyError as err:
            raise ConfigError(str(err)) from None


@dataclass
class LengthSpec:
    max_prompt_tokens: int = 512
    max_response_tokens: int = 48


@dataclass
class PolicySpec:
    # shared: one adapter for every role; isolated: one per role type; grouped: one per group
    # of `groups`; transfer: trained adapters plugged (frozen) into the roles `adapters`
    # names, other roles on the base model.
    name: Literal["shared", "isolated", "grouped", "transfer"] = "shared"
    # grouped only: adapter name -> the role types it serves (and learns from), every role of
    # the workflow in exactly one group, e.g. {planners: [orchestrator, synthesizer],
    # workers: [worker]} (partial sharing). shared is the one group {shared: every role},
    # isolated one group per role named after it; absent from config.yaml (and the
    # fingerprint) when empty, so shared and isolated cells hash as they did before.
    groups: dict[str, list[str]] = field(default_factory=dict)
    # transfer only: role -> where its adapter is, resolved when the cell runs
    # (gridrun/adapters.py): a run dir, an export or a peft folder, relative paths taken from
    # this cell's run dir, or a cell id of the same sweep; `@peak`, `@last` (the default) or
    # `@N` picks a run's step. `all_roles`: every role not named takes its adapter for that
    # role from this source. A transfer cell's is {generator: ../<sa_rl cell id>}.
    adapters: dict[str, str] = field(default_factory=dict)


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
    """GRPO as in the paper: no KL, group-relative advantages, asymmetric clipping. Where the
    paper's code and text differ the default is the code's (preset=released); conf/preset/
    as_written.yaml sets the text's reading."""

    # Rollouts (episodes) per problem: the group size.
    n: int = 8
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
    # The per-token policy loss, by its registered name (gridrun/train/losses.py): "vanilla"
    # (PPO's clipped surrogate with clip-higher and dual-clip, the paper's), or
    # "<module>:<name>" for one a module registers when imported (checked at train start:
    # the grid never imports torch).
    policy_loss: str = "vanilla"
    # The advantage estimator, by its registered name (gridrun/train/advantages.py): "grpo"
    # (the paper's: each group's rewards normalised by the group's mean and std), "per_role"
    # (Dr.MAS's per-agent normalisation: the same, within each role's rows of a problem),
    # or "<module>:<name>" for one a module registers when imported (checked at train start).
    # Left out of config.yaml at its default, so the paper's cells keep their fingerprints.
    estimator: str = "grpo"
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
    # A group of one row (grpo.n = 1, or a trajectory name met once): "raw" gives it its raw
    # reward as advantage (released: verl's GRPO takes mean 0 and std 1 for it, so r / (1 +
    # adv_eps)); "zero" gives it 0, as gridrun did before. The text is silent. Such groups
    # are counted either way (adv/singleton_groups).
    singleton_advantage: Literal["raw", "zero"] = "raw"
    # How the chi2 diagnostics (chi2, chi2_centered) and the perplexity of a step are reduced.
    # "micro_batch" (released: verl's rollout_corr metrics): each micro-batch's masked mean of
    # rho^2 - 1 and its mean over rows of exp(-mean log-prob), then the mean over the step's
    # micro-batches (gridrun's micro-batches hold one role each). "pooled": over every token
    # (chi2) and every sequence (ppl) of the step, as gridrun did before. The text is silent.
    chi2_reduction: Literal["micro_batch", "pooled"] = "micro_batch"
    # Per-role loss weight: that role's tokens' loss, and so its gradient, times w (w = 0: an
    # adapter whose every role weighs 0 is not stepped at all). A key is a role of the
    # workflow, or `parallel` for its parallel role (Voting's generator, Orch-Workers' worker).
    # It moves a role's share of a shared adapter (SP); under IP AdamW undoes a constant
    # weight almost entirely (docs/fidelity.md, "Per-role update strength").
    role_weight: dict[str, float] = field(default_factory=dict)
    # Multiplicity normalization (a remedy): the parallel role, k slots, trains as if it had
    # one. "share": loss weight 1/k (SP's form); "steps": its adapter takes one optimizer step
    # per training step (IP); "lr": 1/k of the LR (IP); "off": as the paper.
    multiplicity_norm: Literal["off", "share", "steps", "lr"] = "off"
    # I6, the released docs' gradient-direction coherence regularizer: each role's gradient
    # of a mini-batch is scaled by 1 - coherence * max(0, cos(g, EMA of the role's g)) (0: off).
    coherence: float = 0.0
    # Decay of that EMA per optimizer step (gridrun's choice; the docs give none).
    coherence_decay: float = 0.9


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
    # Linear warmup over this many schedule advances, from LR 0 (verl's schedules: the first
    # update runs at LR 0, the one after k advances at lr * k / warmup_steps).
    warmup_steps: int = 15
    # After the warmup: "constant" (verl's lr_scheduler_type default, which the released code
    # ran: its config sets only the deprecated warmup_style) or "cosine" over
    # train.total_steps (the paper's text; past its end it holds its floor).
    schedule: Literal["cosine", "constant"] = "constant"
    # Floor of the cosine schedule, as a fraction of lr.
    min_lr_ratio: float = 0.0
    # Gradient-norm clip per adapter and optimizer step.
    grad_clip: float = 1.0
    # When the schedule advances. "per_update" (released): once per adapter update, as verl
    # steps its scheduler once per update_actor call and the released trainer calls it once
    # per agent under IP (k advances per training step: 2 for Eval-Opt and Voting, 3 for
    # Orch-Workers; one under SP). "per_step": once per training step, identical under SP
    # and IP (the paper's text: a controlled comparison).
    lr_advance: Literal["per_step", "per_update"] = "per_update"
    # Per-role LR multiplier (Isolated-Policy: an adapter per role type); keys as
    # grpo.role_weight's (a role or `parallel`).
    role_lr_scale: dict[str, float] = field(default_factory=dict)
    # Training steps over which role_lr_scale grows linearly from 1 to its value (0: all of
    # it from the first step). A ramp makes the injected amplification build up, as the
    # paper's drift does, instead of breaking the policy in the first steps.
    role_lr_ramp: int = 0
    # Optimizer steps a role's adapter takes per training step (IP): its sequences cut into
    # this many equal consecutive mini-batches, each weighed as a full one; absent: one per
    # train.ppo_mini_batch x grpo.n sequences, as the paper (3 for Voting's generator).
    role_steps: dict[str, int] = field(default_factory=dict)


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
    # Newest complete checkpoints kept on disk (older ones are deleted, except the peak
    # validation's: it is kept until a higher peak replaces it).
    keep_checkpoints: int = 2
    # Limit validation to the first N problems (None: the whole split).
    val_problems: int | None = None
    # The task's split that validation draws its problems from (an eval cell may score the
    # training problems).
    val_split: Literal["val", "train"] = "val"
    # Validation episodes whose every turn goes to samples/step_XXXXXX.jsonl.
    val_samples: int = 8
    # Answers sampled per validation problem (at sampling.val_temperature): the paper's 1. More
    # shrink the within-problem part of val/acc_se (gridrun/train/validate.py's accuracy_se).
    val_n: int = 1
    # What a mechanism alert (gridrun/seam/mechanisms.py) does when it first fires: "warn" (state.json
    # and status show it), "export_peak" (also export the peak validation's adapters, then train
    # on) or "stop" (export them and end the cell: state `stopped`, with the alert and its step).
    on_alert: Literal["warn", "export_peak", "stop"] = "warn"
    # Raise the `collapse` alert at the validation where the run's validations first hold a
    # cliff (gridrun/seam/significance.py: a fall of 10+ points clearing the Bonferroni bound
    # over the pairs of its planned validations, paired by problem); on_alert acts on it as
    # on a mechanism alert. Off: the cliff is only collect's to find.
    fall_alert: bool = False
    # The alerts the trainer watches live (state.json, status, the train row's alert/<name>
    # flags); collect replays every one whatever this says. The candidate collapse signals
    # (mechanisms.CANDIDATES) run live only when listed here.
    alert_signals: list[str] = field(default_factory=lambda: list(LIVE_ALERTS))


@dataclass
class ProtocolSpec:
    """What each role of a workflow sees and how its output is read. The defaults are the
    released code's (rLLM 0.2.1's workflows); each other value is what gridrun did before
    reading that code. Only the worker count is in the paper's text; the keys where it is
    silent say so."""

    # What Eval-Opt's evaluator and revisions see. "full" (released): the whole conversation
    # so far, the generator's first prompt then every earlier answer and critique as
    # assistant turns, followed by the role's instruction. "latest": the evaluator sees
    # (question, latest answer), a revision its last answer and critique. The text is silent.
    eval_opt_context: Literal["full", "latest"] = "full"
    # How Voting's aggregator's choice is read. "released": the first \boxed{N}, else the
    # first lone digit 1-9 in the text, else candidate 1, so it always commits to a
    # candidate. "last_box": the last box; no candidate named commits to nothing (format
    # penalty). The text says only that the aggregator selects.
    aggregator_parse: Literal["released", "last_box"] = "released"
    # Which of the evaluator's boxes is its verdict: the "first" holding Correct or Incorrect
    # (released) or the "last" box. The text is silent.
    verdict_box: Literal["first", "last"] = "first"
    # Orch-Workers' worker count. "parsed" (released): one worker per strategy the
    # orchestrator gives (1 to workflow.n_workers; with no numbered line, its lines or its
    # whole text stand in). "fixed": always workflow.n_workers, missing strategies padded
    # with a generic one: the text's three workers and three worker rollouts per problem.
    orch_workers: Literal["parsed", "fixed"] = "parsed"


@dataclass
class RewardSpec:
    """Which reward trains each role's turns (the task scores the episode either way)."""

    # "broadcast" (the paper's): the episode's one outcome reward on every role's turns.
    # "per_role": each role its own, as its workflow defines them (gridrun/workflows/:
    # Eval-Opt's evaluator scored on whether its verdict was right, Voting's aggregator on
    # whether it picked a correct candidate when one existed, a worker on its own answer);
    # a workflow that defines none refuses it. Left out of config.yaml at its default.
    credit: Literal["broadcast", "per_role"] = "broadcast"


@dataclass
class LoggingSpec:
    """Experiment tracking: wandb runs offline inside the cell dir (`wandb sync` later)."""

    wandb_mode: Literal["offline", "online", "disabled"] = "offline"
    wandb_project: str = "gridrun"


@dataclass
class RunConfig:
    cell: CellSpec
    # Which reading of the paper the whole run follows (conf/preset/): "released", its
    # released code, which produced its numbers (every default of this schema), or
    # "as_written", its text. Any single key can still be set; `gridrun show` lists those
    # that differ from the preset.
    preset: Literal["released", "as_written"] = "released"
    # The toy world with its default recipe.
    model: ModelSpec = field(default_factory=lambda: ModelSpec(name_or_path="toy", toy=ToySpec()))
    # Each node: the params of the option it names (gridrun/seam/registry.py), e.g. voting's
    # n_voters; absent, the option below with its defaults.
    workflow: WorkflowParams = field(default_factory=lambda: _default_option(WorkflowParams, "workflow", registry.single_agent_workflow()))
    task: TaskParams = field(default_factory=lambda: _default_option(TaskParams, "task", "arith"))
    lengths: LengthSpec = field(default_factory=LengthSpec)
    policy: PolicySpec = field(default_factory=PolicySpec)
    lora: LoraSpec = field(default_factory=LoraSpec)
    engine: EngineParams = field(default_factory=lambda: _default_option(EngineParams, "engine", "hf"))
    sampling: SamplingSpec = field(default_factory=SamplingSpec)
    grpo: GRPOSpec = field(default_factory=GRPOSpec)
    optim: OptimSpec = field(default_factory=OptimSpec)
    train: TrainSpec = field(default_factory=TrainSpec)
    protocol: ProtocolSpec = field(default_factory=ProtocolSpec)
    logging: LoggingSpec = field(default_factory=LoggingSpec)
    reward: RewardSpec = field(default_factory=RewardSpec)

    def __post_init__(self) -> None:
        self._check()

    def _check(self) -> None:
        single = registry.single_agent_workflow()
        single_agent = self.workflow_entry().single_agent
        if self.cell.kind is CellKind.SA_RL and not single_agent:
            raise ConfigError(
                f"cell.kind=sa_rl runs workflow '{single}', got '{self.workflow.name}': "
                f"set workflow.name={single}"
            )
        if self.cell.kind is CellKind.TRAIN and single_agent:
            raise ConfigError(f"workflow '{single}' trains as cell.kind=sa_rl, not train")
        if self.cell.kind.evaluates_adapters != (self.policy.name == "transfer"):
            raise ConfigError(
                f"cell.kind={self.cell.kind} with policy.name={self.policy.name}: transfer and eval cells evaluate "
                "adapters trained elsewhere and nothing else does; set policy.name=transfer with one of those "
                "kinds, or neither"
            )
        if self.policy.name == "transfer" and not self.policy.adapters:
            raise ConfigError(
                "policy.name=transfer needs policy.adapters={<role>: <run dir, export, peft folder or cell id>[@peak]}"
            )
        if self.policy.name != "transfer" and self.policy.adapters:
            raise ConfigError(
                f"policy.adapters is for transfer and eval cells (policy.name=transfer), not {self.policy.name}: drop it"
            )
        if self.cell.kind is CellKind.TRANSFER and single_agent:
            raise ConfigError("a transfer cell plugs an adapter into a multi-agent workflow: set workflow.name to one")
        self._check_groups()
        self._check_adapter_names()
        registry.check_named("grpo.estimator", self.grpo.estimator, BUILT_IN_ESTIMATORS, "advantage estimator")
        registry.check_named("grpo.policy_loss", self.grpo.policy_loss, BUILT_IN_POLICY_LOSSES, "policy loss")
        self._check_credit()
        if not all(math.isfinite(c) and c > 0 for c in (self.grpo.clip_low, self.grpo.clip_high)):
            raise ConfigError("grpo.clip_low and grpo.clip_high must be finite numbers > 0")
        self._check_numbers()
        unknown = [name for name in self.train.alert_signals if name not in ALERTS]
        if unknown:
            raise ConfigError(f"train.alert_signals: '{unknown[0]}' is not an alert; valid: {', '.join(ALERTS)}")
        for name in ("total_steps", "batch_problems", "ppo_mini_batch", "val_every", "save_every", "val_n"):
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
        self._check_roles("grpo.kl_beta", self.grpo.kl_beta, roles)
        self._check_role_strength(workflow)
        # A transfer cell's generator may be missing (Orch-Workers has none: the paper ran it
        # wholly on the base model); an eval cell names the roles it means.
        if self.cell.kind is CellKind.EVAL:
            self._check_roles("policy.adapters", self.policy.adapters, (*roles, ALL_ROLES))
        task = registry.task(self.task.name, self.task.plugin)
        missing = [p for p in workflow.prompt_names() if p not in task.prompt_names()]
        if missing:
            raise ConfigError(
                f"task '{task.name}' has no prompt for role '{missing[0]}' of workflow '{workflow.name}': add a "
                f"'{missing[0]}' method to {task.prompts.__name__} or call gridrun.seam.registry.add_prompts"
                f"('{task.name}', {missing[0]}=...) in the workflow's module"
            )

    def _check_numbers(self) -> None:
        """Float knobs whose values the run would refuse (AdamW, the sampler) or turn into NaN."""
        rules = {
            "optim.lr": (self.optim.lr, "> 0"), "optim.eps": (self.optim.eps, "> 0"),
            "optim.grad_clip": (self.optim.grad_clip, "> 0"), "optim.weight_decay": (self.optim.weight_decay, ">= 0"),
            "optim.beta1": (self.optim.beta1, "[0, 1)"), "optim.beta2": (self.optim.beta2, "[0, 1)"),
            "optim.min_lr_ratio": (self.optim.min_lr_ratio, "[0, 1]"), "grpo.adv_eps": (self.grpo.adv_eps, ">= 0"),
            "sampling.temperature": (self.sampling.temperature, ">= 0"),
            "sampling.val_temperature": (self.sampling.val_temperature, ">= 0"),
            "sampling.top_p": (self.sampling.top_p, "(0, 1]"), "lora.dropout": (self.lora.dropout, "[0, 1)"),
        }
        for key, (value, rule) in rules.items():
            ok = math.isfinite(value) and {
                "> 0": value > 0, ">= 0": value >= 0, "[0, 1)": 0 <= value < 1, "[0, 1]": 0 <= value <= 1,
                "(0, 1]": 0 < value <= 1,
            }[rule]
            if not ok:
                bound = f"a finite number {rule}" if rule[0] in "<>" else f"in {rule}"
                raise ConfigError(f"{key} must be {bound}, got {value}: set {key}=<such a value>")

    def _check_role_strength(self, workflow: registry.Workflow) -> None:
        roles = (*workflow.roles, PARALLEL)
        knobs: dict[str, Mapping[str, float]] = {
            "grpo.role_weight": self.grpo.role_weight, "optim.role_lr_scale": self.optim.role_lr_scale,
            "optim.role_steps": self.optim.role_steps,
        }
        for name, values in knobs.items():
            self._check_roles(name, values, roles)
            for role, value in values.items():
                if role == PARALLEL and workflow.parallel_role is None:
                    raise ConfigError(f"{name}.parallel: {workflow.name} has no parallel role; name one of its "
                                      f"roles ({', '.join(workflow.roles)})")
                if value < 0 or (value == 0 and name != "grpo.role_weight"):
                    raise ConfigError(f"{name}.{role} must be {'>= 0' if name == 'grpo.role_weight' else '> 0'}, "
                                      f"got {value}")
        if self.grpo.multiplicity_norm != "off" and workflow.parallel_role is None:
            raise ConfigError(f"grpo.multiplicity_norm={self.grpo.multiplicity_norm}: {workflow.name} has no "
                              "same-role multiplicity; set it to off")
        per_adapter = [name for name, values in knobs.items() if values and name != "grpo.role_weight"]
        if self.grpo.multiplicity_norm in ("steps", "lr"):
            per_adapter.append(f"grpo.multiplicity_norm={self.grpo.multiplicity_norm}")
        if per_adapter and self.policy.name == "shared":
            raise ConfigError(f"{per_adapter[0]} acts on a role's own adapter, and under policy shared one adapter "
                              "trains every role: use grpo.role_weight (or grpo.multiplicity_norm=share)")
        if per_adapter and self.policy.name == "grouped":
            self._check_own_adapters(workflow)
        if self.optim.role_lr_ramp < 0:
            raise ConfigError(f"optim.role_lr_ramp must be >= 0 training steps, got {self.optim.role_lr_ramp}")
        if self.grpo.coherence < 0 or not 0 <= self.grpo.coherence_decay < 1:
            raise ConfigError("grpo.coherence must be >= 0 and grpo.coherence_decay in [0, 1)")

    def _check_groups(self) -> None:
        """policy.groups: with policy grouped only, every role of the workflow in exactly one
        named group (a typo named with its closest role)."""
        groups, name = self.policy.groups, self.policy.name
        if groups and name != "grouped":
            raise ConfigError(f"policy.groups is for policy=grouped, not {name}: drop it, or set policy=grouped")
        if name != "grouped":
            return
        roles = self.workflow_entry().roles
        example = "{" + ", ".join(f"{r}: [{r}]" for r in roles) + "}"
        if not groups:
            raise ConfigError(f"policy=grouped needs policy.groups naming an adapter for every role of "
                              f"{self.workflow.name} ({', '.join(roles)}), e.g. policy.groups={example}")
        owner: dict[str, str] = {}
        for group, members in groups.items():
            if not GROUP_NAME.fullmatch(group):
                raise ConfigError(f"policy.groups: group name '{group}' must be a letter then letters, digits or '_' "
                                  "(it names the group's adapter)")
            if not members:
                raise ConfigError(f"policy.groups.{group} is empty: name its roles, or drop the group")
            for role in members:
                if role not in roles:
                    close = difflib.get_close_matches(role, roles, n=1)
                    hint = f"did you mean '{close[0]}'? " if close else ""
                    raise ConfigError(f"policy.groups.{group}: '{role}' is not a role of {self.workflow.name} "
                                      f"({hint}its roles: {', '.join(roles)})")
                if role in owner:
                    raise ConfigError(f"policy.groups: role '{role}' is in both {owner[role]} and {group}: put each "
                                      "role in exactly one group")
                owner[role] = group
        missing = [r for r in roles if r not in owner]
        if missing:
            raise ConfigError(f"policy.groups: role '{missing[0]}' of {self.workflow.name} is in no group: add it to "
                              f"one (roles of {self.workflow.name}: {', '.join(roles)})")

    def _check_adapter_names(self) -> None:
        """Every trained adapter's name (a group's under grouped, a role's under isolated) is a
        safe folder name: letters, digits and '_', at most ADAPTER_NAME_MAX, not reserved."""
        if self.policy.name == "grouped":
            named = [(f"policy.groups.{group}", group) for group in self.policy.groups]
        elif self.policy.name == "isolated":
            named = [(f"{self.workflow.name}'s role {role}", role) for role in self.workflow_entry().roles]
        else:
            return
        for where, name in named:
            if not GROUP_NAME.fullmatch(name) or len(name) > ADAPTER_NAME_MAX:
                raise ConfigError(f"{where}: '{name[:80]}' names an adapter's folder: use a letter then letters, "
                                  f"digits or '_', at most {ADAPTER_NAME_MAX} characters")
            if name.lower() in RESERVED_ADAPTER_NAMES:
                raise ConfigError(f"{where}: '{name}' is a name the adapters' folders use themselves "
                                  f"({', '.join(RESERVED_ADAPTER_NAMES)}): name the adapter otherwise")

    def _check_credit(self) -> None:
        if self.reward.credit != "per_role":
            return
        if self.workflow_entry().credit is None:
            raise ConfigError(f"reward.credit=per_role: workflow {self.workflow.name} defines no per-role rewards (its "
                              "registry entry's `credit`); set reward.credit=broadcast for it")
        if self.cell.kind == "shuffled":
            raise ConfigError("reward.credit=per_role gives each turn its own reward, and the shuffled control permutes "
                              "the episodes' one reward: set reward.credit=broadcast for shuffled cells")

    def _check_own_adapters(self, workflow: registry.Workflow) -> None:
        """Under policy grouped, the per-adapter knobs (an LR scale, optimizer steps, the
        multiplicity normalization's steps and lr) name only roles alone in their group."""
        named = [(f"optim.{key}.{role}", role) for key in ("role_lr_scale", "role_steps")
                 for role in getattr(self.optim, key)]
        if self.grpo.multiplicity_norm in ("steps", "lr"):
            named.append((f"grpo.multiplicity_norm={self.grpo.multiplicity_norm}", PARALLEL))
        groups = self.policy.groups
        for knob, role in named:
            if role == PARALLEL:
                # The role-strength checks refused `parallel` on a workflow without that role.
                role = str(workflow.parallel_role)
            group = next(g for g, members in groups.items() if role in members)
            others = [r for r in workflow.roles if r in groups[group] and r != role]
            if others:
                raise ConfigError(f"{knob} acts on {role}'s own adapter, and policy.groups.{group} shares it with "
                                  f"{', '.join(others)}: give {role} a group of its own, or use grpo.role_weight")

    def _check_roles(self, key: str, named: Mapping[str, Any], roles: tuple[str, ...]) -> None:
        for role in named:
            if role not in roles:
                close = difflib.get_close_matches(role, roles, n=1)
                hint = f"did you mean '{close[0]}'?" if close else f"roles of {self.workflow.name}: {', '.join(roles)}"
                raise ConfigError(f"{key}: '{role}' is not a role of {self.workflow.name} ({hint})")

    def workflow_entry(self) -> registry.Workflow:
        """This cell's workflow: its roles, parallel role and program."""
        return registry.workflow(self.workflow.name, self.workflow.plugin)

    @property
    def parallel_slots(self) -> int:
        """Same-role multiplicity of the workflow's parallel role (voters, workers), else 1."""
        return self.workflow_entry().slots(self.workflow)

    @property
    def shuffles_rewards(self) -> bool:
        return self.cell.kind is CellKind.SHUFFLED

    @property
    def trains(self) -> bool:
        """Base, transfer and eval cells only evaluate (step 0, n = 1)."""
        return self.cell.kind.trains

    @property
    def steps_to_train(self) -> int:
        """GRPO steps this cell runs: train.total_steps, or 0 for a cell that only evaluates
        (the one place that says so: the trainer's loop, state.json and the plan's estimate)."""
        return self.train.total_steps if self.trains else 0

    @property
    def planned_validations(self) -> int:
        """Validations of one run: before training, every val_every steps, and at the end (the
        cliff rule's K, known before the first one: gridrun/seam/significance.py)."""
        steps = self.steps_to_train
        return 1 + steps // self.train.val_every + (1 if steps % self.train.val_every else 0)

    def to_dict(self) -> dict[str, Any]:
        """config.yaml's tree (and the fingerprint's): model.toy only where the model is the toy
        world, and the OMITTED_AT_DEFAULT and FAMILY_KEYS keys only where they differ from their default."""
        tree = self.full_tree()
        if tree["model"]["toy"] is None:
            del tree["model"]["toy"]
        tree["cell"]["kind"] = self.cell.kind.value
        if tree["cell"]["variant"] is None:
            del tree["cell"]["variant"]
        for node, key, default in (*OMITTED_AT_DEFAULT, *FAMILY_KEYS):
            if tree[node][key] == default:
                del tree[node][key]
                if not tree[node]:
                    del tree[node]
        return tree

    def full_tree(self) -> dict[str, Any]:
        """Every field with its value, defaults included (the schema Hydra composes on)."""
        return dataclasses.asdict(self)


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
    if isinstance(tp, type) and issubclass(tp, StrEnum):
        if value not in tp._value2member_map_:
            raise ConfigError(f"{key}: {value!r} is not one of {[member.value for member in tp]}")
        return tp(value)
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
    defaults = RunConfig(cell=CellSpec(id="", kind=CellKind.BASE)).full_tree()
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
